"""Linear algebra families: matrix products and einsum, Cholesky factors, the factorizations and solvers borrowed
from JAX, and FFTs with complex numbers."""
from . import cholesky, fft, products, solvers  # noqa: F401  (register their rules)
