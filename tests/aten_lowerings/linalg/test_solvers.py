"""linalg/solvers.py against eager torch: factorizations, determinants, inverses and solves borrowed from JAX
(LAPACK on CPU), on well-conditioned inputs, batched and with a symbolic batch dim."""
import pytest
import torch

from tests.support import assert_matches_eager, make


def positive_definite(*batch, n=4, seed=0):
    a = make((*batch, n, n), seed=seed)
    return a @ a.mT + n * torch.eye(n)


def well_conditioned(*batch, n=4, seed=0):
    """A general (not symmetric) matrix dominated by its diagonal."""
    return make((*batch, n, n), low=-1.0, high=1.0, seed=seed) + n * torch.eye(n)


def test_svd():
    a = make((2, 5, 3), seed=1)
    assert_matches_eager(lambda a: (*torch.linalg.svd(a, full_matrices=False), *torch.linalg.svd(a),
                                    torch.linalg.svdvals(a), *torch.svd(a)), a)


def eigh_up_to_signs(a, UPLO="L"):
    """Eigenvalues, and eigenvectors up to their signs: torch's LAPACK (MKL) and jaxlib's may choose others."""
    values, vectors = torch.linalg.eigh(a, UPLO)
    return values, vectors.abs()


def test_eigendecompositions():
    a = positive_definite(2)
    b = well_conditioned(3, seed=2)
    assert_matches_eager(lambda a, b: (*eigh_up_to_signs(a), *eigh_up_to_signs(a, "U"), torch.linalg.eigvalsh(a, "U"),
                                       *torch.linalg.eig(b), torch.linalg.eigvals(b)), a, b)


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr(mode):
    assert_matches_eager(lambda a: torch.linalg.qr(a, mode=mode), make((2, 5, 3), seed=3))


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("columns", [3, 7])
def test_qr_symbolic_rows(mode, columns):
    """A symbolic row count leaves min(m, n) open: geqrf and householder_product instead of JAX's qr."""
    a = make((5, columns), seed=17)
    artifact = assert_matches_eager(lambda a: torch.linalg.qr(a, mode=mode), a,
                                    dynamic_shapes=(({0: torch.export.Dim("rows", min=2, max=16)},),))
    a = make((9, columns), seed=18)
    torch.testing.assert_close(artifact(a), torch.linalg.qr(a, mode=mode))


def test_householder():
    a = make((2, 5, 3), seed=4)
    c = make((2, 5, 2), seed=5)
    assert_matches_eager(lambda a, c: (*torch.geqrf(a), torch.linalg.householder_product(*torch.geqrf(a)),
                                       torch.ormqr(*torch.geqrf(a), c, transpose=True)), a, c)


@pytest.mark.parametrize("shape", [(2, 4, 4), (5, 3), (3, 5)])
def test_lu(shape):
    a = make(shape, seed=6)
    assert_matches_eager(lambda a: (*torch.linalg.lu(a), *torch.linalg.lu_factor_ex(a), *torch.linalg.lu_factor(a),
                                    *torch.lu_unpack(*torch.linalg.lu_factor(a))), a)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
def test_lu_solve(left, adjoint):
    a = well_conditioned(2)
    b = make((2, 4, 3) if left else (2, 3, 4), seed=7)
    assert_matches_eager(lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, left=left,
                                                            adjoint=adjoint), a, b)


def test_determinants():
    a = well_conditioned(3)
    assert_matches_eager(lambda a: (torch.linalg.det(a), *torch.linalg.slogdet(a), torch.logdet(a @ a.mT),
                                    torch.ops.aten._linalg_det(a)), a)


