"""Code that differs between the platforms a module is lowered for: a ``stablehlo.case`` on ``@main``'s platform
index (``stablehlo_ir.platforms``) with one branch per platform, in the module's order, as ``jax.export`` lowers a
primitive whose rules differ. The graph walker emits one where a user's lowering differs between the platforms;
``call_jax`` where JAX lowers a function differently for them."""
from __future__ import annotations

from typing import Callable, Sequence

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from ..values import enclosing_function


def per_platform(ctx, result_types: Sequence[ir.Type], branches: dict[str, Callable]) -> list[ir.Value]:
    """The results of ``branches[platform](ctx.on_platform(platform))`` (a value or a list of them, of
    ``result_types``) for the platform the module runs on: one branch per platform of ``ctx.platforms``, each
    emitted in its own scope of sizes. Raises ValueError where ``@main``'s platform index cannot be read (in a
    private function: a composite's decomposition)."""
    index = ctx.platform_index
    if index is None or enclosing_function() != ir.BlockArgument(index).owner.owner.operation:
        raise ValueError(f"its lowering differs between the platforms {', '.join(ctx.platforms)}, but it is called in a "
                         "function that cannot read @main's platform index (a composite's decomposition): register "
                         "one lowering for every platform, or export for one platform")
    case = stablehlo.CaseOp(list(result_types), index, len(ctx.platforms))
    for region, platform in zip(case.regions, ctx.platforms):
        with ir.InsertionPoint(region.blocks.append()), ctx.dims.scope():
            results = branches[platform](ctx.on_platform(platform))
            stablehlo.return_([results] if isinstance(results, ir.Value) else list(results))
    return list(case.results)
