"""The golden model zoo, its stored outputs and the checks against them.

Importing the package registers every zoo entry: the float models (``zoo``) and the quantized ones
(``quantized``, built on ``zoo``'s public names).
"""
from . import quantized, zoo  # noqa: F401  (each import registers its entries)
