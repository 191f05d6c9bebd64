"""torch dtypes and MLIR element types: one table (``stablehlo_ir.dtypes.ELEMENT_TYPES``) read both ways."""
import pytest
import torch
from jaxlib.mlir import ir

from torch_stablehlo.aten_lowerings.mlir_types import element_type, is_unsigned, torch_dtype
from torch_stablehlo.stablehlo_ir.dtypes import CARRIED, ELEMENT_TYPES
from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.specs import DTYPES_BY_NAME


@pytest.mark.parametrize("dtype", list(ELEMENT_TYPES), ids=str)
def test_an_element_type_reads_back_as_its_dtype(dtype):
    with make_context(), ir.Location.unknown():
        element = ir.RankedTensorType.get([2], element_type(dtype)).element_type
        assert str(element) == ELEMENT_TYPES[dtype]
        assert torch_dtype(element) == CARRIED.get(dtype, dtype)
        assert torch_dtype(element) == torch_dtype(element)  # again, from the float classes learned


def test_types_outside_the_table_are_refused():
    with make_context(), ir.Location.unknown():
        for element in (ir.IntegerType.get_signed(8), ir.Float8E4M3FNType.get()):
            with pytest.raises(TypeError, match="no torch dtype"):
                torch_dtype(element)
    with pytest.raises(TypeError, match="no StableHLO element type"):
        element_type(torch.float8_e4m3fn)


def test_specs_name_every_dtype_of_the_table():
    assert set(DTYPES_BY_NAME.values()) == set(ELEMENT_TYPES)
    assert [d for d in ELEMENT_TYPES if is_unsigned(d)] == [torch.uint8, torch.uint16, torch.uint32, torch.uint64]
