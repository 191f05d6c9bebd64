"""Public API: convert torch programs to StableHLO artifacts and load saved ones."""
from .api import export_to_stablehlo
from .artifact import StableHLOArtifact, load_artifact
from .errors import (BundleError, BundleVersionError, ExportError, LoweringError, ShardingError,
                     UnsupportedOpsError, WeightsError)
from .sharding import mark_sharding, tensor_parallel_shardings
from runtime.spmd import MeshError
from runtime.validation import InputError

__all__ = ["export_to_stablehlo", "load_artifact", "StableHLOArtifact", "ExportError", "LoweringError",
           "UnsupportedOpsError", "InputError", "BundleError", "BundleVersionError", "WeightsError",
           "ShardingError", "MeshError", "mark_sharding", "tensor_parallel_shardings"]
