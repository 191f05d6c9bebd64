"""StableHLO pass pipelines run on copies of a module (the artifact's text is never changed)."""
from __future__ import annotations

from functools import lru_cache

from jaxlib import _jax
from jaxlib.mlir import ir, passmanager
from jaxlib.mlir.dialects import stablehlo

from .mlir_context import make_context
from .cache_reads import might_read_written, rewrite_cache_reads
from .int8_products import has_int8_products, rewrite_int8_product
from .rewrites import expand_explicit_broadcasts, ops_where, sign_quant_storage

# chlo ops (erf, ...) have no VHLO form, so stablehlo's serializer rejects them: expand them into StableHLO first.
LEGALIZE_CHLO = "builtin.module(func.func(chlo-legalize-to-stablehlo))"
# With dynamic shapes that expansion computes shapes in the shape dialect (shape_of, index casts), which no
# portable artifact may hold: those become StableHLO shape arithmetic (get_dimension_size, concatenate).
LEGALIZE_SHAPES = "builtin.module(func.func(shape-legalize-to-stablehlo),canonicalize)"
# quant types (which PJRT refuses) as integer and float math; it emits chlo broadcasts
LEGALIZE_QUANT = "builtin.module(func.func(stablehlo-legalize-quant-to-math))"
# what prepare_for_xla does to a module, named in the compile cache's key: change it with the rewrites
XLA_PREPARATION = ("quant types legalized; on CPU, int8 products padded or split into digits, uint8 rows as int8 "
                   "(int8_products v2), reads of tensors written in place as stored (cache_reads v2)")


@lru_cache(maxsize=None)
def _register_passes() -> None:
    stablehlo.register_stablehlo_passes()


def run_pipeline(module: ir.Module, pipeline: str) -> ir.Module:
    _register_passes()
    with module.context:
        passmanager.PassManager.parse(pipeline).run(module.operation)
    return module


def portable_artifact(mlir_text: str, target_version: str) -> bytes:
    """Serialize a module as a versioned StableHLO portable artifact, chlo expanded into StableHLO (with dynamic
    shapes, the shape computations that expansion emits too). Should some op still be outside StableHLO, the
    module is serialized with its chlo ops kept, as jax.export does (chlo passes through, unversioned); so is
    a module partitioned over a mesh, its Shardy ops and attributes kept as they are (jax.export's "mixed"
    serialization: ``sdy`` passes through too)."""
    with make_context():
        module = run_pipeline(ir.Module.parse(mlir_text), LEGALIZE_CHLO)
        if _foreign_ops(module):
            run_pipeline(module, LEGALIZE_SHAPES)
        foreign = _foreign_ops(module)
        if not foreign:
            return stablehlo.serialize_portable_artifact(module, target_version)
    sharded = any(name.startswith("sdy.") for name in foreign)
    return _jax.mlir.serialize_portable_artifact(mlir_text, target_version, sharded)


_PORTABLE_DIALECTS = ("builtin.", "func.", "stablehlo.", "chlo.", "quant.")


def _foreign_ops(module: ir.Module) -> list[str]:
    """Names of the ops of ``module`` from dialects a portable artifact cannot hold (shape, tensor, arith)."""
    return [op.name for op in ops_where(module, lambda op: not op.name.startswith(_PORTABLE_DIALECTS))]


def prepare_for_xla(mlir_text: str, refine=None, platform: str | None = "cpu") -> str:
    """The module as XLA compiles it for ``platform`` (None: for several): quant types legalized to integer math
    and, on CPU only, int8 products in the forms XLA's CPU backend runs fast at decode shapes
    (``int8_products``) and reads of tensors written in place in the forms it does not copy (``cache_reads``); a
    copy, the input is unchanged.

    ``refine`` (text -> text, e.g. ``?`` dims specialised to one call's shapes) runs first, or, with quant types,
    between their legalization and the expansion of the broadcasts it leaves: shape refinement crashes on a
    ``dot_general`` of quant types with a dynamic dim, and the expanded broadcasts need static shapes.
    Returns ``mlir_text`` itself when it has no quant types, nothing to rewrite and nothing to refine (no
    parsing, no passes).
    """
    quantized = "!quant." in mlir_text
    cpu = platform == "cpu" and (has_int8_products(mlir_text) or might_read_written(mlir_text))
    if not quantized and not cpu:
        return mlir_text if refine is None else refine(mlir_text)
    source = mlir_text if quantized or refine is None else refine(mlir_text)
    with make_context():
        module = ir.Module.parse(source)
        if quantized:
            sign_quant_storage(module)
            run_pipeline(module, LEGALIZE_QUANT)
            if refine is not None:
                module = ir.Module.parse(refine(module.operation.get_asm(enable_debug_info=True)))
            expand_explicit_broadcasts(module)
            run_pipeline(module, LEGALIZE_CHLO)
        rewritten = platform == "cpu" and _cpu_forms(module) > 0
        return module.operation.get_asm(enable_debug_info=True) if quantized or rewritten else source


def _cpu_forms(module: ir.Module) -> int:
    """Rewrite, in place, what XLA's CPU backend runs slowly: reads of tensors written in place (``cache_reads``)
    and int8 products at decode shapes (``int8_products``); how many were."""
    with module.context, ir.Location.unknown():
        count = rewrite_cache_reads(module)
        products = ops_where(module, lambda op: op.name == "stablehlo.dot_general")
        return count + sum(rewrite_int8_product(op) for op in products)
