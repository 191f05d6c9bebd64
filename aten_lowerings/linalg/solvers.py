"""Factorizations and solvers StableHLO has no op for (SVD, eigendecompositions, QR, LU, determinants, inverses,
linear solves, pseudo-inverses, matrix exponential), borrowed from JAX (``emit.jax_functions.call_jax``).

JAX lowers these for CPU to ``stablehlo.custom_call``s of LAPACK routines that jaxlib's CPU runtime executes
(JAX guarantees those targets stay stable for serialized programs): a program using them runs on CPU. Torch
calls the same LAPACK routines on CPU, so factors that are unique only up to signs (singular and eigen
vectors, Q of QR) usually come out as torch's; torch's LAPACK (MKL) and jaxlib's are different builds,
though, and may pick other signs (seen for eigh with UPLO="U").

Outputs follow torch's conventions: LU pivots are 1-based int32, ``info`` is int32 (1 + the first zero on U's
diagonal, as LAPACK's getrf reports it), outputs a flag turns off are empty ``[0]`` tensors. det and slogdet
factor ``A^T`` of a real ``A`` as torch does for a contiguous one, so that their LU and pivots outputs are
torch's too (solve and inv factor ``A`` itself, as torch does).

The ``linalg_*`` ops that torch decomposes into an ``*_ex`` op and a ``_linalg_check_errors`` call (cholesky,
inv, solve, lu_factor) have rules of their own here or in ``cholesky``; like the ``*_ex`` ops they never
raise: a singular or non positive-definite input gives infs or NaNs where torch would raise.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import torch
from jax import lax
from jax._src.lax.linalg import geqrf as _jax_geqrf  # not re-exported by jax.lax.linalg; its lowering is LAPACK geqrf
from jax.lax import linalg as lax_linalg

from ..emit.jax_functions import call_jax
from ..promotion import compute_dtype, convert
from ..registry import lower
from ..values import dtype_of

aten = torch.ops.aten


def _jax(ctx, function, operands, keys, **static):
    """``call_jax`` of ``function`` on ``operands``: the node's tensor arguments at ``keys`` (positions or names),
    whose torch sizes give JAX its dimension variables. Returns a tuple (one result: that value)."""
    node_args = [ctx.node.args[k] if isinstance(k, int) else ctx.node.kwargs[k] for k in keys]
    results = call_jax(ctx, function, operands, [arg.meta["val"].shape for arg in node_args], **static)
    return tuple(results) if len(results) > 1 else results[0]


def _empty(a):
    return jnp.zeros((0,), a.dtype)


def _mH(a):
    return jnp.conj(jnp.swapaxes(a, -1, -2))


def _broadcast_batch(*matrices):
    """Matrices with their batch dims broadcast together (torch's linalg broadcasting)."""
    batch = jnp.broadcast_shapes(*(m.shape[:-2] for m in matrices))
    return [jnp.broadcast_to(m, (*batch, *m.shape[-2:])) for m in matrices]


# -- SVD and eigendecompositions -----------------------------------------------------------------------------

def _svd(a, *, full_matrices, compute_uv):
    if not compute_uv:
        return _empty(a), lax_linalg.svd(a, full_matrices=False, compute_uv=False), _empty(a)
    return tuple(lax_linalg.svd(a, full_matrices=full_matrices))


@lower(aten._linalg_svd.default)
def linalg_svd(ctx, a, full_matrices=False, compute_uv=True, *, driver=None):
    """(U, S, Vh), LAPACK's gesdd as torch calls it on CPU (``driver`` is a CUDA option)."""
    return _jax(ctx, _svd, [a], [0], full_matrices=full_matrices, compute_uv=compute_uv)


def _eigh(a, *, lower, compute_v):
    vectors, values = lax_linalg.eigh(a, lower=lower, symmetrize_input=False)
    return values, vectors if compute_v else _empty(a)


@lower(aten._linalg_eigh.default)
def linalg_eigh(ctx, a, UPLO="L", compute_v=True):
    """Ascending eigenvalues and eigenvectors read from the ``UPLO`` triangle only."""
    return _jax(ctx, _eigh, [a], [0], lower=UPLO == "L", compute_v=compute_v)


def _eig(a):
    values, vectors = lax_linalg.eig(a, compute_left_eigenvectors=False)
    return values, vectors


@lower(aten.linalg_eig.default)
def linalg_eig(ctx, a):
    """Complex eigenvalues and right eigenvectors (LAPACK geev: unit norm, largest component real)."""
    return _jax(ctx, _eig, [a], [0])


# -- QR and Householder products ------------------------------------------------------------------------------

def _qr(a, *, mode):
    if all(isinstance(d, int) for d in a.shape[-2:]):
        q, r = lax_linalg.qr(a, full_matrices=mode == "complete")
        return _empty(a) if mode == "r" else q, r
    # JAX's qr branches on m < n, which a symbolic m or n leaves open: geqrf and orgqr as torch calls them
    m = a.shape[-2]
    r, taus = _jax_geqrf(a)
    k = taus.shape[-1]
    if mode == "r":
        return _empty(a), jnp.triu(r[..., :k, :])
    if mode == "complete":  # the reflectors padded (or cut) to m columns
        reflectors = jnp.concatenate([r, jnp.zeros((*r.shape[:-1], m), r.dtype)], axis=-1)[..., :m]
        return lax_linalg.householder_product(reflectors, taus), jnp.triu(r)
    return lax_linalg.householder_product(r[..., :k], taus), jnp.triu(r[..., :k, :])


@lower(aten.linalg_qr.default)
def linalg_qr(ctx, a, mode="reduced"):
    """(Q, R); mode "r" leaves Q empty as torch does."""
    return _jax(ctx, _qr, [a], [0], mode=mode)


@lower(aten.geqrf.default)
def geqrf(ctx, a):
    return _jax(ctx, _jax_geqrf, [a], [0])


def _householder_product(a, tau):
    m, n = a.shape[-2:]
    if isinstance(m, int) and isinstance(n, int):
        return lax_linalg.householder_product(a, tau)
    # JAX must prove m >= n and k <= n (torch checks them when it runs): n zero rows more, which the
    # reflectors leave alone, and exactly n taus, those past k zero (reflectors that are the identity)
    padded = jnp.concatenate([a, jnp.zeros((*a.shape[:-2], n, n), a.dtype)], axis=-2)
    tau = jnp.concatenate([tau, jnp.zeros((*tau.shape[:-1], n), tau.dtype)], axis=-1)[..., :n]
    return lax_linalg.householder_product(padded, tau)[..., :m, :]


@lower(aten.linalg_householder_product.default)
def householder_product(ctx, a, tau):
    return _jax(ctx, _householder_product, [a, tau], [0, 1])


@lower(aten.ormqr.default)
def ormqr(ctx, a, tau, other, left=True, transpose=False):
    return _jax(ctx, lax_linalg.ormqr, [a, tau, other], [0, 1, 2], left=left, transpose=transpose)


# -- LU ---------------------------------------------------------------------------------------------------------

def _lu_info(lu, k):
    """LAPACK getrf's info: 1 + the index of the first exact zero on U's diagonal (``k`` long), 0 if none."""
    diagonal = jnp.diagonal(lu[..., :k, :k], axis1=-2, axis2=-1)  # square: no min(m, n) for JAX to decide
    order = lax.broadcasted_iota(jnp.int32, diagonal.shape, diagonal.ndim - 1) + 1
    never = jnp.iinfo(jnp.int32).max
    first = jnp.min(jnp.where(diagonal == 0, order, never), axis=-1, initial=never)
    return jnp.where(first == never, 0, first).astype(jnp.int32)


def _lu_factor(a):
    lu, pivots, _ = lax_linalg.lu(a)
    return lu, pivots + 1, _lu_info(lu, pivots.shape[-1])


@lower(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(ctx, a, *, pivot=True, check_errors=False):
    """(LU, 1-based pivots, info); ``pivot=False`` is refused by torch on CPU."""
    if not pivot:
        raise NotImplementedError("LU without pivoting (torch implements it on CUDA only)")
    return _jax(ctx, _lu_factor, [a], [0])


@lower(aten.linalg_lu_factor.default)
def linalg_lu_factor(ctx, a, *, pivot=True):
    """linalg_lu_factor_ex without its error check (a singular input gives zeros on U's diagonal)."""
    return linalg_lu_factor_ex(ctx, a, pivot=pivot)[:2]


def _permutation_matrix(permutation, dtype):
    """P with A = P @ L @ U for JAX's row permutation (``A[permutation] = L @ U``): P[permutation[i], i] = 1."""
    size = permutation.shape[-1]
    rows = lax.broadcasted_iota(permutation.dtype, (*permutation.shape, size), permutation.ndim)
    return jnp.swapaxes(permutation[..., None] == rows, -1, -2).astype(dtype)


def _unpack(lu, permutation, k, *, unpack_data=True, unpack_pivots=True):
    """(P, L, U) from an LU factor with ``k`` = min(m, n) pivots. Built from lax primitives only: jnp's helpers
    become functions of their own, which shape refinement cannot specialise when LU and pivots have
    independent symbolic sizes (lu_unpack's operands)."""
    p = _permutation_matrix(permutation, lu.dtype) if unpack_pivots else _empty(lu)
    if not unpack_data:
        return p, _empty(lu), _empty(lu)
    zero = lax.full_like(lu, 0)
    below = _triangle_mask(lu.shape) == 1  # row > column
    diagonal = _triangle_mask(lu.shape) == 0
    lower_part = lax.select(below, lu, lax.select(diagonal, lax.full_like(lu, 1), zero))
    upper_part = lax.select(below, zero, lu)
    starts = (0,) * lu.ndim
    return (p, lax.slice(lower_part, starts, (*lu.shape[:-1], k)),
            lax.slice(upper_part, starts, (*lu.shape[:-2], k, lu.shape[-1])))


def _lu(a):
    lu, pivots, permutation = lax_linalg.lu(a)
    return _unpack(lu, permutation, pivots.shape[-1])


@lower(aten.linalg_lu.default)
def linalg_lu(ctx, a, *, pivot=True):
    """(P, L, U) with A = P @ L @ U."""
    if not pivot:
        raise NotImplementedError("LU without pivoting (torch implements it on CUDA only)")
    return _jax(ctx, _lu, [a], [0])


def _lu_unpack(lu, pivots, *, unpack_data, unpack_pivots):
    k = jax.eval_shape(lax_linalg.lu, lu)[1].shape[-1]  # min(m, n), symbolic if m or n is
    return _unpack(lu, _permutation(pivots, lu.shape[-2]), k, unpack_data=unpack_data, unpack_pivots=unpack_pivots)


def _triangle_mask(shape):
    """sign(row - column) over a batch of matrices."""
    rows = lax.broadcasted_iota(jnp.int32, shape, len(shape) - 2)
    columns = lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1)
    return lax.sign(rows - columns)


def _permutation(pivots, size):
    """The row permutation of ``size`` rows that LAPACK's 1-based row swaps ``pivots`` make, one swap per step
    (lax_linalg.lu_pivots_to_permutation needs size >= len(pivots) proven, which symbolic sizes may not be)."""
    last = pivots.ndim - 1
    rows = lax.broadcasted_iota(pivots.dtype, (*pivots.shape[:-1], size), last)
    steps = lax.broadcasted_iota(pivots.dtype, pivots.shape, last)

    def pick(x, mask):  # the element of each row of x that mask marks, broadcast along the row
        picked = lax.reduce(lax.select(mask, x, lax.full_like(x, 0)), x.dtype.type(0), lax.add, [last])
        return lax.broadcast_in_dim(picked, rows.shape, tuple(range(last)))

    def swap(i, permutation):
        j = pick(pivots, steps == i) - 1
        at_i, at_j = pick(permutation, rows == i), pick(permutation, rows == j)
        return lax.select(rows == i, at_j, lax.select(rows == j, at_i, permutation))

    return lax.fori_loop(0, pivots.shape[-1], swap, rows)


@lower(aten.lu_unpack.default)
def lu_unpack(ctx, lu, pivots, unpack_data=True, unpack_pivots=True):
    return _jax(ctx, _lu_unpack, [lu, pivots], [0, 1], unpack_data=unpack_data, unpack_pivots=unpack_pivots)


def _gather_rows(b, permutation):
    """``b[..., permutation[i], :]`` row by row, batch dims broadcast."""
    index = jnp.broadcast_to(permutation[..., None], (*b.shape[:-1], b.shape[-1]))
    return jnp.take_along_axis(b, index, axis=-2)


def _solve_factored(lu, permutation, b, *, adjoint):
    """X with A X = B (A^H X = B if ``adjoint``) for A = P L U; ``lu``, ``permutation`` and ``b`` share batch dims."""
    solve = lambda x, lower, **kw: lax_linalg.triangular_solve(  # noqa: E731
        lu, x, left_side=True, lower=lower, unit_diagonal=lower, transpose_a=adjoint, conjugate_a=adjoint, **kw)
    if not adjoint:
        return solve(solve(_gather_rows(b, permutation), True), False)
    return _gather_rows(solve(solve(b, False), True), jnp.argsort(permutation, axis=-1))


def _lu_solve(lu, pivots, b, *, left, adjoint):
    if not left:  # X A = B  <=>  A^H X^H = B^H
        return _mH(_lu_solve(lu, pivots, _mH(b), left=True, adjoint=not adjoint))
    lu, b = _broadcast_batch(lu, b)
    pivots = jnp.broadcast_to(pivots, lu.shape[:-1])
    permutation = lax_linalg.lu_pivots_to_permutation(pivots - 1, lu.shape[-1])
    return _solve_factored(lu, permutation, b, adjoint=adjoint)


@lower(aten.linalg_lu_solve.default)
def linalg_lu_solve(ctx, lu, pivots, b, *, left=True, adjoint=False):
    return _jax(ctx, _lu_solve, [lu, pivots, b], [0, 1, 2], left=left, adjoint=adjoint)


# -- determinants, inverses and solves through LU ------------------------------------------------------------------

def _factor_as_torch(a):
    """LU factor and pivots of A, or of A^T for a real A (torch's det and slogdet do so for a contiguous real A:
    it saves a copy, and det(A^T) = det(A))."""
    transposed = not jnp.issubdtype(a.dtype, jnp.complexfloating)
    lu, pivots, _ = lax_linalg.lu(jnp.swapaxes(a, -1, -2) if transposed else a)
    return lu, pivots


def _pivot_sign(pivots, dtype):
    swaps = jnp.sum(pivots != lax.broadcasted_iota(pivots.dtype, pivots.shape, pivots.ndim - 1), axis=-1)
    return jnp.where(swaps % 2 == 1, -1, 1).astype(dtype)


def _det(a):
    lu, pivots = _factor_as_torch(a)
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return _pivot_sign(pivots, a.dtype) * jnp.prod(diagonal, axis=-1), lu, pivots + 1


@lower(aten._linalg_det.default)
def linalg_det(ctx, a):
    """(det, LU, pivots): the product of U's diagonal times the sign of the row permutation."""
    return _jax(ctx, _det, [a], [0])


def _slogdet(a):
    lu, pivots = _factor_as_torch(a)
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    sign = _pivot_sign(pivots, a.dtype) * jnp.prod(jnp.sign(diagonal), axis=-1)
    return sign, jnp.sum(jnp.log(jnp.abs(diagonal)), axis=-1), lu, pivots + 1


@lower(aten._linalg_slogdet.default)
def linalg_slogdet(ctx, a):
    """(sign, log|det|, LU, pivots); a singular A gives sign 0 and -inf."""
    return _jax(ctx, _slogdet, [a], [0])


def _solve_ex(a, b, *, left, vector):
    """torch's _linalg_solve_ex: LU of A, then the solve; B a vector when ``vector``."""
    lu, pivots, permutation = lax_linalg.lu(a)
    b = b[..., None] if vector else b
    if not left:  # X A = B  <=>  A^H X^H = B^H
        b = _mH(b)
    factors, b = _broadcast_batch(lu, b)
    permutation = jnp.broadcast_to(permutation, factors.shape[:-1])
    x = _solve_factored(factors, permutation, b, adjoint=not left)
    x = x if left else _mH(x)
    return x[..., 0] if vector else x, lu, pivots + 1, _lu_info(lu, pivots.shape[-1])


def _is_vector_rhs(a, b) -> bool:
    """torch's linalg_solve_is_vector_rhs on the node's metadata."""
    return b.dim() == 1 or (a.dim() - 1 == b.dim() and b.shape == a.shape[:-1])


@lower(aten._linalg_solve_ex.default)
def linalg_solve_ex(ctx, a, b, *, left=True, check_errors=False):
    """(X, LU, pivots, info) with A X = B (X A = B when not ``left``)."""
    vector = _is_vector_rhs(ctx.arg_meta(0), ctx.arg_meta(1))
    return _jax(ctx, _solve_ex, [a, b], [0, 1], left=left, vector=vector)


@lower(aten.linalg_solve.default)
def linalg_solve(ctx, a, b, *, left=True):
    """_linalg_solve_ex's solution, without the error check (a singular A gives infs or NaNs)."""
    return linalg_solve_ex(ctx, a, b, left=left)[0]


def _inv_ex(a):
    identity = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    x, _, _, info = _solve_ex(a, identity, left=True, vector=False)
    return x, info


@lower(aten.linalg_inv_ex.default)
def linalg_inv_ex(ctx, a, *, check_errors=False):
    """(inverse, info): torch solves A X = I through _linalg_solve_ex, so do we."""
    return _jax(ctx, _inv_ex, [a], [0])


@lower(aten.linalg_inv.default)
def linalg_inv(ctx, a):
    """linalg_inv_ex's inverse, without the error check."""
    return linalg_inv_ex(ctx, a)[0]


def _tensorinv(a, *, ind):
    front, back = a.shape[:ind], a.shape[ind:]
    inverse, _ = _inv_ex(a.reshape(math.prod(front), math.prod(back)))
    return inverse.reshape(*back, *front)


@lower(aten.linalg_tensorinv.default)
def linalg_tensorinv(ctx, a, ind=2):
    """linalg_inv of ``a`` as a matrix (its first ``ind`` dims the rows), lowered whole: torch's decomposition
    would leave linalg_inv's error check, an effect token the exporter cannot carry."""
    return _jax(ctx, _tensorinv, [a], [0], ind=ind)


# -- triangular and Cholesky solves -----------------------------------------------------------------------------

def _solve_triangular(a, b, *, upper, left, unitriangular, transpose=False):
    a, b = _broadcast_batch(a, b)
    return lax_linalg.triangular_solve(a, b, left_side=left, lower=not upper, transpose_a=transpose,
                                       unit_diagonal=unitriangular)


@lower(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(ctx, a, b, *, upper, left=True, unitriangular=False):
    return _jax(ctx, _solve_triangular, [a, b], [0, 1], upper=upper, left=left, unitriangular=unitriangular)


def _triangular_solve(b, a, *, upper, transpose, unitriangular):
    solution = _solve_triangular(a, b, upper=upper, left=True, unitriangular=unitriangular, transpose=transpose)
    return solution, _broadcast_batch(a, b)[0]


@lower(aten.triangular_solve.default)
def triangular_solve(ctx, b, a, upper=True, transpose=False, unitriangular=False):
    """(X, A broadcast) with op(A) X = B, op transposing A if ``transpose``."""
    return _jax(ctx, _triangular_solve, [b, a], [0, 1], upper=upper, transpose=transpose,
                unitriangular=unitriangular)


def _cholesky_solve(b, factor, *, upper):
    """X with A X = B for A = L L^H (``factor`` L) or U^H U (``factor`` U)."""
    factor, b = _broadcast_batch(factor, b)
    solve = lambda x, adjoint: lax_linalg.triangular_solve(  # noqa: E731
        factor, x, left_side=True, lower=not upper, transpose_a=adjoint, conjugate_a=adjoint)
    return solve(solve(b, upper), not upper)


@lower(aten.cholesky_solve.default)
def cholesky_solve(ctx, b, factor, upper=False):
    return _jax(ctx, _cholesky_solve, [b, factor], [0, 1], upper=upper)


def _cholesky_inverse(factor, *, upper):
    identity = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return _cholesky_solve(identity, factor, upper=upper)


@lower(aten.cholesky_inverse.default)
def cholesky_inverse(ctx, factor, upper=False):
    """(L L^H)^-1 from the Cholesky factor L (or U^H U from U)."""
    return _jax(ctx, _cholesky_inverse, [factor], [0], upper=upper)


# -- matrix functions ------------------------------------------------------------------------------------------

@lower(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(ctx, a):
    """JAX's scaling-and-squaring Pade approximant, float16/bfloat16 computed in float32 and rounded once.
    torch uses Taylor polynomials of degree up to 18 instead: for matrices of large norm the two differ by
    more than float32's tolerance (torch's own error, against float64, is the larger one)."""
    result = _jax(ctx, jsl.expm, [convert(a, compute_dtype(dtype_of(a)))], [0])
    return convert(result, ctx.out_dtype)


def _pinv(a, *tolerances, atol, rtol, hermitian):
    """torch's linalg_pinv: ``atol``/``rtol`` each None, a number, or "operand" (the next of ``tolerances``)."""
    tolerances = iter(tolerances)
    take = lambda given: next(tolerances) if isinstance(given, str) else given  # noqa: E731
    atol, rtol = take(atol), take(rtol)
    m, n = a.shape[-2:]
    if any(isinstance(d, int) and d == 0 for d in a.shape):
        return jnp.zeros((*a.shape[:-2], n, m), a.dtype)
    if rtol is None:
        default = jnp.finfo(a.dtype).eps * jnp.maximum(jnp.asarray(m), jnp.asarray(n)).astype(jnp.float64)
        rtol = default if atol is None else jnp.where(jnp.asarray(atol) > 0, 0.0, default)
    atol = jnp.zeros((), jnp.float64) if atol is None else atol
    atol, rtol = jnp.asarray(atol, jnp.float64)[..., None], jnp.asarray(rtol, jnp.float64)[..., None]
    if hermitian:
        vectors, values = lax_linalg.eigh(a, symmetrize_input=False)
        magnitudes = jnp.abs(values)
        tol = jnp.maximum(atol, rtol * jnp.max(magnitudes, axis=-1, keepdims=True))
        inverse = _where_positive(magnitudes > tol, 1 / values).astype(a.dtype)
        return (vectors * inverse[..., None, :]) @ _mH(vectors)
    u, s, vh = lax_linalg.svd(a, full_matrices=False)
    tol = jnp.maximum(atol, rtol * s[..., :1])
    inverse = _where_positive(s > tol, 1 / s).astype(a.dtype)
    return (_mH(vh) * inverse[..., None, :]) @ _mH(u)


def _where_positive(keep, values):
    """``values`` where ``keep``, else 0; lax.select rather than jnp.where, which becomes a function of its own
    that shape refinement fails to specialise when its sizes are symbolic."""
    keep = jnp.broadcast_to(keep, values.shape)
    return lax.select(keep, values, lax.full_like(values, 0))


@lower(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(ctx, a, *, atol=None, rtol=None, hermitian=False):
    """Singular (or, ``hermitian``, eigen) values above max(atol, rtol * the largest) inverted; rtol
    defaults to eps * max(m, n), or 0 when a positive atol is given."""
    given = {name: value for name, value in (("atol", atol), ("rtol", rtol)) if value is not None}
    return _jax(ctx, _pinv, [a, *given.values()], [0, *given],
                **{name: "operand" if name in given else None for name in ("atol", "rtol")}, hermitian=hermitian)


@lower(aten.linalg_pinv.atol_rtol_float)
def linalg_pinv_float(ctx, a, *, atol=None, rtol=None, hermitian=False):
    return _jax(ctx, _pinv, [a], [0], atol=atol, rtol=rtol, hermitian=hermitian)
