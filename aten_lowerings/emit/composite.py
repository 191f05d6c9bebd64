"""``stablehlo.composite``: an op a backend may match by its name and attributes, whose decomposition (a private
function of the module) anything else runs. Our attention and the user's composites (``exporter.composite``)
emit theirs here."""
from __future__ import annotations

import hashlib
import re

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from .padded import PaddedDims
from ..values import enclosing_module, value_type


def composite(ctx, name: str, operands, metas, attributes: dict, result_types, body, version: int = 0):
    """``stablehlo.composite`` named ``name`` (``attributes``: name -> ``ir.Attribute``) whose decomposition is a
    private function of the module; ``body(body_ctx, *arguments)`` emits it and returns its results (``metas``:
    the operands' torch values, whose symbolic sizes ``body_ctx`` reads from the function's arguments). A
    function the module already has with the same ops (every layer of a transformer) is used instead of a copy."""
    module = enclosing_module()
    stem = re.sub(r"\W", "_", name) + _sizes_tag(ctx, operands)
    function = func.FuncOp(stem, ([v.type for v in operands], result_types),
                           visibility="private", ip=ir.InsertionPoint(module.regions[0].blocks[0]))
    symbol = ir.SymbolTable(module).insert(function.operation).value
    block = function.add_entry_block()
    body_ctx = ctx.with_dims(_argument_dims(block.arguments, metas))
    with ir.InsertionPoint(block):
        func.ReturnOp(body(body_ctx, *block.arguments))
    text = _ops_text(function)
    twin = next((f for f in module.regions[0].blocks[0].operations if isinstance(f, func.FuncOp)
                 and f.sym_name.value != symbol and f.visibility.value == "private" and f.type == function.type
                 and re.fullmatch(re.escape(stem) + r"(_\d+)?", f.sym_name.value) and _ops_text(f) == text), None)
    if twin is not None:
        function.operation.erase()
        symbol = twin.sym_name.value
    return stablehlo.composite(result_types, operands, name, ir.FlatSymbolRefAttr.get(symbol), 0,
                               composite_attributes=attributes, version=version)


def _argument_dims(arguments, metas) -> PaddedDims:
    """Sizes inside a decomposition function, which cannot see the graph's inputs: each symbolic size is read
    from a dim of the function's arguments that has it."""
    dims = PaddedDims()
    for value, meta in zip(arguments, metas):
        dims.bind_input(value, meta.shape)
    return dims


def _sizes_tag(ctx, operands) -> str:
    """A suffix naming the operands' symbolic sizes (none where every size is static). Functions are shared only
    between calls with the same tag: two ``?`` dims print alike but may be different sizes (an encoder's and a
    decoder's lengths), and shape refinement specialises a function once."""
    if all(value_type(v).has_static_shape for v in operands):
        return ""
    sizes = repr([ctx.dims.sizes_of(v) for v in operands])
    return "_" + hashlib.sha1(sizes.encode()).hexdigest()[:8]


def _ops_text(function: func.FuncOp) -> str:
    """A function's signature and ops, without its name or locations."""
    text = function.operation.get_asm(enable_debug_info=False, use_local_scope=True)
    return text.replace(function.sym_name.value, "", 1)
