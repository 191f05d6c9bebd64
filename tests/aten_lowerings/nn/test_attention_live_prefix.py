"""Attention over the live prefix of a long static key length (``emit.live_prefix``): one ``stablehlo.case``
branch per bucket of keys, the shortest holding every key the mask keeps; torch's numbers, and keys past the
prefix never read."""
import torch
import torch.nn.functional as F

from torch_stablehlo.exporter import export_to_stablehlo
from tests.support import FunctionModule

SOURCE = 1024  # buckets of 64, 128, 256, 512 and 1024 keys


def _attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _inputs(live: int, float_mask: bool = False, rows: int = 1):
    torch.manual_seed(live)
    q, k, v = torch.randn(2, 4, rows, 16), torch.randn(2, 4, SOURCE, 16), torch.randn(2, 4, SOURCE, 16)
    keep = (torch.arange(SOURCE) < live).expand(2, 1, rows, SOURCE).clone()
    if not float_mask:
        return q, k, v, keep
    return q, k, v, torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)


def test_one_program_takes_the_bucket_the_mask_needs():
    for float_mask in (False, True):
        artifact = export_to_stablehlo(FunctionModule(_attention), _inputs(5, float_mask))
        assert artifact.stablehlo_text.count("stablehlo.case") == 1
        for live in (1, 64, 65, 129, 300, 700, SOURCE):  # each bucket, and both sides of the first edge
            inputs = _inputs(live, float_mask)
            torch.testing.assert_close(artifact(*inputs), _attention(*inputs), rtol=1e-5, atol=1e-6)


def test_keys_past_the_live_prefix_are_not_read():
    """NaN in the dead keys and values: torch's float-mask result is NaN there, the program's is the result over
    the live keys (what the cache holds past the prefix is never read)."""
    q, k, v, mask = _inputs(100, float_mask=True)
    artifact = export_to_stablehlo(FunctionModule(_attention), (q, k, v, mask))
    dirty_k, dirty_v = k.clone(), v.clone()
    dirty_k[..., 200:, :], dirty_v[..., 200:, :] = float("nan"), float("nan")
    assert _attention(q, dirty_k, dirty_v, mask).isnan().all()
    torch.testing.assert_close(artifact(q, dirty_k, dirty_v, mask), _attention(q, k, v, mask), rtol=1e-5, atol=1e-6)


def test_a_row_that_keeps_no_key_reads_every_key():
    """A float mask at its lowest everywhere in one row: torch spreads that row's weights over every key, so the
    program reads the whole length for the call."""
    q, k, v, mask = _inputs(50, float_mask=True, rows=3)
    mask[1, :, 2, :] = torch.finfo(torch.float32).min
    artifact = export_to_stablehlo(FunctionModule(_attention), (q, k, v, mask))
    torch.testing.assert_close(artifact(q, k, v, mask), _attention(q, k, v, mask), rtol=1e-5, atol=1e-6)


def test_short_and_causal_attention_keep_one_branch():
    q, k, v, mask = _inputs(5)
    short = (q, k[..., :100, :], v[..., :100, :], mask[..., :100])
    assert "stablehlo.case" not in export_to_stablehlo(FunctionModule(_attention), short).stablehlo_text
    causal = FunctionModule(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert "stablehlo.case" not in export_to_stablehlo(causal, (q, k, v)).stablehlo_text


class _Attention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return _attention(q, k, v, mask)


def test_a_dynamic_query_length_keeps_the_live_prefix():
    """Only the keys' length need be static: with a symbolic number of query rows (a dynamic prompt dim) the
    program still picks the bucket, for each call's rows (a float mask: its dead keys found over symbolic rows)."""
    rows = torch.export.Dim("rows", min=1, max=16)
    program = torch.export.export(_Attention(), _inputs(5, True, rows=3),
                                  dynamic_shapes=({2: rows}, None, None, {2: rows}))
    artifact = export_to_stablehlo(program)
    assert artifact.stablehlo_text.count("stablehlo.case") == 1
    for live, count in ((300, 1), (129, 4)):
        inputs = _inputs(live, True, rows=count)
        torch.testing.assert_close(artifact(*inputs), _attention(*inputs), rtol=1e-5, atol=1e-6)
