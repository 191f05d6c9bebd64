"""The golden model zoo, its stored outputs and the checks against them.

Importing the package registers every zoo entry: the float models (``zoo``), the quantized ones
(``quantized``, built on ``zoo``'s public names) and the control-flow ones (``control_flow``).
"""
from . import control_flow, quantized, zoo  # noqa: F401  (each import registers its entries)
