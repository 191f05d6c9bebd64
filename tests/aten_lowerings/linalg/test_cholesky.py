"""linalg/cholesky.py against eager torch: Cholesky factors and their info output."""
import pytest
import torch

from tests.support import assert_matches_eager, randn


def positive_definite(*batch, n=4):
    a = randn(*batch, n, n)
    return a @ a.mT + n * torch.eye(n)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(upper):
    a = positive_definite(2)
    assert_matches_eager(lambda a: (torch.cholesky(a, upper=upper), *torch.linalg.cholesky_ex(a, upper=upper)), a)

