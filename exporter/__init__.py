"""Public API: convert torch programs to StableHLO artifacts and load saved ones."""
from .api import export_to_stablehlo
from .artifact import StableHLOArtifact, load_artifact
from .divergence import Divergence, find_divergence
from .errors import (BundleError, BundleVersionError, ExportError, LoweringError, UnsupportedOpsError,
                     WeightsError)
from runtime.validation import InputError

__all__ = ["export_to_stablehlo", "load_artifact", "StableHLOArtifact", "find_divergence", "Divergence",
           "ExportError", "LoweringError", "UnsupportedOpsError", "InputError", "BundleError", "BundleVersionError",
           "WeightsError"]
