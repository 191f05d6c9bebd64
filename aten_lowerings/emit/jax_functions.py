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
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import torch
from jax import export as jax_export
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from torch_stablehlo.stablehlo_ir.functions import move_functions

from ..values import dtype_of, enclosing_module, value_type
from .platform_case import per_platform


def call_jax(ctx, function: Callable, operands: Sequence[ir.Value], sizes: Sequence[Sequence] | None = None,
             *, name: str | None = None, platform: str | None = None, **static) -> list[ir.Value]:
    """Results of ``function(*operands, **static)`` as JAX computes it. ``sizes`` (torch sizes, one list per
    operand) are needed when an operand has a dynamic dim: equal symbolic sizes become one JAX variable, and a
    ``torch.SymInt`` among the ``static`` values (or in a tuple of them) becomes the JAX dimension of the operand
    dim of that size. ``name`` (default: the function's) names the private function. JAX lowers it for
    ``platform``, else for each platform the code runs on (``ctx.platforms``; none: JAX's default backend):
    where those lowerings differ, each platform's is called in its branch of a ``stablehlo.case``
    (``emit.platform_case``)."""
    symbols: dict = {}
    specs = tuple(_spec(value, None if sizes is None else sizes[i], symbols) for i, value in enumerate(operands))
    static = tuple(sorted((key, _dims_as_variables(value, symbols)) for key, value in static.items()))
    stem = (name or getattr(function, "__name__", "fn")).strip("_<>")
    platforms = (platform,) if platform else ctx.platforms or (None,)
    names = {p: _imported(_lowered(function, specs, static, p), stem, symbols) for p in platforms}
    if len(set(names.values())) == 1:
        return _called(ctx, names[platforms[0]], symbols, operands)
    types = _function_type(names[platforms[0]]).results
    return per_platform(ctx, types, {p: lambda branch, n=n: _called(branch, n, symbols, operands)
                                     for p, n in names.items()})


def _imported(text: str, stem: str, symbols: dict) -> str:
    """The name of the private function of the enclosing module that holds ``text`` (imported if new)."""
    # one function per text and symbolic sizes: shape refinement specialises a function once, so two calls
    # with different sizes (same ``?`` types) need two copies
    key = text + repr(sorted((variable, str(size.node.expr)) for variable, size in symbols.items()))
    name = f"jax_{stem}_{hashlib.sha1(key.encode()).hexdigest()[:10]}"
    module = enclosing_module()
    if name not in ir.SymbolTable(module):
        _DIM_VARIABLES[name] = _import_functions(text, name, module.regions[0].blocks[0])
    return name


def _function_type(name: str) -> ir.FunctionType:
    main = ir.SymbolTable(enclosing_module())[name]
    return ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)


def _called(ctx, name: str, symbols: dict, operands: Sequence[ir.Value]) -> list[ir.Value]:
    """The results of a ``func.call`` of the imported function ``name``, its dimension variables read first."""
    dim_values = [ctx.size_value(symbols[variable]) for variable in _DIM_VARIABLES[name]]
    call = func.CallOp(_function_type(name).results, ir.FlatSymbolRefAttr.get(name), [*dim_values, *operands])
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


class DimVariable(NamedTuple):
    """A static argument standing for a JAX dimension variable (a ``torch.SymInt`` given to ``call_jax``)."""
    name: str


def _dims_as_variables(value, symbols: dict):
    """``value`` (or a tuple's items) with each ``torch.SymInt`` replaced by the ``DimVariable`` of the operand
    dim of that size."""
    if isinstance(value, tuple):
        return tuple(_dims_as_variables(item, symbols) for item in value)
    if not isinstance(value, torch.SymInt):
        return value
    expr = str(value.node.expr)
    variable = next((name for name, size in symbols.items() if str(size.node.expr) == expr), None)
    if variable is None:
        raise NotImplementedError(f"the symbolic size {expr} is no dim of a tensor operand: a JAX function can take "
                                  "a symbolic size only as the size of one of its tensor arguments")
    return DimVariable(variable)


_SCOPE = jax_export.SymbolicScope()


def _jax_value(value):
    """A static argument as the JAX function takes it: a ``DimVariable`` as JAX's symbolic dimension."""
    if isinstance(value, DimVariable):
        return jax_export.symbolic_shape(value.name, scope=_SCOPE)[0]
    if isinstance(value, tuple):
        return tuple(_jax_value(item) for item in value)
    return value


@lru_cache(maxsize=256)
def _lowered(function: Callable, specs: tuple, static: tuple, platform: str | None = None) -> str:
    """StableHLO text of ``function`` for these operand specs (x64 enabled, scoped, so 64-bit types stay)."""
    with jax.enable_x64(True):
        args = []
        for dims, dtype in specs:
            if any(isinstance(d, str) for d in dims):
                dims = jax_export.symbolic_shape(", ".join(str(d) for d in dims), scope=_SCOPE)
            args.append(jax.ShapeDtypeStruct(tuple(dims), jnp.dtype(dtype)))
        static_values = {key: _jax_value(value) for key, value in static}
        traced = jax.jit(lambda *xs: function(*xs, **static_values), keep_unused=True).trace(*args)
        lowered = traced.lower(lowering_platforms=(platform,)) if platform else traced.lower()
        return _without_sharding_rules(lowered.compiler_ir("stablehlo"))


def _without_sharding_rules(module: ir.Module) -> str:
    """The text of a copy of ``module`` without the Shardy rules (``sdy.sharding_rule``) JAX puts on custom
    calls (LAPACK factorizations): our context does not load that dialect, and one device needs no sharding.
    The copy is a module of its own (parsed from the text, not cloned to wherever an insertion point is active),
    so its text names values alike whatever is being built: the same function lowered for two platforms is
    one text."""
    copy = ir.Module.parse(module.operation.get_asm(), context=module.context)

    def strip(op):
        if "sdy.sharding_rule" in op.attributes:
            del op.attributes["sdy.sharding_rule"]
        return ir.WalkResult.ADVANCE

    copy.operation.walk(strip)
    return copy.operation.get_asm()


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
