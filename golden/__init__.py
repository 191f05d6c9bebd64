"""The golden model zoo, its stored outputs and the checks against them.

Importing the package registers every zoo entry: the float models (``zoo``), the quantized ones
(``quantized_zoo``, built on ``zoo``'s public names) and the control-flow ones (``control_flow_zoo``).
"""
from . import control_flow_zoo, quantized_zoo, zoo  # noqa: F401  (each import registers its entries)
