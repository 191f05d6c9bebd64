"""The engine across decoder families: staggered requests on 2 slots, each token-exact with ``generate`` on its
prompt alone (Gemma's sliding window of 4 is shorter than its prompts, so a window counted over the wrong columns
changes the tokens; GPT-2's learned positions come from the slot's padding). ``make test`` checks Gemma 2 (Llama is
``test_engine.py``'s); ``--full-sweep`` adds Qwen2, GPT-2 and Gemma 3 (each engine's export and compile take
some 15 s of CPU)."""
import pytest

from torch_stablehlo import exporter
from torch_stablehlo.serving import Engine
from tests.conftest import sampled

from .engine_models import generated, prompts, staggered, tiny

SAMPLE = ("gemma2",)
SWEPT = ("qwen2", "gpt2", "gemma3")
REQUESTS = list(zip(prompts((7, 12, 4, 10)), (12, 8, 14, 6)))


def pytest_generate_tests(metafunc):
    if "family" in metafunc.fixturenames:
        sampled(metafunc, "family", SAMPLE + SWEPT, SAMPLE)


def test_staggered_requests_are_token_exact_with_generate_alone(family):
    model = tiny(family)
    artifact = exporter.export_engine(model, slots=2, max_cache_len=40, max_prompt_len=16)
    with Engine(artifact) as engine:
        ours, _ = staggered(engine, REQUESTS)
    expected = [generated(model, prompt, new) for prompt, new in REQUESTS]
    assert len({t for tokens in expected for t in tokens}) > 8, "the model repeats a few tokens: a weak check"
    assert ours == expected
