"""The OpenAI-compatible app (serving/openai_api.py) over ``GreedyHFEngineDouble`` (a test double of the
Engine, tests/serving/server_support.py), driven through HTTP on 127.0.0.1 by the official ``openai`` client
and by raw requests: texts are the tokenizer's decoding of HF ``generate``'s greedy tokens, streamed pieces
add up to exactly the non-streamed text, bad requests get OpenAI-style 4xx bodies, a dropped client frees its
slot, the metrics count what happened. The same server over the real exported engine, started by the CLI:
test_server_cli.py."""
from __future__ import annotations

import http.client
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from torch_stablehlo.serving.openai_api import build_app
from torch_stablehlo.serving.text import IncrementalText, StoppingText, decode

from .server_support import GreedyHFEngineDouble, reference_tokens, running, tiny_llama, train_tokenizer

MODEL = "tiny-llama"
PROMPTS = ["The quick brown fox", "Café über", "日本語", "Serving engines batch", "🦊 and 🐶", "StableHLO runs",
           "Prompts of different lengths arrive", "a"]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_llama(len(tokenizer), tokenizer.eos_token_id)


@pytest.fixture(scope="module")
def served(model, tokenizer):
    with GreedyHFEngineDouble(model, slots=2, max_queue=16, step_seconds=0.002) as engine, \
            running(build_app(engine, tokenizer, MODEL)) as url:
        yield engine, url


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[1] + "/v1", api_key="unused", max_retries=0, timeout=60)


def expected_text(model, tokenizer, prompt_ids, max_tokens) -> str:
    return decode(tokenizer, reference_tokens(model, prompt_ids, max_tokens))


def raw(url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    parts = urlparse(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def wait_until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_pieces_add_up_to_the_decoding(tokenizer):
    """Random token sequences (multi-byte characters split across tokens): the released pieces concatenate to
    the full decoding, and no piece ends in an incomplete character."""
    rng = random.Random(0)
    held_back = 0
    for _ in range(40):
        tokens = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 30))]
        text = IncrementalText(tokenizer)
        pieces = [text.push(token) for token in tokens]
        held_back += pieces.count("")
        pieces.append(text.finish())
        assert "".join(pieces) == decode(tokenizer, tokens)
        assert not any(piece.endswith("\ufffd") for piece in pieces[:-1])
    assert held_back > 0  # the sequences did split characters


def test_stop_strings_cut_the_text(tokenizer):
    """Tokens one by one through StoppingText: the text up to the first stop string, whichever tokens split it;
    text that could begin a stop string is held back, and released at the end when none followed."""
    rng = random.Random(1)
    for _ in range(40):
        tokens = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(4, 30))]
        whole = decode(tokenizer, tokens)
        cut = rng.randrange(len(whole))
        stop = [whole[cut:cut + rng.randrange(1, 4)], "never appears"]
        text = StoppingText(tokenizer, stop)
        pieces = []
        for token in tokens:
            pieces.append(text.push(token))
            if text.stopped:
                break
        pieces.append(text.finish())
        assert text.stopped
        assert "".join(pieces) == whole[:min(whole.find(s) for s in stop if s in whole)]
    held = StoppingText(tokenizer, ["fox jumps"])
    ids = tokenizer("The quick brown fox")["input_ids"]
    assert "".join(held.push(token) for token in ids) == "The quick brown "
    assert held.finish() == "fox" and not held.stopped


def test_stop_ends_the_request(client, served, model, tokenizer):
    ids = tokenizer(PROMPTS[0])["input_ids"]
    whole = expected_text(model, tokenizer, ids, 30)
    stop = whole[8:11]
    result = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=30, stop=stop)
    assert result.choices[0].text == whole[:whole.index(stop)] and result.choices[0].finish_reason == "stop"
    assert result.usage.completion_tokens < 30
    stream = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=30, stop=[stop], stream=True)
    chunks = list(stream)
    assert "".join(chunk.choices[0].text for chunk in chunks) == result.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert wait_until(lambda: served[0].slots_busy == 0)


def test_completion_equals_generate(client, model, tokenizer):
    ids = tokenizer(PROMPTS[0])["input_ids"]
    result = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12)
    tokens = reference_tokens(model, ids, 12)
    assert result.choices[0].text == decode(tokenizer, tokens)
    assert result.choices[0].finish_reason == ("stop" if tokens[-1] == tokenizer.eos_token_id else "length")
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (len(ids), len(tokens))
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=12)  # a prompt of token ids
    assert by_ids.choices[0].text == result.choices[0].text


def test_stream_concatenates_to_the_whole_text(client, model, tokenizer):
    for prompt in PROMPTS[1:4]:
        whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20).choices[0].text
        chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, stream=True,
                                                stream_options={"include_usage": True}))
        pieces = [chunk.choices[0].text for chunk in chunks if chunk.choices]
        assert "".join(pieces) == whole == expected_text(model, tokenizer, tokenizer(prompt)["input_ids"], 20)
        assert len([piece for piece in pieces if piece]) > 1
        assert chunks[-2].choices[0].finish_reason in ("stop", "length")
        assert chunks[-1].usage.completion_tokens == len(reference_tokens(model, tokenizer(prompt)["input_ids"], 20))


def test_eight_concurrent_requests_on_two_slots(client, model, tokenizer):
    """8 requests at once, streamed and not, on 2 slots: each one's text is its prompt's alone."""
    def ask(index: int) -> str:
        prompt = PROMPTS[index]
        if index % 2:
            stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, stream=True)
            return "".join(chunk.choices[0].text for chunk in stream)
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=16).choices[0].text

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(ask, range(8)))
    assert texts == [expected_text(model, tokenizer, tokenizer(p)["input_ids"], 16) for p in PROMPTS]


