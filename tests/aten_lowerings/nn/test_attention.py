"""scaled_dot_product_attention against eager: masks, causal, scale, grouped-query, the composite wrapper."""
import pytest
import torch
import torch.nn.functional as F
from jaxlib.mlir import ir

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from tests.support import FunctionModule, assert_matches_eager

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def qkv(batch, heads, length, source, head_dim=8, value_dim=None, kv_heads=None, dtype=torch.float32):
    kv_heads = kv_heads or heads
    return (torch.randn(*batch, heads, length, head_dim).to(dtype),
            torch.randn(*batch, kv_heads, source, head_dim).to(dtype),
            torch.randn(*batch, kv_heads, source, value_dim or head_dim).to(dtype))


def attention(**options):
    return lambda q, k, v, *mask: F.scaled_dot_product_attention(q, k, v, *mask, **options)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("batch, heads, length, source, value_dim", [
    ((2,), 4, 5, 5, None),
    ((2,), 3, 4, 7, 5),      # source longer than the query, a different value size
    ((), 2, 3, 6, None),     # no batch dim
    ((2, 3), 2, 4, 4, 6),    # two batch dims
])
def test_attention(batch, heads, length, source, value_dim, dtype):
    assert_matches_eager(attention(), *qkv(batch, heads, length, source, value_dim=value_dim, dtype=dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("length, source", [(5, 5), (3, 6), (6, 3)])
def test_causal(length, source, dtype):
    assert_matches_eager(attention(is_causal=True), *qkv((2,), 2, length, source, dtype=dtype))


def test_explicit_scale():
    assert_matches_eager(attention(scale=0.7), *qkv((2,), 2, 4, 5))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mask_shape", [(4, 6), (2, 1, 4, 6), (2, 3, 4, 6), (1, 6)])
def test_bool_mask(mask_shape, dtype):
    mask = torch.rand(mask_shape) > 0.3
    mask[..., 0] = True
    assert_matches_eager(attention(), *qkv((2,), 3, 4, 6, dtype=dtype), mask)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mask_shape", [(4, 6), (2, 1, 1, 6), (2, 3, 4, 6)])
def test_float_mask(mask_shape, dtype):
    assert_matches_eager(attention(), *qkv((2,), 3, 4, 6, dtype=dtype), torch.randn(mask_shape).to(dtype))


def test_fully_masked_rows_give_zeros():
    bool_mask = torch.ones(4, 6, dtype=torch.bool)
    bool_mask[1] = False
    float_mask = torch.zeros(4, 6)
    float_mask[2] = float("-inf")
    q, k, v = qkv((2,), 3, 4, 6)
    assert_matches_eager(attention(), q, k, v, bool_mask)
    assert_matches_eager(attention(), q, k, v, float_mask)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("options, mask", [
    (dict(), None),
    (dict(is_causal=True), None),
    (dict(), (1, 1, 5, 7)),
    (dict(), (2, 8, 5, 7)),
])
def test_grouped_query(options, mask, dtype):
    args = qkv((2,), 8, 5, 7, kv_heads=2, dtype=dtype)
    masks = [torch.rand(mask) > 0.2] if mask else []
    assert_matches_eager(attention(enable_gqa=True, **options), *args, *masks)


@pytest.mark.parametrize("options", [dict(), dict(is_causal=True), dict(enable_gqa=True)])
@pytest.mark.parametrize("key_shape", [
    (2, 1, 7, 8),   # one key/value head for every query head (Falcon's multi-query attention, no enable_gqa)
    (1, 4, 7, 8),   # a key and value of batch 1 for a query of batch 2
    (1, 1, 7, 8),   # both
])
def test_keys_and_values_broadcast_over_the_query(key_shape, options):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(key_shape), torch.randn(key_shape)
    masks = [] if options.get("is_causal") else [torch.rand(2, 1, 5, 7) > 0.2]  # torch takes one or the other
    assert_matches_eager(attention(**options), q, k, v, *masks)


def test_broadcast_keys_under_a_symbolic_batch():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 5, 8), torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8)
    batch = torch.export.Dim("batch", min=2, max=16)
    program = torch.export.export(FunctionModule(attention(is_causal=True)), (q, k, v),
                                  dynamic_shapes=(({0: batch}, None, None),))
    artifact = export_to_stablehlo(program)
    for size in (2, 5):
        query = torch.randn(size, 4, 5, 8)
        torch.testing.assert_close(artifact(query, k, v), F.scaled_dot_product_attention(query, k, v, is_causal=True))


@pytest.mark.parametrize("options", [dict(), dict(is_causal=True, scale=0.5)])
def test_flash_attention_for_cpu(options):
    def flash(q, k, v):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, **options)

    assert_matches_eager(flash, *qkv((2,), 3, 4, 6))


def test_flash_attention_for_cpu_masked_rows():
    mask = torch.zeros(4, 6)
    mask[1] = float("-inf")

    def flash(q, k, v):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, attn_mask=mask)

    assert_matches_eager(flash, *qkv((2,), 3, 4, 6))


