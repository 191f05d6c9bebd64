"""Public API: convert torch programs to StableHLO artifacts and load saved ones; ``scan_layers`` for deep stacks."""
from .api import export_to_stablehlo
from .artifact import StableHLOArtifact, load_artifact
from .divergence import Divergence, find_divergence
from .errors import (BundleError, BundleVersionError, ExportError, LoweringError, UnsupportedOpsError,
                     WeightsError)
from .scan_layers import scan_layers
from runtime.validation import InputError

__all__ = ["export_to_stablehlo", "load_artifact", "StableHLOArtifact", "find_divergence", "Divergence",
           "scan_layers", "ExportError", "LoweringError", "UnsupportedOpsError", "InputError", "BundleError",
           "BundleVersionError", "WeightsError"]
