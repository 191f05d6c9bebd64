"""The module handed to XLA outside our runtime (TF's XlaCallModule, ``jax.export``).

Both take ``@main`` as it is: one public function, no tokens, the weights first
(after the platform index where it is lowered for several platforms, which both
pass themselves for the platform they run on: XlaCallModule's ``platforms=``,
``Exported.platforms``). That is calling convention 9 (``jax.export`` reads
9 and 10, TensorFlow 2.21's XlaCallModule up to 10; 10 only adds Shardy shardings,
which a single-device module does not use; a partitioned one is 10).
"""
from __future__ import annotations

from jaxlib.mlir import ir

from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.passes import portable_artifact, prepare_for_xla, run_pipeline
from torch_stablehlo.stablehlo_ir.platforms import cases_as_ifs

from ..conversion.signature import Signature
from .versions import resolve_target_version

SEED_INPUT = "seed"
"""The handoffs' name for ``@main``'s ``rng_seed`` argument (an int64 scalar), where the program draws random numbers:
the SavedModel's seeded signature and ``to_jax``'s models take it as an input of that name."""
CALLING_CONVENTION_VERSION = 9
SHARDY_CALLING_CONVENTION_VERSION = 10  # a module partitioned over a mesh (sdy.mesh, sdy.sharding)
# tells XlaCallModule (and jax) to refine the module's symbolic shapes from the actual inputs
SHAPE_POLYMORPHISM_ATTR = "jax.uses_shape_polymorphism"
# their refinement (stablehlo-refine-shapes) refines called functions but not a composite's decomposition
COMPOSITES_TO_CALLS = "builtin.module(func.func(stablehlo-legalize-composite-to-call))"


def check_seed_input(signature: Signature) -> None:
    """Raises ValueError where a program that draws random numbers has an input named ``SEED_INPUT`` already."""
    if signature.takes_rng_seed and any(slot.name == SEED_INPUT for slot in signature.user_inputs):
        raise ValueError(f"the program draws random numbers and has an input named '{SEED_INPUT}', the name the "
                         "SavedModel and JAX handoffs give its seed; rename that input of forward")


def xla_module_bytes(stablehlo_text: str, signature: Signature, platforms, target_version: str) -> bytes:
    """A portable artifact of the module as XLA compiles it for ``platforms`` (one platform's own forms only where
    it is the only one), marked for shape refinement if it has symbolic dims (composites then become calls of
    their decompositions, and per-platform cases chains of ifs, which that refinement handles:
    ``stablehlo_ir.platforms.cases_as_ifs``)."""
    text = prepare_for_xla(stablehlo_text, platform=platforms[0] if len(platforms) == 1 else None)
    if signature.is_dynamic:
        with make_context():
            module = cases_as_ifs(run_pipeline(ir.Module.parse(text), COMPOSITES_TO_CALLS))
            module.operation.attributes[SHAPE_POLYMORPHISM_ATTR] = ir.BoolAttr.get(True)
            text = module.operation.get_asm(enable_debug_info=True)
    return portable_artifact(text, resolve_target_version(target_version))
