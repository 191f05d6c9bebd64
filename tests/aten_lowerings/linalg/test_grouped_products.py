"""Grouped products of mixture-of-experts layers against eager: ``aten._grouped_mm`` (bfloat16, 2-d input and 3-d
weights with cumulative ``offs``) and transformers' ``grouped_mm_fallback`` (its float32 experts path); empty
groups, rows past the last group, a symbolic number of rows; and transformers' MoE decoders (their default
experts path) static and with a dynamic batch and sequence."""
import pytest
import torch
from torch.export import Dim
from transformers import (MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM, Qwen2MoeConfig,
                          Qwen2MoeForCausalLM)
from transformers.integrations import moe  # noqa: F401  (registers torch.ops.transformers.grouped_mm_fallback)

from torch_stablehlo.exporter import export_to_stablehlo
from tests.support import FunctionModule, assert_matches_eager

OFFSETS = {
    "every_group": [2, 5, 6, 9],
    "empty_groups": [0, 4, 4, 9],
    "rows_past_the_last_group": [1, 3, 5, 6],  # rows 6-8 belong to no group: zeros
}


def _operands(dtype, rows=9):
    torch.manual_seed(0)
    return torch.randn(rows, 16).to(dtype), torch.randn(4, 16, 8).to(dtype)


@pytest.mark.parametrize("offsets", list(OFFSETS))
def test_transformers_grouped_mm_fallback(offsets):
    x, weights = _operands(torch.float32)
    offs = torch.tensor(OFFSETS[offsets], dtype=torch.int32)
    assert_matches_eager(torch.ops.transformers.grouped_mm_fallback, x, weights, offs)


@pytest.mark.parametrize("offsets", ["every_group", "empty_groups"])
def test_aten_grouped_mm(offsets):
    """torch's kernel leaves rows past the last group unset, so every row is in a group here."""
    x, weights = _operands(torch.bfloat16)
    offs = torch.tensor(OFFSETS[offsets], dtype=torch.int32)
    assert_matches_eager(lambda x, w, o: torch._grouped_mm(x, w, o), x, weights, offs)


def test_a_symbolic_number_of_rows():
    x, weights = _operands(torch.float32)
    rows = Dim("rows", min=2, max=64)
    program = torch.export.export(FunctionModule(torch.ops.transformers.grouped_mm_fallback),
                                  (x, weights, torch.tensor([2, 5, 6, 9], dtype=torch.int32)),
                                  dynamic_shapes=(({0: rows}, None, None),))
    artifact = export_to_stablehlo(program)
    for count, ends in ((3, [1, 1, 2, 3]), (20, [5, 10, 12, 17])):
        x = torch.randn(count, 16)
        offs = torch.tensor(ends, dtype=torch.int32)
        torch.testing.assert_close(artifact(x, weights, offs),
                                   torch.ops.transformers.grouped_mm_fallback(x, weights, offs))


SHAPES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=100, max_position_embeddings=64, use_cache=False)
MOE_MODELS = {
    "mixtral": (MixtralForCausalLM, MixtralConfig, dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": (Qwen2MoeForCausalLM, Qwen2MoeConfig, dict(num_experts=4, num_experts_per_tok=2,
                                                           moe_intermediate_size=32,
                                                           shared_expert_intermediate_size=48)),
    "olmoe": (OlmoeForCausalLM, OlmoeConfig, dict(num_experts=4, num_experts_per_tok=2)),
}


@pytest.mark.parametrize("name", list(MOE_MODELS))
def test_moe_decoders_match_eager_with_dynamic_batch_and_sequence(name):
    model_class, config_class, experts = MOE_MODELS[name]
    torch.manual_seed(0)
    model = model_class(config_class(**SHAPES, **experts)).eval()
    program = torch.export.export(model, (torch.randint(0, 100, (2, 7)),), strict=False,
                                  dynamic_shapes=({0: Dim("batch", max=8), 1: Dim("sequence", max=32)},))
    artifact = export_to_stablehlo(program)
    for shape in ((2, 7), (3, 5), (1, 12)):
        ids = torch.randint(0, 100, shape)
        with torch.no_grad():
            expected = model(ids).logits
        torch.testing.assert_close(artifact(ids).logits, expected, rtol=1e-5, atol=1e-5)