def test_inverse_and_solve():
    a = well_conditioned(2)
    b = make((2, 4, 3), seed=8)
    vector = make((4,), seed=9)
    assert_matches_eager(lambda a, b, v: (torch.linalg.inv(a), *torch.linalg.inv_ex(a), torch.linalg.solve(a, b),
                                          torch.linalg.solve(a, v), torch.linalg.solve(a, b.mT, left=False),
                                          *torch.ops.aten._linalg_solve_ex(a, b),
                                          torch.linalg.matrix_power(a, -2)), a, b, vector)


@pytest.mark.parametrize("upper", [False, True])
def test_triangular_and_cholesky_solves(upper):
    factor = torch.linalg.cholesky(positive_definite(2), upper=upper)
    b = make((2, 4, 3), seed=10)
    assert_matches_eager(lambda f, b: (
        torch.linalg.solve_triangular(f, b, upper=upper), torch.linalg.solve_triangular(f, b.mT, upper=upper, left=False),
        torch.linalg.solve_triangular(f, b, upper=upper, unitriangular=True),
        *torch.triangular_solve(b, f, upper=upper, transpose=True), torch.cholesky_solve(b, f, upper=upper),
        torch.cholesky_inverse(f, upper=upper)), factor, b)


def test_cholesky():
    assert_matches_eager(lambda a: (torch.linalg.cholesky(a), torch.linalg.cholesky(a, upper=True)),
                         positive_definite(2))


def test_matrix_functions():
    a = make((2, 4, 4), low=-0.5, high=0.5, seed=11)
    singular = make((2, 5, 3), seed=12) @ make((2, 3, 4), seed=13)  # rank 3
    assert_matches_eager(lambda a, s: (torch.linalg.matrix_exp(a), torch.linalg.pinv(s),
                                       torch.linalg.pinv(s @ s.mT, hermitian=True), torch.linalg.pinv(s, atol=1.0),
                                       torch.linalg.matrix_rank(s), torch.linalg.matrix_rank(s @ s.mT, hermitian=True),
                                       torch.linalg.cond(a), torch.linalg.matrix_norm(a, "nuc")), a, singular)


def test_symbolic_batch():
    """Dim 0 symbolic: JAX gets a dimension variable for it; the artifact runs at other batch sizes too."""
    batch = torch.export.Dim("batch", min=2, max=16)

    def function(a, b):
        return (torch.linalg.solve(a, b), torch.linalg.det(a), *eigh_up_to_signs(a), torch.linalg.svdvals(b),
                *torch.linalg.lu_factor(a), torch.linalg.inv(a), torch.linalg.cholesky(a))

    a, b = positive_definite(3), make((3, 4, 2), seed=14)
    artifact = assert_matches_eager(function, a, b, dynamic_shapes=(({0: batch}, {0: batch}),))
    a, b = positive_definite(5, seed=15), make((5, 4, 2), seed=16)
    torch.testing.assert_close(artifact(a, b), function(a, b))


def test_tensor_inverse():
    a = well_conditioned(n=6).reshape(2, 3, 6)
    assert_matches_eager(lambda a: torch.linalg.tensorinv(a, ind=2), a)


def test_symbolic_factor_sizes():
    """lu_unpack with LU rows and pivots symbolic apart, pinv with both dims symbolic: JAX cannot relate the
    sizes, so no rule may need it to (nor use jnp helpers that become functions refined once)."""
    rows, count = torch.export.Dim("rows", min=2, max=16), torch.export.Dim("count", min=2, max=16)
    dynamic = torch.export.Dim.DYNAMIC
    lu, pivots = torch.linalg.lu_factor(make((5, 7), seed=19))
    artifact = assert_matches_eager(torch.lu_unpack, lu, pivots, dynamic_shapes=(({0: rows}, {0: count}),))
    lu, pivots = torch.linalg.lu_factor(make((3, 7), seed=20))
    torch.testing.assert_close(artifact(lu, pivots), torch.lu_unpack(lu, pivots))
    a = make((4, 3), seed=21)
    assert_matches_eager(torch.linalg.pinv, a, dynamic_shapes=(({0: dynamic, 1: dynamic},),))
