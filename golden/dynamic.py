"""Dynamic zoo variants: each model exported once with symbolic batch (and sequence) dims, run at several sizes.

    python -m torch_stablehlo.golden.dynamic                   # every model with a dynamic variant (zoo.DYNAMIC)
    python -m torch_stablehlo.golden.dynamic --only mlp bert   # some of them

For each model: build it at the variant's example size, ``torch.export.export`` it with the variant's
``Dim``s, convert once, then for every size of the variant build the inputs at that size (same seeded
weights), run the one artifact and compare with the model run by eager torch, at the zoo's tolerance
(max |error| / max |eager output|). Prints one PASS/FAIL line per model and size; exits non-zero on a failure.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from dataclasses import dataclass

import torch

from torch_stablehlo.exporter import export_to_stablehlo

from . import store, zoo

PASS, FAIL, ERROR = "PASS", "FAIL", "ERROR"


@dataclass
class SizeResult:
    name: str
    size: dict[str, int]
    status: str
    max_abs: float | None = None
    max_rel: float | None = None
    seconds: float | None = None  # refine + compile + run of this call
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == PASS

    def line(self, tolerance: float) -> str:
        size = ", ".join(f"{k}={v}" for k, v in self.size.items())
        if self.status == ERROR:
            return f"{self.status} {self.name} [{size}]: {self.error}"
        text = (f"{self.status} {self.name} [{size}]: max abs error {self.max_abs:.2e}, max rel error "
                f"{self.max_rel:.2e} (tolerance {tolerance:.0e}), {self.seconds:.1f}s")
        return text + (f"; {self.error}" if self.error else "")


def export_variant(name: str):
    """(built model at the example size, the artifact exported once with the variant's symbolic dims)."""
    variant = zoo.get(name).dynamic
    if variant is None:
        raise KeyError(f"zoo model {name!r} has no dynamic variant; known: {', '.join(zoo.DYNAMIC)}")
    built = zoo.get(name).build(**variant.example)
    program = zoo.fresh_export(built.model, built.args, built.kwargs, variant.dynamic_shapes(built))
    return built, export_to_stablehlo(program)


def check_size(name: str, model: torch.nn.Module, artifact, size: dict[str, int]) -> SizeResult:
    """Run ``artifact`` on the entry's inputs at ``size`` and compare with ``model`` in eager torch."""
    entry = zoo.get(name)
    try:
        inputs = entry.build(**size)
        with torch.no_grad():
            expected = model(*inputs.args, **inputs.kwargs)
        start = time.perf_counter()
        actual = artifact(*inputs.args, **inputs.kwargs)
        seconds = time.perf_counter() - start
        flat, _ = torch.utils._pytree.tree_flatten(actual)
        comparison = store.compare(flat, torch.utils._pytree.tree_flatten(expected)[0], entry.tolerance)
    except Exception as error:  # noqa: BLE001  (reported per size, the run goes on)
        return SizeResult(name, size, ERROR, error=f"{type(error).__name__}: {error}")
    return SizeResult(name, size, PASS if comparison.ok else FAIL, comparison.max_abs, comparison.max_rel, seconds,
                      "; ".join(comparison.problems) or None)


def verify_variant(name: str, *, report=None) -> list[SizeResult]:
    """Export ``name``'s dynamic variant once and check it at each of its sizes."""
    variant = zoo.get(name).dynamic
    try:
        built, artifact = export_variant(name)
    except Exception as error:  # noqa: BLE001
        result = SizeResult(name, variant.example if variant else {}, ERROR,
                            error=f"exporting: {type(error).__name__}: {error}\n{traceback.format_exc()}")
        if report:
            report(result)
        return [result]
    results = []
    for size in variant.sizes:
        results.append(check_size(name, built.model, artifact, size))
        if report:
            report(results[-1])
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_stablehlo.golden.dynamic", description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", action="extend", metavar="NAME", choices=list(zoo.DYNAMIC),
                        help="check only these models")
    options = parser.parse_args(argv)
    results = []
    for name in options.only or list(zoo.DYNAMIC):
        variant = zoo.get(name).dynamic
        ranges = ", ".join(f"{zoo.DynamicVariant.DIM_NAMES.get(p, p)} in [{lo}, {hi}]"
                           for p, (lo, hi) in variant.ranges.items())
        print(f"{name}: {ranges}", flush=True)
        results += verify_variant(name, report=lambda r: print("  " + r.line(zoo.get(r.name).tolerance), flush=True))
    failed = sorted({r.name for r in results if not r.ok})
    print(f"{sum(r.ok for r in results)}/{len(results)} model sizes passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
