"""End to end: ``torch-stablehlo serve CHECKPOINT --slots 8`` on a checkpoint folder written here (a tiny Llama
and a tokenizer trained with ``tokenizers``), exported on first use by ``exporter.export_engine`` into the
engine cache and served on 127.0.0.1; the official ``openai`` client drives it: plain, streamed, 8 concurrent,
chat, bad requests, a dropped stream. Texts are the tokenizer's decoding of HF ``generate``'s greedy tokens."""
from __future__ import annotations

import http.client
import json
import os
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import openai
import pytest

from torch_stablehlo.serving import launch
from torch_stablehlo.serving.text import decode

from .serve_process import serve_process
from .server_support import reference_tokens, save_checkpoint, tiny_llama, train_tokenizer
from .test_server import PROMPTS, _samples, raw, wait_until

STARTUP_SECONDS = 600
CACHE_LEN = 128


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tokenizer = train_tokenizer()
    model = tiny_llama(len(tokenizer), tokenizer.eos_token_id)
    folder = save_checkpoint(tmp_path_factory.mktemp("tiny-llama"), model, tokenizer)
    return folder, model, tokenizer


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    engines = tmp_path_factory.mktemp("engines")
    env = {**os.environ, "TORCH_STABLEHLO_ENGINE_DIR": str(engines)}
    arguments = [str(checkpoint[0]), "--slots", "8", "--max-cache-len", str(CACHE_LEN), "--host", "127.0.0.1",
                 "--port", "0"]
    with serve_process(arguments, env, STARTUP_SECONDS) as url:
        yield url, engines


@pytest.fixture(scope="module")
def client(server, checkpoint):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


def expected(checkpoint, ids: list[int], max_tokens: int) -> str:
    _, model, tokenizer = checkpoint
    return decode(tokenizer, reference_tokens(model, ids, max_tokens))


def test_plain_and_streamed(client, checkpoint):
    name, tokenizer = checkpoint[0].name, checkpoint[2]
    ids = tokenizer(PROMPTS[1])["input_ids"]
    whole = client.completions.create(model=name, prompt=PROMPTS[1], max_tokens=24)
    assert whole.choices[0].text == expected(checkpoint, ids, 24)
    assert whole.usage.prompt_tokens == len(ids)
    pieces = [chunk.choices[0].text for chunk in
              client.completions.create(model=name, prompt=PROMPTS[1], max_tokens=24, stream=True)]
    assert "".join(pieces) == whole.choices[0].text and len([p for p in pieces if p]) > 1


def test_eight_concurrent(client, checkpoint):
    name, tokenizer = checkpoint[0].name, checkpoint[2]

    def ask(prompt: str) -> str:
        return client.completions.create(model=name, prompt=prompt, max_tokens=20).choices[0].text

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(ask, PROMPTS))
    assert texts == [expected(checkpoint, tokenizer(prompt)["input_ids"], 20) for prompt in PROMPTS]


def test_chat(client, checkpoint):
    name, tokenizer = checkpoint[0].name, checkpoint[2]
    messages = [{"role": "user", "content": "Who serves the fox?"}]
    ids = tokenizer(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                    add_special_tokens=False)["input_ids"]
    reply = client.chat.completions.create(model=name, messages=messages, max_tokens=16)
    assert reply.choices[0].message.content == expected(checkpoint, ids, 16)


def test_bad_requests(client, server, checkpoint):
    name = checkpoint[0].name
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=name, prompt="x", max_tokens=-1)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=name, prompt="fox " * (2 * CACHE_LEN), max_tokens=2)
    assert caught.value.body["param"] == "prompt"
    status, body = raw(server[0], "POST", "/v1/completions", b"{not json")
    assert status == 400 and body["error"]["code"] == "invalid_json"
    assert client.completions.create(model=name, prompt="x", max_tokens=2).choices[0].text is not None


def test_dropped_stream_frees_its_slot(client, server, checkpoint):
    parts = urlparse(server[0])
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    body = {"model": checkpoint[0].name, "prompt": "The quick", "max_tokens": CACHE_LEN - 16, "stream": True}
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.readline().startswith(b"data: ")
    connection.sock.close()
    connection.close()
    cancelled = ("torch_stablehlo_requests_total", (("endpoint", "/v1/completions"), ("outcome", "cancelled")))
    assert wait_until(lambda: _samples(server[0]).get(cancelled) == 1, 30)
    assert wait_until(lambda: raw(server[0], "GET", "/health")[1]["slots_busy"] == 0, 30)


def test_the_export_is_cached(server, checkpoint):
    """The server exported the checkpoint into the cache once; preparing again finds it without exporting."""
    engines = server[1]
    bundles = [path for path in engines.iterdir() if not path.name.startswith(".")]
    assert len(bundles) == 1
    served = launch.prepare(checkpoint[0], tokenizer=None, model_name=None, slots=8, max_cache_len=CACHE_LEN,
                            cache_folder=engines)
    assert served.bundle == bundles[0] and served.model_name == checkpoint[0].name