def test_chat_uses_the_chat_template(client, model, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Café?"}]
    ids = tokenizer(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                    add_special_tokens=False)["input_ids"]
    expected = expected_text(model, tokenizer, ids, 10)
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10)
    assert reply.choices[0].message.content == expected and reply.choices[0].message.role == "assistant"
    assert reply.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=10, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == expected


@pytest.mark.parametrize("arguments, status, param", [
    ({"model": "gpt-4"}, 404, "model"),
    ({"max_tokens": -3}, 400, "max_tokens"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "fox " * 60}, 400, "prompt"),
    ({"prompt": [10 ** 6]}, 400, "prompt"),
    ({"prompt": ""}, 400, "prompt"),
    ({"temperature": -1}, 400, "temperature"),
    ({"n": 2}, 400, "n"),
    ({"logit_bias": {"5": 1.0}}, 400, "logit_bias"),
])
def test_bad_requests_get_openai_errors(client, served, arguments, status, param):
    request = {"model": MODEL, "prompt": "The quick", "max_tokens": 4, **arguments}
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(**request)
    assert caught.value.status_code == status
    error = caught.value.body if "message" in caught.value.body else caught.value.body["error"]
    assert error["param"] == param and error["message"] and error["type"]
    assert client.completions.create(model=MODEL, prompt="The quick", max_tokens=2).choices[0].text is not None


def test_malformed_json_and_unknown_routes(served):
    url = served[1]
    status, body = raw(url, "POST", "/v1/completions", b'{"model": "tiny-llama", "prompt": ')
    assert status == 400 and body["error"]["code"] == "invalid_json", body
    status, body = raw(url, "POST", "/v1/completions", b'{"prompt": "x"}')
    assert status == 400 and body["error"]["param"] == "model", body
    status, body = raw(url, "POST", "/v1/chat/completions", json.dumps({"model": MODEL, "messages": []}).encode())
    assert status == 400 and body["error"]["param"] == "messages", body
    status, body = raw(url, "GET", "/v1/engines")
    assert status == 404 and body["error"]["type"] == "not_found_error", body
    assert raw(url, "GET", "/health") == (200, {"status": "ok", "slots": 2, "slots_busy": 0, "queue_depth": 0,
                                                "process": os.getpid()})
    assert raw(url, "GET", "/v1/models")[1]["data"][0]["id"] == MODEL


def test_full_queue_is_429(model, tokenizer):
    with GreedyHFEngineDouble(model, slots=1, max_queue=1, step_seconds=0.02) as engine, \
            running(build_app(engine, tokenizer, MODEL)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda _: _status(client), range(4)))
        assert outcomes.count(200) >= 2 and 429 in outcomes, outcomes


def _status(client) -> int:
    try:
        client.completions.create(model=MODEL, prompt="The quick", max_tokens=20)
        return 200
    except openai.RateLimitError as error:
        assert error.body["code"] == "queue_full"
        return 429


@pytest.mark.parametrize("stream", [True, False])
def test_dropped_client_frees_its_slot(model, tokenizer, stream):
    with GreedyHFEngineDouble(model, slots=1, step_seconds=0.05) as engine, \
            running(build_app(engine, tokenizer, MODEL)) as url:
        parts = urlparse(url)
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        body = {"model": MODEL, "prompt": "The quick", "max_tokens": 200, "stream": stream}
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        if stream:
            response = connection.getresponse()
            assert response.status == 200 and response.readline().startswith(b"data: ")
        else:
            assert wait_until(lambda: engine.slots_busy == 1)
        connection.sock.close()  # the client goes away mid-generation
        connection.close()
        assert wait_until(lambda: len(engine.cancelled) == 1 and engine.slots_busy == 0)
        assert len(engine.cancelled[0].tokens) < 100
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert client.completions.create(model=MODEL, prompt="The", max_tokens=2).choices[0].finish_reason
        assert _samples(url)[("torch_stablehlo_requests_total", (("endpoint", "/v1/completions"),
                                                                 ("outcome", "cancelled")))] == 1


def _samples(url: str) -> dict:
    parts = urlparse(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_metrics_count_requests_and_tokens(model, tokenizer):
    with GreedyHFEngineDouble(model, slots=2) as engine, running(build_app(engine, tokenizer, MODEL)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        made = 0
        for prompt in PROMPTS[:3]:
            made += client.completions.create(model=MODEL, prompt=prompt, max_tokens=8).usage.completion_tokens
        list(client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=8, stream=True))
        made += len(reference_tokens(model, tokenizer(PROMPTS[3])["input_ids"], 8))
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=MODEL, prompt="x", max_tokens=-1)
        samples = _samples(url)
    endpoint = ("endpoint", "/v1/completions")
    answered = sum(samples.get(("torch_stablehlo_requests_total", (endpoint, ("outcome", outcome))), 0)
                   for outcome in ("stop", "length"))
    assert answered == 4
    assert samples[("torch_stablehlo_requests_total", (endpoint, ("outcome", "rejected")))] == 1
    assert samples[("torch_stablehlo_generation_tokens_total", ())] == made
    assert samples[("torch_stablehlo_time_to_first_token_seconds_count", ())] == 4
    assert samples[("torch_stablehlo_inter_token_latency_seconds_count", ())] == made - 4
    assert samples[("torch_stablehlo_prompt_tokens_total", ())] == sum(
        len(tokenizer(p)["input_ids"]) for p in PROMPTS[:4])
    assert (samples[("torch_stablehlo_slots", ())], samples[("torch_stablehlo_slots_busy", ())],
            samples[("torch_stablehlo_queue_depth", ())]) == (2, 0, 0)
