"""StableHLO pass pipelines run on copies of a module (the artifact's text is never changed)."""
from __future__ import annotations

from functools import lru_cache

from jaxlib.mlir import ir, passmanager
from jaxlib.mlir.dialects import stablehlo

from .mlir_context import make_context

# chlo ops (erf, ...) have no portable (VHLO) form: expand them into StableHLO first.
LEGALIZE_CHLO = "builtin.module(func.func(chlo-legalize-to-stablehlo))"


@lru_cache(maxsize=None)
def _register_passes() -> None:
    stablehlo.register_stablehlo_passes()


def run_pipeline(module: ir.Module, pipeline: str) -> ir.Module:
    _register_passes()
    with module.context:
        passmanager.PassManager.parse(pipeline).run(module.operation)
    return module


def portable_artifact(mlir_text: str, target_version: str) -> bytes:
    """Serialize a module as a versioned StableHLO portable artifact (chlo expanded)."""
    with make_context():
        module = run_pipeline(ir.Module.parse(mlir_text), LEGALIZE_CHLO)
        return stablehlo.serialize_portable_artifact(module, target_version)
