"""MLIR contexts with the dialects our modules use (func, stablehlo, chlo, quant, sdy for shardings)."""
from __future__ import annotations

from functools import lru_cache

from jaxlib.mlir import ir
from jaxlib.mlir._mlir_libs import _jax_mlir_ext
from jaxlib.mlir.dialects import chlo, sdy, stablehlo

# jaxlib's bindings do not register the quant dialect (``!quant.uniform`` types), but
# deserializing a portable artifact that uses a quant type loads it into the context.
_QUANT_PROBE = """
func.func @probe(%x: tensor<f32>) -> tensor<!quant.uniform<i8:f32, 1.0>> {
  %q = stablehlo.uniform_quantize %x : (tensor<f32>) -> tensor<!quant.uniform<i8:f32, 1.0>>
  return %q : tensor<!quant.uniform<i8:f32, 1.0>>
}"""


@lru_cache(maxsize=None)
def _quant_probe_artifact() -> bytes:
    return stablehlo.serialize_portable_artifact_str(_QUANT_PROBE, stablehlo.get_current_version())


def make_context() -> ir.Context:
    context = ir.Context()
    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    context.append_dialect_registry(registry)
    context.load_all_available_dialects()
    stablehlo.register_dialect(context)
    chlo.register_dialect(context)
    sdy.register_dialect(context)
    stablehlo.deserialize_portable_artifact(context, _quant_probe_artifact())  # loads the quant dialect
    return context
