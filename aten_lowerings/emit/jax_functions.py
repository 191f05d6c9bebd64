"""JAX's implementation of a function, called by a rule instead of writing the numerics again.

JAX lowers the function to StableHLO for the operands' types; the functions of that module are copied into
ours as private functions (named after the function and a hash of its text, so a second node with the same
types reuses them) and called with ``func.call``. Dynamic dims become JAX dimension variables, whose values
JAX's ``@main`` takes as leading ``tensor<i64>`` arguments: we pass the sizes bound from our inputs.

This is how special functions (Bessel, incomplete gamma, ...) and matrix factorizations get JAX's tested
implementations: the elementwise ones are plain StableHLO; the factorizations are JAX's CPU lowerings, which
call LAPACK through ``stablehlo.custom_call`` targets that jaxlib's CPU runtime provides (JAX's
serialization guarantees their stability), so such a program runs on CPU.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import export as jax_export
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from torch_stablehlo.stablehlo_ir.functions import move_functions

from ..values import dtype_of, enclosing_module, value_type


def call_jax(ctx, function: Callable, operands: Sequence[ir.Value], sizes: Sequence[Sequence] | None = None,
             **static) -> list[ir.Value]:
    """Results of ``function(*operands, **static)`` as JAX computes it. ``sizes`` (torch sizes, one list per
    operand) are needed when an operand has a dynamic dim: equal symbolic sizes become one JAX variable."""
    symbols: dict = {}
    specs = tuple(_spec(value, None if sizes is None else sizes[i], symbols) for i, value in enumerate(operands))
    text = _lowered(function, specs, tuple(sorted(static.items())))
    # one function per text and symbolic sizes: shape refinement specialises a function once, so two calls
    # with different sizes (same ``?`` types) need two copies
    key = text + repr(sorted((variable, str(size.node.expr)) for variable, size in symbols.items()))
    name = f"jax_{getattr(function, '__name__', 'fn').strip('_<>')}_{hashlib.sha1(key.encode()).hexdigest()[:10]}"
    module = enclosing_module()
    if name not in ir.SymbolTable(module):
        _DIM_VARIABLES[name] = _import_functions(text, name, module.regions[0].blocks[0])
    main = ir.SymbolTable(module)[name]
    dim_values = [ctx.size_value(symbols[variable]) for variable in _DIM_VARIABLES[name]]
    result_types = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).results
    call = func.CallOp(result_types, ir.FlatSymbolRefAttr.get(name), [*dim_values, *operands])
    return list(call.results)


_DIM_VARIABLES: dict[str, list[str]] = {}
"""Per imported function (its name hashes its text): the JAX dimension variables its leading arguments take."""


def _spec(value: ir.Value, sizes, symbols: dict) -> tuple:
    """(dims, numpy dtype name), a dynamic dim as a JAX variable name; ``symbols`` maps names to torch sizes."""
    dims = []
    for dim, static_size in enumerate(value_type(value).shape):
        if not ir.ShapedType.is_dynamic_size(static_size):
            dims.append(static_size)
            continue
        if sizes is None:
            raise NotImplementedError("call_jax needs the torch sizes of operands with dynamic dims")
        expr = str(sizes[dim].node.expr)
        name = next((n for n, s in symbols.items() if str(s.node.expr) == expr), f"d{len(symbols)}")
        symbols[name] = sizes[dim]
        dims.append(name)
    return tuple(dims), str(dtype_of(value)).removeprefix("torch.")


_SCOPE = jax_export.SymbolicScope()


@lru_cache(maxsize=256)
def _lowered(function: Callable, specs: tuple, static: tuple) -> str:
    """StableHLO text of ``function`` for these operand specs (x64 enabled, scoped, so 64-bit types stay)."""
    with jax.enable_x64(True):
        args = []
        for dims, dtype in specs:
            if any(isinstance(d, str) for d in dims):
                dims = jax_export.symbolic_shape(", ".join(str(d) for d in dims), scope=_SCOPE)
            args.append(jax.ShapeDtypeStruct(tuple(dims), jnp.dtype(dtype)))
        lowered = jax.jit(lambda *xs: function(*xs, **dict(static)), keep_unused=True).lower(*args)
        return _without_sharding_rules(lowered.compiler_ir("stablehlo"))


def _without_sharding_rules(module: ir.Module) -> str:
    """The text of a copy of ``module`` without the Shardy rules (``sdy.sharding_rule``) JAX puts on custom
    calls (LAPACK factorizations): our context does not load that dialect, and one device needs no sharding."""
    copy = module.operation.clone()

    def strip(op):
        if "sdy.sharding_rule" in op.attributes:
            del op.attributes["sdy.sharding_rule"]
        return ir.WalkResult.ADVANCE

    copy.walk(strip)
    text = copy.get_asm()
    copy.erase()
    return text


def _import_functions(text: str, main_name: str, body: ir.Block) -> list[str]:
    """Copy the functions of ``text`` to the module ``body`` (see ``stablehlo_ir.functions.move_functions``).
    Returns the dimension variables ``@main``'s leading arguments stand for."""
    main = move_functions(ir.Module.parse(text), main_name, body)
    variables = _dim_variables(main)
    for attribute in ("arg_attrs", "res_attrs"):  # jax.global_constant, jax.result_info: JAX's bookkeeping
        if attribute in main.attributes:
            del main.attributes[attribute]
    return variables


def _dim_variables(main) -> list[str]:
    if "arg_attrs" not in main.attributes:
        return []
    attrs = [ir.DictAttr(a) for a in ir.ArrayAttr(main.attributes["arg_attrs"])]
    return [ir.StringAttr(a["jax.global_constant"]).value for a in attrs if "jax.global_constant" in a]