def test_is_a_composite_with_one_decomposition_per_call():
    def twice(q, k, v):
        return F.scaled_dot_product_attention(F.scaled_dot_product_attention(q, k, v, scale=0.5), k, v,
                                              is_causal=True)

    text = assert_matches_eager(twice, *qkv((2,), 2, 4, 4)).stablehlo_text
    assert text.count('stablehlo.composite "torch.aten.scaled_dot_product_attention"') == 2
    assert "is_causal = true" in text and "scale = 5.000000e-01 : f64" in text
    assert text.count("func.func private") == 2


def test_dynamic_batch_and_sequence_lower_to_a_valid_module():
    q, k, v = qkv((2,), 2, 4, 4)
    mask = torch.rand(2, 1, 4, 4) > 0.2
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    dims = {0: batch, 2: length}
    module = FunctionModule(attention())
    program = torch.export.export(module, (q, k, v, mask),
                                  dynamic_shapes=((dims, dims, dims, {0: batch, 2: length, 3: length}),))
    text = export_to_stablehlo(program).stablehlo_text
    assert "tensor<?x2x?x8xf32>" in text
    with make_context():
        module = ir.Module.parse(text)
        assert module.operation.verify()


@pytest.mark.parametrize("options", [dict(), dict(is_causal=True), dict(enable_gqa=True)])
def test_dropout_draws_numbers_inline(options):
    """Dropout makes the op random: the program takes the rng_seed argument and the attention is inlined (no
    composite, whose function could not reach the seed); its statistics are checked in test_random.py."""
    inputs = qkv((2,), 4, 4, 4, kv_heads=2 if options.get("enable_gqa") else None)
    artifact = export_to_stablehlo(FunctionModule(attention(dropout_p=0.5, **options)), inputs)
    assert artifact.signature.takes_rng_seed and "stablehlo.composite" not in artifact.stablehlo_text
    first, second = artifact(*inputs), artifact(*inputs)
    assert first.shape == inputs[0].shape and not torch.equal(first, second)
    assert not export_to_stablehlo(FunctionModule(attention(dropout_p=0.0, **options)),
                                   inputs).signature.takes_rng_seed


def test_dropout_with_probability_one_gives_zeros():
    inputs = qkv((2,), 2, 4, 4)
    out = export_to_stablehlo(FunctionModule(attention(dropout_p=1.0)), inputs)(*inputs)
    torch.testing.assert_close(out, torch.zeros_like(out))


class _DerivedKeys(torch.nn.Module):
    """Keys of a length derived from the query's symbolic length: 2*s (the queries twice) and s + 1 (a learned
    token in front, with a bool mask of that width)."""

    def __init__(self):
        super().__init__()
        self.token = torch.nn.Parameter(torch.randn(1, 2, 1, 8))

    def forward(self, q):
        doubled = torch.cat([q, q.flip(2)], dim=2)
        prefixed = torch.cat([self.token.expand(q.shape[0], -1, -1, -1), q], dim=2)
        mask = torch.ones(q.shape[2], q.shape[2] + 1, dtype=torch.bool).tril(1)
        return (F.scaled_dot_product_attention(q, doubled, doubled),
                F.scaled_dot_product_attention(q, prefixed, prefixed, attn_mask=mask, scale=0.3))


def test_key_lengths_derived_from_a_symbolic_length_run_at_every_size():
    """The composite's decomposition reads each symbolic size from its own arguments, derived ones included."""
    torch.manual_seed(0)
    model = _DerivedKeys()
    shapes = ({0: torch.export.Dim("batch", min=1, max=4), 2: torch.export.Dim("s", min=2, max=16)},)
    artifact = export_to_stablehlo(model, (torch.randn(2, 2, 5, 8),), dynamic_shapes=shapes)
    assert "stablehlo.composite" in artifact.stablehlo_text
    for batch, length in [(1, 2), (3, 7), (4, 16)]:
        q = torch.randn(batch, 2, length, 8)
        with torch.no_grad():
            torch.testing.assert_close(artifact(q), model(q))


def test_calls_over_different_symbolic_lengths_do_not_share_a_function():
    """An encoder's and a decoder's self-attention print alike (``?`` lengths) but are different sizes: each
    gets its function (shape refinement specialises a function once), and the program runs with them unequal."""
    def two_attentions(a, b):
        return F.scaled_dot_product_attention(a, a, a), F.scaled_dot_product_attention(b, b, b)

    source, target = torch.export.Dim("source", max=64), torch.export.Dim("target", max=64)
    program = torch.export.export(FunctionModule(two_attentions), (torch.randn(1, 4, 6, 16), torch.randn(1, 4, 6, 16)),
                                  dynamic_shapes=(({2: source}, {2: target}),))
    artifact = export_to_stablehlo(program)
    assert artifact.stablehlo_text.count("func.func private") == 2
    a, b = torch.randn(1, 4, 5, 16), torch.randn(1, 4, 9, 16)
    torch.testing.assert_close(artifact(a, b), two_attentions(a, b))
