"""generation_config's logits processors in the engine: staggered requests on 2 slots (a cache short enough that
the rows shift), each token-exact with ``generate`` on its prompt alone under the same processors: a repetition
penalty over the prompt and the tokens made, an n-gram ban, bad words of one and of two tokens, a suppressed token,
a minimum of new tokens before the eos, and the eos forced at a request's last token (a one-token request included).
Each slot reads its own sequence: a slot's earlier occupants' tokens, left in its columns, must not count.
And a request whose prefill fails ends (cancelled) instead of leaving its reader waiting; the engine goes on."""
import collections

import pytest

from torch_stablehlo import exporter
from torch_stablehlo.serving import Engine

from .engine_models import generated, prompts, staggered, tiny

REQUESTS = list(zip(prompts((6, 11, 3, 9, 14, 5), seed=3), (12, 1, 16, 7, 10, 9)))


def processing(plain: list[list[int]]):
    """A tiny Llama whose generation_config holds every processor, each aimed at tokens the plain greedy outputs
    ``plain`` make (so that each changes something), and the eos its outputs reach."""
    counts = collections.Counter(t for tokens in plain for t in tokens)
    common = [t for t, _ in counts.most_common()]
    pairs = collections.Counter((a, b) for tokens in plain for a, b in zip(tokens, tokens[1:]) if a != b)
    bigram = next(pair for pair, _ in pairs.most_common() if not set(pair) & set(common[:2]))
    model = tiny("llama", eos_token_id=plain[0][2])
    config = model.generation_config
    config.repetition_penalty = 1.8
    config.no_repeat_ngram_size = 2
    config.bad_words_ids = [[common[1]], list(bigram)]
    config.suppress_tokens = [common[0]]
    config.min_new_tokens = 3
    config.forced_eos_token_id = plain[0][2]
    return model


@pytest.fixture(scope="module")
def model():
    return processing([generated(tiny("llama"), prompt, new) for prompt, new in REQUESTS])


def test_processors_are_token_exact_with_generate_alone(model):
    expected = [generated(model, prompt, new) for prompt, new in REQUESTS]
    plain = [generated(tiny("llama"), prompt, new) for prompt, new in REQUESTS]
    assert sum(e != p for e, p in zip(expected, plain)) >= 4, "the processors change too little: a weak check"
    artifact = exporter.export_engine(model, slots=2, max_cache_len=48, max_prompt_len=16)
    with Engine(artifact) as engine:
        ours, requests = staggered(engine, REQUESTS)
        assert ours == expected
        assert ours[1] == [model.generation_config.eos_token_id]  # forced at a one-token request's only token

        def failing(*args):
            raise RuntimeError("a prefill that fails")
        working, engine._runner.prefill = engine._runner.prefill, failing
        failed = engine.submit(REQUESTS[0][0], max_new_tokens=4)
        assert list(failed) == [] and failed.finish_reason == "cancelled"
        engine._runner.prefill = working
        assert list(engine.submit(*REQUESTS[3])) == expected[3]
