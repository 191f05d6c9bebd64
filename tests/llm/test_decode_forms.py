"""``stablehlo_ir.decode_forms``: forms chosen once a call's sizes are known, as rewrites of the refined module.

A KV-cache write of a dynamic number of tokens (``index_copy`` along the cache's columns, a ``scatter``) refined to
one token becomes the ``dynamic_update_slice`` a static one-token program has, with the scatter's numbers; and
transformers' static-cache recipe exported with a dynamic prompt dim, as its own ``.export()`` does, decodes
token by token exactly as the static one-token program does, with the same cache writes in the module XLA
compiles (bench/decode_speed.py's ``dynamic prompt`` row times it)."""
import numpy as np
import pytest
import torch
from torch.export import Dim
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

from torch_stablehlo import export_to_stablehlo
from torch_stablehlo.runtime import pjrt
from torch_stablehlo.stablehlo_ir.op_counts import op_histogram
from torch_stablehlo.stablehlo_ir.refine import refine_shapes

CACHE_WRITE = """func.func @main(%cache: tensor<2x8x4xf32>, %rows: tensor<2x?x4xf32>, %at: tensor<?xi64>) -> tensor<2x8x4xf32> {
  %0 = "stablehlo.scatter"(%cache, %at, %rows) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 2], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    stablehlo.return %new : tensor<f32>
  }) : (tensor<2x8x4xf32>, tensor<?xi64>, tensor<2x?x4xf32>) -> tensor<2x8x4xf32>
  return %0 : tensor<2x8x4xf32>
}"""


@pytest.mark.parametrize("count", [1, 3])
def test_one_index_cache_write_is_a_dynamic_update_slice(count):
    refined = refine_shapes(CACHE_WRITE, [(2, 8, 4), (2, count, 4), (count,)])
    ops = op_histogram(refined)
    assert (ops["stablehlo.dynamic_update_slice"], ops["stablehlo.scatter"]) == ((1, 0) if count == 1 else (0, 1))
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((2, 8, 4), np.float32)
    rows = rng.standard_normal((2, count, 4), np.float32)
    at = np.array([5, 0, 7][:count], np.int64)
    executable = pjrt.Executable(refined)
    (result,) = executable.execute(executable.put([cache, rows, at]))
    expected = cache.copy()
    expected[:, at] = rows
    np.testing.assert_array_equal(np.asarray(result), expected)


def test_dynamic_prompt_recipe_decodes_as_the_static_one():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=256, initializer_range=0.5)).eval()
    model.generation_config.cache_implementation = "static"
    recipe = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=64).model
    one = {"input_ids": torch.tensor([[0]]), "cache_position": torch.tensor([0])}
    static = export_to_stablehlo(torch.export.export(recipe, (), one, strict=False))
    seq = Dim("seq", min=1, max=32)
    dynamic = export_to_stablehlo(torch.export.export(
        recipe, (), {"input_ids": torch.tensor([[0, 0]]), "cache_position": torch.tensor([0, 1])}, strict=False,
        dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}}))
    shapes = [[1 if isinstance(d, str) else d for d in slot.tensor.shape] for slot in dynamic.signature.main_inputs]
    refined = op_histogram(refine_shapes(dynamic.stablehlo_text, shapes))
    assert refined["stablehlo.scatter"] == 0
    assert refined["stablehlo.dynamic_update_slice"] == op_histogram(static.stablehlo_text)[
        "stablehlo.dynamic_update_slice"] == 2 * 2  # keys and values of each layer
    token = 3
    for position in range(12):
        step = {"input_ids": torch.tensor([[token]]), "cache_position": torch.tensor([position])}
        expected = static(**step)
        torch.testing.assert_close(dynamic(**step), expected, rtol=0, atol=1e-5)
        token = int(expected[0, -1].argmax())
