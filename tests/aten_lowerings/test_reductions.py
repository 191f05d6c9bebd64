"""Reduction lowerings against eager torch: sums, extrema with indices, moments, scans, softmax, norms."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from torch_stablehlo.exporter import export_to_stablehlo
from tests.support import (FLOATS, INTS, assert_lowers_with_symbolic_batch, assert_table_lowers,
                           export_with_symbolic_batch, make)

aten = torch.ops.aten

SUMS = {
    "sum": (aten.sum.default, lambda x: x.sum()),
    "sum_dim": (aten.sum.dim_IntList, lambda x: x.sum(1)),
    "sum_dims_keepdim": (aten.sum.dim_IntList, lambda x: x.sum((0, -1), keepdim=True)),
    "sum_empty_dims": (aten.sum.dim_IntList, lambda x: x.sum(())),
    "sum_to_int64": (aten.sum.dim_IntList, lambda x: x.sum(-1, dtype=torch.int64)),
    "prod": (aten.prod.default, lambda x: x.prod()),
    "prod_dim": (aten.prod.dim_int, lambda x: x.prod(2, keepdim=True)),
    "amax": (aten.amax.default, lambda x: x.amax(1)),
    "amax_all": (aten.amax.default, lambda x: x.amax()),
    "amin_keepdim": (aten.amin.default, lambda x: x.amin((0, 2), keepdim=True)),
    "max": (aten.max.default, lambda x: x.max()),
    "min": (aten.min.default, lambda x: x.min()),
    "any": (aten.any.default, lambda x: x.any()),
    "any_dim": (aten.any.dim, lambda x: x.any(1)),
    "any_dims": (aten.any.dims, lambda x: x.any((0, 1), keepdim=True)),
    "all": (aten.all.default, lambda x: x.all()),
    "all_dim": (aten.all.dim, lambda x: x.all(-1, keepdim=True)),
    "all_dims": (aten.all.dims, lambda x: x.all((1, 2))),
    "cumsum": (aten.cumsum.default, lambda x: x.cumsum(1)),
    "cumsum_to_int64": (aten.cumsum.default, lambda x: x.cumsum(-1, dtype=torch.int64)),
    "cumprod": (aten.cumprod.default, lambda x: x.cumprod(0)),
}


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool], ids=str)
def test_sums_products_extrema_and_scans(dtype):
    """Small values keep products in range; integer and bool sums promote to int64 as in torch."""
    assert_table_lowers(SUMS, make((3, 4, 5), dtype, -2, 2) if dtype != torch.float32 else
                        make((3, 4, 5), dtype, 0.5, 1.5))


def test_half_sums_accumulate_in_float32():
    """4096 float16 ones sum to 4096 (a float16 accumulator would stall at 2048)."""
    x = torch.ones(2, 4096, dtype=torch.float16)
    assert_table_lowers({"sum": SUMS["sum_dim"], "cumsum": SUMS["cumsum"]}, x)


MEANS = {
    "mean": (aten.mean.default, lambda x: x.mean()),
    "mean_dim": (aten.mean.dim, lambda x: x.mean(-1)),
    "mean_dims_keepdim": (aten.mean.dim, lambda x: x.mean((0, 2), keepdim=True)),
    "mean_float64": (aten.mean.dim, lambda x: x.mean(1, dtype=torch.float64)),
    "var": (aten.var.correction, lambda x: x.var()),
    "var_default": (aten.var.default, lambda x: x.var(unbiased=False)),
    "var_dim": (aten.var.dim, lambda x: x.var(1, unbiased=False)),
    "var_correction": (aten.var.correction, lambda x: x.var((0, 2), correction=2, keepdim=True)),
    "std": (aten.std.correction, lambda x: x.std()),
    "std_dim": (aten.std.dim, lambda x: x.std(0, True, True)),
    "std_correction0": (aten.std.correction, lambda x: x.std(-1, correction=0)),
    "var_mean": (aten.var_mean.correction, lambda x: torch.var_mean(x, 1, correction=0)),
    "var_mean_dim": (aten.var_mean.dim, lambda x: torch.var_mean(x, 1, unbiased=True, keepdim=True)),
    "std_mean": (aten.std_mean.correction, lambda x: torch.std_mean(x)),
    "std_default": (aten.std.default, lambda x: x.std(unbiased=False)),
    "var_mean_default": (aten.var_mean.default, lambda x: torch.var_mean(x, unbiased=False)),
    "std_mean_dim": (aten.std_mean.dim, lambda x: torch.std_mean(x, (0, 1), unbiased=False)),
    "logsumexp": (aten.logsumexp.default, lambda x: x.logsumexp(1)),
    "logsumexp_keepdim": (aten.logsumexp.default, lambda x: x.logsumexp((0, 2), keepdim=True)),
    "softmax": (aten.softmax.int, lambda x: x.softmax(-1)),
    "softmax_dtype": (aten.softmax.int, lambda x: x.softmax(0, dtype=torch.float32)),
    "log_softmax": (aten.log_softmax.int, lambda x: F.log_softmax(x, 1)),
    "_softmax": (aten._softmax.default, lambda x: aten._softmax(x, 1, False)),
    "_log_softmax": (aten._log_softmax.default, lambda x: aten._log_softmax(x, 2, False)),
    "_safe_softmax": (aten._safe_softmax.default, lambda x: aten._safe_softmax(x, -1)),
    "norm": (aten.linalg_vector_norm.default, lambda x: x.norm()),
    "norm_dim": (aten.linalg_vector_norm.default, lambda x: torch.linalg.vector_norm(x, dim=1, keepdim=True)),
    "norm_1": (aten.linalg_vector_norm.default, lambda x: torch.linalg.vector_norm(x, 1, dim=(0, 2))),
    "norm_3": (aten.linalg_vector_norm.default, lambda x: torch.linalg.vector_norm(x, 3, dim=-1)),
    "norm_0": (aten.linalg_vector_norm.default, lambda x: torch.linalg.vector_norm(x.round(), 0, dim=-1)),
    "norm_inf": (aten.linalg_vector_norm.default, lambda x: torch.linalg.vector_norm(x, math.inf, dim=0)),
    "norm_neg_inf": (aten.linalg_vector_norm.default, lambda x: torch.linalg.vector_norm(x, -math.inf)),
}


@pytest.mark.parametrize("dtype, shape", [(dtype, (3, 4, 5)) for dtype in FLOATS] + [(torch.float32, (2, 7, 1))],
                         ids=str)
def test_means_moments_softmax_and_norms(dtype, shape):
    assert_table_lowers(MEANS, make(shape, dtype))


def test_logsumexp_and_softmax_of_infinite_rows():
    """Rows of -inf give -inf (logsumexp) and NaN (softmax, as torch) or 0 (_safe_softmax); +inf rows give inf."""
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [-math.inf] * 4, [math.inf, 0.0, 1.0, -math.inf]])
    names = ["logsumexp", "softmax", "log_softmax", "_safe_softmax"]
    assert_table_lowers({name: MEANS[name] for name in names}, x)


def test_logsumexp_and_softmax_of_rows_with_nan():
    """A NaN anywhere in a row makes the whole row NaN, whichever max the shift takes (the reducer has no NaN
    selects); the other rows are untouched."""
    x = torch.tensor([[1.0, math.nan, 3.0, 2.0], [math.nan, -math.inf, math.inf, 0.0], [0.5, 1.0, -1.0, 2.0]])
    names = ["logsumexp", "softmax", "log_softmax", "_safe_softmax"]
    assert_table_lowers({name: MEANS[name] for name in names}, x)


ARG_EXTREMA = {
    "max_dim": (aten.max.dim, lambda x: tuple(x.max(1))),
    "max_dim_keepdim": (aten.max.dim, lambda x: tuple(x.max(-1, keepdim=True))),
    "min_dim": (aten.min.dim, lambda x: tuple(x.min(0))),
    "argmax": (aten.argmax.default, lambda x: x.argmax()),
    "argmax_dim": (aten.argmax.default, lambda x: x.argmax(1)),
    "argmax_keepdim": (aten.argmax.default, lambda x: x.argmax(keepdim=True)),
    "argmin_dim_keepdim": (aten.argmin.default, lambda x: x.argmin(0, keepdim=True)),
    "argmin": (aten.argmin.default, lambda x: x.argmin()),
}


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
def test_arg_extrema_take_the_first_of_ties(dtype):
    """Values in [-2, 2) repeat a lot, so the first-index rule decides most results."""
    assert_table_lowers(ARG_EXTREMA, make((4, 6), dtype, -2, 2))


def test_arg_extrema_pick_nan_first():
    """NaN beats every number, and the first NaN wins (torch's rule for max/min/argmax/argmin/amax)."""
    x = torch.tensor([[1.0, math.nan, 3.0, math.nan], [-math.inf, -math.inf, 0.0, 2.0],
                      [math.inf, 1.0, math.inf, math.nan], [2.0, 2.0, 2.0, 2.0]])
    ops = ARG_EXTREMA | {"amax": SUMS["amax"], "amin": (aten.amin.default, lambda t: t.amin(0)), "max": SUMS["max"]}
    assert_table_lowers(ops, x)


def test_reductions_of_a_zero_dim_tensor():
    ops = {name: SUMS[name] for name in ["sum", "amax_all", "max", "any"]} | {
        "max_dim": (aten.max.dim, lambda x: tuple(x.max(0))), "argmax": ARG_EXTREMA["argmax"],
        "mean": MEANS["mean"], "softmax": (aten.softmax.int, lambda x: x.softmax(0)),
        "cumsum": (aten.cumsum.default, lambda x: x.cumsum(0, dtype=torch.float64))}
    assert_table_lowers(ops, torch.tensor(1.5))


SYMBOLIC = {
    "sum": (False, lambda x: x.sum(0)), "mean": (True, lambda x: x.mean()),
    "mean_keepdim": (True, lambda x: x.mean(0, keepdim=True)), "var": (True, lambda x: x.var(0)),
    "std_rows": (True, lambda x: x.std(1)), "softmax": (True, lambda x: x.softmax(0)),
    "log_softmax": (True, lambda x: F.log_softmax(x, 1)), "logsumexp": (True, lambda x: x.logsumexp(0)),
    "argmax": (True, lambda x: x.argmax()), "max_dim": (True, lambda x: tuple(x.max(0))),
    "amin": (False, lambda x: x.amin(1)), "norm": (False, lambda x: x.norm(dim=0)),
    "cumsum_static_dim": (False, lambda x: x.cumsum(2)), "prod": (False, lambda x: x.prod(0)),
}


@pytest.mark.parametrize("name", list(SYMBOLIC))
def test_symbolic_batch_lowers_to_dynamic_ops(name):
    """Where the reduction needs the symbolic size (a count, a broadcast back, an iota), it reads it at run time."""
    reads_size, function = SYMBOLIC[name]
    assert_lowers_with_symbolic_batch(function, make((4, 6, 5), torch.float32), reads_size=reads_size)


@pytest.mark.parametrize("max_batch", [40, None], ids=["bounded", "unbounded"])
def test_scans_along_a_symbolic_dim_run_at_every_size(max_batch):
    """cumsum/cumprod along a dynamic dim: a log-step scan (as many steps as the range's upper bound needs, 31
    when unbounded) that refinement makes static; run at the min, between and the max (or far beyond)."""
    def scans(x):
        counts = x.round().to(torch.int32)
        return x.cumsum(0), (x * 0.1 + 1).cumprod(0), counts.cumsum(0, dtype=torch.int64), x.cumsum(1)

    program = export_with_symbolic_batch(scans, make((4, 3)), min_batch=1, max_batch=max_batch)
    artifact = export_to_stablehlo(program)
    assert "dynamic_pad" in artifact.stablehlo_text
    for batch in [1, 7, 40 if max_batch else 300]:
        x = make((batch, 3), seed=batch)
        torch.testing.assert_close(artifact(x), scans(x))


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
@pytest.mark.parametrize("dim", [0, -1])
def test_cummax_cummin(dim, dtype):
    """Few distinct values: ties go to the last index, as in torch."""
    x = make((5, 9), dtype, -2, 3, seed=1).round() if dtype.is_floating_point else make((5, 9), dtype, -2, 3, seed=1)
    assert_table_lowers({"max": (aten.cummax.default, lambda x: torch.cummax(x, dim)),
                         "min": (aten.cummin.default, lambda x: torch.cummin(x, dim))}, x)


def test_cummax_nan():
    x = torch.tensor([1.0, 3, 3, math.nan, 2, math.nan, 5, 5, -math.inf])
    assert_table_lowers({"max": (aten.cummax.default, lambda x: torch.cummax(x, 0)),
                         "min": (aten.cummin.default, lambda x: torch.cummin(x, 0))}, x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_logcumsumexp(dtype):
    x = make((4, 9), dtype)
    x[0, 3], x[1, :2], x[2, 4] = -math.inf, -math.inf, math.inf
    assert_table_lowers({"lcse": (aten.logcumsumexp.default, lambda x: torch.logcumsumexp(x, 1))}, x)

