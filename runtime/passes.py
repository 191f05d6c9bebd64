"""StableHLO pass pipelines run on copies of a module (the artifact's text is never changed)."""
from __future__ import annotations

from functools import lru_cache

from jaxlib.mlir import ir, passmanager
from jaxlib.mlir.dialects import stablehlo

from .mlir_context import make_context
from .rewrites import expand_explicit_broadcasts, sign_quant_storage

# chlo ops (erf, ...) have no portable (VHLO) form: expand them into StableHLO first.
LEGALIZE_CHLO = "builtin.module(func.func(chlo-legalize-to-stablehlo))"
# quant types (which PJRT refuses) as integer and float math; it emits chlo broadcasts
LEGALIZE_QUANT = "builtin.module(func.func(stablehlo-legalize-quant-to-math))"


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


def prepare_for_xla(mlir_text: str) -> str:
    """The module as XLA compiles it: quant types legalized to integer math (a copy; the input is unchanged).

    Returns ``mlir_text`` itself when it has no quant types (no parsing, no passes).
    """
    if "!quant." not in mlir_text:
        return mlir_text
    with make_context():
        module = ir.Module.parse(mlir_text)
        sign_quant_storage(module)
        run_pipeline(module, LEGALIZE_QUANT)
        expand_explicit_broadcasts(module)
        run_pipeline(module, LEGALIZE_CHLO)
        return module.operation.get_asm(enable_debug_info=True)
