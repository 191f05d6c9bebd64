"""Public API: convert torch programs to StableHLO artifacts and load saved ones; ``scan_layers`` for deep stacks;
``export_generate`` for a language model's whole generate loop; ``export_engine`` for a continuous-batching
serving engine; ``auto_shardings``/``fsdp_shardings`` for sharding plans; ``lowering`` for your own ops' JAX
lowerings."""
import importlib
from typing import TYPE_CHECKING

from .api import export_to_stablehlo
from .formats.artifact import StableHLOArtifact
from .formats.engine_artifact import EngineArtifact
from .formats.loading import load_artifact
from .divergence import Divergence, find_divergence
from .formats.iree import compile_for_iree, iree_module
from .errors import (BundleError, BundleVersionError, ExportError, InputError, LoweringError, ShardingError,
                     UnsupportedOpsError, WeightsError)
from .scan_layers import scan_layers
from .extensions import composite, lowering, scoped_lowering
from .conversion.input_shardings import mark_sharding, tensor_parallel_shardings
from .autoshard.plan import ShardingPlan
from .plans import auto_shardings, fsdp_shardings
from torch_stablehlo.runtime.spmd import MeshError

if TYPE_CHECKING:  # what static tools see (at run time, __getattr__ below)
    from .engine.export_engine import export_engine
    from .generate import GenerateArtifact, export_generate

__all__ = ["export_to_stablehlo", "load_artifact", "StableHLOArtifact", "find_divergence", "Divergence",
           "scan_layers", "iree_module", "compile_for_iree", "mark_sharding", "tensor_parallel_shardings",
           "auto_shardings", "fsdp_shardings", "ShardingPlan", "ExportError", "LoweringError",
           "UnsupportedOpsError", "InputError", "BundleError", "BundleVersionError", "WeightsError",
           "ShardingError", "MeshError", "export_generate", "GenerateArtifact", "export_engine", "EngineArtifact",
           "lowering", "scoped_lowering", "composite"]
_NEEDS_TRANSFORMERS = {"export_generate": ".generate", "GenerateArtifact": ".generate",
                       "export_engine": ".engine.export_engine"}


def __getattr__(name: str):
    """``export_generate``, ``GenerateArtifact`` and ``export_engine``, imported on first use: they need
    transformers."""
    if name in _NEEDS_TRANSFORMERS:
        return getattr(importlib.import_module(_NEEDS_TRANSFORMERS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
