"""``stablehlo_ir.cache_reads``: the module XLA CPU compiles reads a tensor just written in place (a KV cache) before
the write and as it is stored, the stored module keeps the plain form; torch's numbers either way."""
import re

import torch
import torch.nn.functional as F

from torch_stablehlo import export_to_stablehlo
from torch_stablehlo.stablehlo_ir.passes import prepare_for_xla
from tests.support import FunctionModule


def _write_then_read(cache, row, position, query, weights):
    """One row of a cache written at ``position`` (one index: a ``dynamic_update_slice``), then read by products
    along a free dim (scores) and a contracted one (weights times values), by attention (a composite) and by a
    slice of a unit-dim reshape."""
    written = cache.index_copy(2, position, row)
    scores = query @ written.transpose(-1, -2)
    mixed = weights @ written
    attended = F.scaled_dot_product_attention(query, written, written)
    return scores, mixed, attended, written.reshape(2, 16, 4)[:, 3:9]


def _inputs(position: int):
    torch.manual_seed(position)
    return (torch.randn(1, 2, 16, 4), torch.randn(1, 2, 1, 4), torch.tensor([position]), torch.randn(1, 2, 1, 4),
            torch.randn(1, 2, 3, 16))


def _dots(text: str) -> int:
    return text.count("stablehlo.dot_general")


def test_reads_past_the_write_match_torch_and_stay_out_of_the_stored_module():
    artifact = export_to_stablehlo(FunctionModule(_write_then_read), _inputs(0))
    stored = artifact.stablehlo_text
    compiled = prepare_for_xla(stored)
    # stored: the two products and the attention's two, a composite of its own; compiled: inlined, each product
    # whose right operand is the write itself (the attention's along a free and a contracted dim, ``mixed`` along a
    # contracted one) over the tensor before the write plus one over the written row (``scores`` reads it through
    # a transpose: as it is), the slice read from the stored 4-d tensor
    assert _dots(stored) == 4 and "stablehlo.composite" in stored, stored
    assert "stablehlo.composite" not in compiled and "call @" not in compiled
    assert _dots(compiled) == 7, compiled
    assert re.search(r"stablehlo\.slice %\S+ \[0:1, 0:2, 3:9, 0:4\]", compiled), compiled
    for position in (0, 7, 15):  # the first row, one inside, the last
        inputs = _inputs(position)
        for got, want in zip(artifact(*inputs), _write_then_read(*inputs)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_modules_that_write_nothing_in_place_are_left_as_they_are():
    artifact = export_to_stablehlo(FunctionModule(lambda q, k: F.scaled_dot_product_attention(q, k, k)),
                                   (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)))
    assert prepare_for_xla(artifact.stablehlo_text) is artifact.stablehlo_text
