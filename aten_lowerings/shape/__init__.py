"""Shape and data-movement families: views and shape ops, indexing, flat and strided scatters, padding, tensor
creation, and scalars (``.item()``, sizes, SymInt arithmetic)."""
from . import creation, indexing, padding, scalars, scatter, views  # noqa: F401  (register their rules)
