"""Matrix products against eager: every matmul rank case, the add-product ops, dot/mv and einsum."""
import pytest
import torch

from tests.support import FLOATS, assert_matches_eager, randn


MATMUL_SHAPES = [
    ((3,), (3,)),                 # vector . vector
    ((4, 3), (3, 5)),             # matrix @ matrix
    ((3,), (3, 5)),               # vector @ matrix
    ((4, 3), (3,)),               # matrix @ vector
    ((2, 4, 3), (3,)),            # stacked @ vector
    ((3,), (2, 3, 5)),            # vector @ stacked
    ((2, 4, 3), (3, 5)),          # stacked @ matrix
    ((4, 3), (2, 3, 5)),          # matrix @ stacked (broadcast lhs)
    ((2, 4, 3), (2, 3, 5)),       # equal batch
    ((2, 1, 4, 3), (5, 3, 2)),    # batch broadcasting on both sides
    ((1, 6, 4, 3), (2, 1, 3, 5)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("a_shape, b_shape", MATMUL_SHAPES)
def test_matmul(a_shape, b_shape, dtype):
    assert_matches_eager(torch.matmul, randn(*a_shape, dtype=dtype), randn(*b_shape, dtype=dtype))


def test_matmul_int():
    a, b = torch.randint(-5, 5, (2, 3, 4)), torch.randint(-5, 5, (4, 2))
    assert_matches_eager(torch.matmul, a, b)


@pytest.mark.parametrize("dtype", FLOATS)
def test_mm_and_bmm(dtype):
    assert_matches_eager(lambda a, b, c, d: (torch.mm(a, b), torch.bmm(c, d)),
                         randn(4, 3, dtype=dtype), randn(3, 5, dtype=dtype),
                         randn(2, 4, 3, dtype=dtype), randn(2, 3, 5, dtype=dtype))


@pytest.mark.parametrize("beta, alpha", [(1, 1), (0.5, 2.0), (0, 1)])
def test_addmm(beta, alpha):
    bias = torch.randn(5)
    if beta == 0:
        bias[0] = float("nan")  # beta == 0 ignores the input entirely
    assert_matches_eager(lambda c, a, b: torch.addmm(c, a, b, beta=beta, alpha=alpha),
                         bias, torch.randn(4, 3), torch.randn(3, 5))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("beta, alpha", [(1, 1), (0.5, -1.5)])
def test_baddbmm(beta, alpha, dtype):
    assert_matches_eager(lambda c, a, b: torch.baddbmm(c, a, b, beta=beta, alpha=alpha),
                         randn(2, 4, 5, dtype=dtype), randn(2, 4, 3, dtype=dtype), randn(2, 3, 5, dtype=dtype))


@pytest.mark.parametrize("x_shape", [(3,), (4, 3), (2, 4, 3)])
def test_linear(x_shape):
    assert_matches_eager(torch.nn.Linear(3, 6), torch.randn(*x_shape))


@pytest.mark.parametrize("dtype", FLOATS)
def test_dot_and_mv(dtype):
    assert_matches_eager(lambda a, b, m: (torch.dot(a, b), torch.mv(m, a)),
                         randn(3, dtype=dtype), randn(3, dtype=dtype), randn(4, 3, dtype=dtype))


EINSUM_CASES = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("ij,kj->ik", [(3, 4), (5, 4)]),
    ("ij,jk", [(3, 4), (4, 5)]),                       # implicit output
    ("ij->ji", [(3, 4)]),                              # transpose only
    ("ijk->j", [(2, 3, 4)]),                           # sum only
    ("i,j->ij", [(3,), (4,)]),                         # outer product
    ("bi,bi->b", [(2, 5), (2, 5)]),
    ("ik,kj,jl->il", [(2, 3), (3, 4), (4, 5)]),        # three operands
    ("bxy,bz->byz", [(2, 3, 4), (2, 5)]),              # x summed before contracting
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (3, 5, 6)]),  # ellipsis, right-aligned
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),    # bilinear
]


@pytest.mark.parametrize("equation, shapes", EINSUM_CASES)
def test_einsum(equation, shapes):
    assert_matches_eager(lambda *ts: torch.einsum(equation, *ts), *[torch.randn(*s) for s in shapes])


def test_einsum_low_precision():
    a, b = randn(2, 3, 4, dtype=torch.bfloat16), randn(2, 4, 5, dtype=torch.bfloat16)
    assert_matches_eager(lambda x, y: torch.einsum("bij,bjk->bik", x, y), a, b)


# float32 only: torch's float16/bfloat16 addbmm rounds after each batch's addmm; ours rounds once.
@pytest.mark.parametrize("dtype", [torch.float32], ids=str)
def test_addbmm_and_bilinear(dtype):
    bias, a, b = randn(3, 5, dtype=dtype), randn(4, 3, 2, dtype=dtype), randn(4, 2, 5, dtype=dtype)
    assert_matches_eager(lambda bias, a, b: torch.addbmm(bias, a, b, beta=0.5, alpha=2), bias, a, b)
    x1, x2, weight = randn(6, 3, dtype=dtype), randn(6, 4, dtype=dtype), randn(2, 3, 4, dtype=dtype)
    assert_matches_eager(torch.nn.functional.bilinear, x1, x2, weight)
