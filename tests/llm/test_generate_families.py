"""export_generate across decoder families: token-exact with transformers' ``generate`` (static cache; hybrid
where the model has sliding-window layers) for a left-padded batch of prompts of different lengths.

Sliding windows are smaller than prompt + new tokens, so a window that is not applied, or applied over the
wrong columns, changes the tokens. Tiny models from configs with seeded random weights (no downloads), scaled
(``initializer_range``) so greedy decoding does not settle on one token."""
import pytest
import torch
from transformers import (FalconConfig, FalconForCausalLM, Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM,
                          Gemma3TextConfig, MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from torch_stablehlo import exporter
from torch_stablehlo.tools.generate_sweep import PASSED, REFUSED, generating_models, sweep_generate
from torch_stablehlo.tools.model_table import MODELS
from tests.support import left_padded_prompts

from ..conftest import sampled

VOCAB = 128
NEW_TOKENS = 24
SHAPES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, initializer_range=0.2,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)

FAMILIES = {
    # a sliding window of 4 on layer 0, full attention on layer 1: transformers' hybrid cache
    # (Gemma scales its embeddings up: smaller weights keep its tokens varied)
    "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig, dict(head_dim=16, sliding_window=4, initializer_range=0.05,
                                                         layer_types=["sliding_attention", "full_attention"])),
    "gemma2": (Gemma2ForCausalLM, Gemma2Config, dict(head_dim=16, sliding_window=4, initializer_range=0.05,
                                                     layer_types=["sliding_attention", "full_attention"])),
    "mistral": (MistralForCausalLM, MistralConfig, dict(sliding_window=5)),  # every layer sliding
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, dict(tie_word_embeddings=True)),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, dict(head_dim=16)),
    "phi3": (Phi3ForCausalLM, Phi3Config, {}),
    # Falcon-7B's classic multi-query attention: one key/value head, though its config counts 4
    "falcon_mqa": (FalconForCausalLM, FalconConfig, dict(multi_query=True, new_decoder_architecture=False,
                                                         parallel_attn=True)),
}
# make test's share of the families (every one under --full-sweep): both kinds of sliding window (Gemma 2's hybrid
# cache with soft-capping, Mistral's on every layer) and the one attention unlike the others (Falcon's multi-query)
FAMILY_SAMPLE = ["gemma2", "mistral", "falcon_mqa"]
# tools.generate_sweep over model_table's causal LMs: this sample in make test, every one under --full-sweep
# (GPT-2: learned positions, which a left-padded batch must read from the mask; falcon, its classic multi-query
# attention, is falcon_mqa above)
SWEEP_SAMPLE = ["gpt2"]
# model -> the reason export_generate gives (docs/models.md's generate table): state-space layers carry no KV cache
SWEEP_REFUSALS = {"mamba": "this model has linear_attention layers", "mamba2": "this model has linear_attention layers"}


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ == "test_sweep_model_generates_like_generate":
        sampled(metafunc, "name", generating_models, SWEEP_SAMPLE)
    if metafunc.function.__name__ == "test_padded_batch_is_token_exact_with_generate":
        sampled(metafunc, "family", FAMILIES, FAMILY_SAMPLE)


@pytest.fixture(scope="module")
def padded_batch():
    """Three prompts of 9, 6 and 3 tokens, left-padded to 9."""
    return left_padded_prompts((9, 6, 3), VOCAB)


def _model(family: str):
    model_class, config_class, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(**{**SHAPES, **extra})).eval()
    model.generation_config.eos_token_id = None  # every row makes all its tokens
    model.generation_config.pad_token_id = 0
    return model


def test_padded_batch_is_token_exact_with_generate(family, padded_batch):
    model = _model(family)
    ids, mask = padded_batch
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                                  cache_implementation="static")
    art = exporter.export_generate(model, ids, max_new_tokens=NEW_TOKENS, attention_mask=mask)
    ours = art(ids, attention_mask=mask)
    assert expected[:, 9:].unique().numel() > 3, "the model repeats one token: the check would be weak"
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)


def test_layers_without_a_carried_cache_are_refused(padded_batch):
    model = _model("qwen3")
    model.config.layer_types = ["chunked_attention", "full_attention"]  # as Llama 4 has
    model.config.attention_chunk_size = 4
    ids, mask = padded_batch
    with pytest.raises(NotImplementedError, match="full or sliding-window attention; this model has "
                                                  "chunked_attention layers"):
        exporter.export_generate(model, ids, max_new_tokens=4, attention_mask=mask)


def test_sweep_model_generates_like_generate(name):
    """Token-exact with generate for one prompt and a left-padded batch, or refused for the stated reason."""
    results = sweep_generate(MODELS[name])
    if name in SWEEP_REFUSALS:
        assert all(r["status"] == REFUSED and SWEEP_REFUSALS[name] in r["reason"] for r in results.values()), results
    else:
        assert all(r["status"] == PASSED for r in results.values()), results
