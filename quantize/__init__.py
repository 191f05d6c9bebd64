"""pt2e quantization as StableHLO ``!quant.uniform`` types: schemes read from torch's quantized_decomposed ops,
their MLIR types, fusion of quantized products, and the preparation of an ExportedProgram for lowering."""
from .fusion import FUSIBLE
from .preparation import QUANTIZED_OPS_FORMS, lowering_graph, prepare_quantized
from .schemes import CHOOSE_QPARAMS, DEQUANTIZE, QUANTIZE, QuantScheme, UnsupportedQuantizationError
from .torchao_weights import plain_quantized_weights

__all__ = ["QUANTIZED_OPS_FORMS", "QuantScheme", "UnsupportedQuantizationError", "lowering_graph",
           "plain_quantized_weights", "prepare_quantized", "quantized_lowerings"]


def quantized_lowerings() -> dict[str, str]:
    """Every op with a quantized lowering -> what it becomes (the coverage report's quantized column)."""
    forms = {op: "stablehlo.uniform_quantize; integer math when the scale is dynamic" for op in QUANTIZE}
    forms.update({op: "stablehlo.uniform_dequantize; integer math when the scale is dynamic" for op in DEQUANTIZE})
    forms.update({op: "integer math (scale and zero point computed at run time)" for op in CHOOSE_QPARAMS})
    forms.update({op: f"{fused.__name__}: {emits} on quantized operands, between dequantize and quantize"
                  for op, (fused, emits, _) in FUSIBLE.items()})
    return {str(op): form for op, form in forms.items()}
