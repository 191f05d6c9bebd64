"""Elementwise families: arithmetic, comparisons and bit-level functions; activations; torch.special's functions,
Bessel functions and orthogonal polynomials."""
from . import activations, arithmetic, bessel, polynomials, special_functions  # noqa: F401  (register their rules)
