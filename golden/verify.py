"""Prove zoo models end to end against their stored goldens.

    python -m torch_stablehlo.golden.verify                    # every model
    python -m torch_stablehlo.golden.verify --only mlp cnn     # some of them

For each model: build it, ``torch.export.export`` it (timed on its own), convert the
ExportedProgram with ``export_to_stablehlo`` (the conversion time), save the artifact,
load it back, run it on PJRT with the stored inputs and compare with the stored
outputs. Exits non-zero if any model fails.
"""
from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from torch_stablehlo.exporter import export_to_stablehlo, load_artifact
from torch_stablehlo.stablehlo_ir.op_counts import count_ops

from . import store, zoo

PASS, FAIL, ERROR = "PASS", "FAIL", "ERROR"


@dataclass
class Result:
    name: str
    status: str                       # PASS | FAIL (numbers off) | ERROR (a stage raised)
    tolerance: float
    op_count: int | None = None
    export_s: float | None = None     # torch.export.export
    convert_s: float | None = None    # export_to_stablehlo(ExportedProgram)
    run_s: float | None = None        # first call of the loaded artifact (PJRT compile + run)
    max_abs: float | None = None
    max_rel: float | None = None      # max |error| / max |golden|, worst output
    abs_tolerance: float | None = None  # quantized models: bound on max_abs (one output quantization step)
    stage: str | None = None          # where an ERROR happened
    error: str | None = None          # its message (or what made a FAIL)
    details: str | None = None        # traceback of an ERROR
    artifact_dir: Path | None = None  # where the artifact was saved (when kept)

    @property
    def ok(self) -> bool:
        return self.status == PASS

    def summary(self) -> str:
        """One paragraph, e.g. for an assertion message."""
        if self.status == ERROR:
            return f"{self.name}: ERROR while {self.stage}: {self.error}"
        bound = (f"tolerance {self.abs_tolerance:.3e} absolute, one output quantization step"
                 if self.abs_tolerance is not None else f"tolerance {self.tolerance:.0e} of the output scale")
        text = (f"{self.name}: {self.status}: max abs error {self.max_abs:.3e}, max rel error "
                f"{self.max_rel:.3e} ({bound})")
        return text + (f"; {self.error}" if self.error else "")


def verify_one(name: str, *, artifact_dir: str | Path | None = None, built: zoo.Built | None = None) -> Result:
    """Export -> save -> load -> run -> compare for one zoo model.

    The artifact goes to ``artifact_dir`` (kept) or to a temporary folder (removed).
    ``built`` reuses a model already built by the entry's factory (its inputs are not
    used: the stored golden inputs are). Never raises for a model problem: the result
    says which stage failed and why.
    """
    entry = zoo.get(name)
    result = Result(name, ERROR, entry.tolerance)
    keep = artifact_dir is not None
    folder = Path(artifact_dir) if keep else Path(tempfile.mkdtemp(prefix=f"golden-{name}-"))
    stage = "loading the golden"
    try:
        golden = store.load_golden(name)
        stage = "building the model"
        built = built or entry.build()
        result.abs_tolerance = built.abs_tolerance
        stage = "running torch.export"
        start = time.perf_counter()
        program = zoo.fresh_export(built.model, golden.args, golden.kwargs)
        result.export_s = time.perf_counter() - start
        stage = "converting to StableHLO"
        start = time.perf_counter()
        artifact = export_to_stablehlo(program)
        result.convert_s = time.perf_counter() - start
        stage = "counting ops"
        result.op_count = count_ops(artifact.stablehlo_text)
        stage = "saving the artifact"
        saved = artifact.save(folder / name if not keep else folder)
        stage = "loading the artifact"
        loaded = load_artifact(saved)
        stage = "running on PJRT"
        start = time.perf_counter()
        outputs = loaded(*golden.args, **golden.kwargs)
        result.run_s = time.perf_counter() - start
        stage = "comparing"
        comparison = store.compare_outputs(outputs, golden, entry.tolerance, built.abs_tolerance)
        result.max_abs, result.max_rel = comparison.max_abs, comparison.max_rel
        result.status = PASS if comparison.ok else FAIL
        if comparison.problems:
            result.error = "; ".join(comparison.problems)
        elif not comparison.ok:
            result.error = "error above tolerance"
        result.artifact_dir = saved if keep else None
    except Exception as error:  # noqa: BLE001  (reported per model, the run goes on)
        result.status, result.stage = ERROR, stage
        result.error = f"{type(error).__name__}: {error}"
        result.details = traceback.format_exc()
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    return result


def verify(names: list[str] | None = None, *, progress=None) -> list[Result]:
    """``verify_one`` for each name (every zoo model by default), in order."""
    results = []
    for name in names or zoo.names():
        if progress:
            progress(name)
        results.append(verify_one(name))
    return results


# -- reporting --------------------------------------------------------------------------

COLUMNS = ("model", "ops", "torch.export", "convert", "compile+run", "max abs err", "max rel err", "tol", "result")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _sci(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.2e}"


def _tolerance(result: Result) -> str:
    """The relative tolerance, or the absolute one (quantized models) marked 'abs'."""
    if result.abs_tolerance is not None:
        return f"{result.abs_tolerance:.1e} abs"
    return f"{result.tolerance:.0e}"


def rows(results: list[Result]) -> list[tuple[str, ...]]:
    return [(r.name, "-" if r.op_count is None else str(r.op_count), _seconds(r.export_s), _seconds(r.convert_s),
             _seconds(r.run_s), _sci(r.max_abs), _sci(r.max_rel), _tolerance(r), r.status)
            for r in results]


def _error_lines(results: list[Result], limit: int = 12) -> list[str]:
    lines = []
    for r in results:
        if r.ok or not r.error:
            continue
        where = f" while {r.stage}" if r.stage else ""
        message = r.error.splitlines()
        shown = message[:limit] + ([f"  ... ({len(message) - limit} more lines)"] if len(message) > limit else [])
        lines.append(f"{r.name}: {r.status}{where}: " + "\n    ".join(shown))
    return lines


def _rich_console():
    try:
        from rich.console import Console
    except ImportError:
        return None
    console = Console()
    if not console.is_terminal:  # piped or captured: rich would wrap the table at 80 columns
        console = Console(width=140)
    return console


def render(results: list[Result], *, title: str = "golden models: StableHLO on PJRT vs eager torch",
           file=None) -> None:
    """Print the results table (with rich when it is installed) and the errors under it."""
    console = _rich_console() if file is None else None
    errors = _error_lines(results)
    if console is not None:
        from rich.table import Table

        table = Table(title=title)
        for column in COLUMNS:
            table.add_column(column, justify="left" if column == "model" else "right", no_wrap=True)
        style = {PASS: "green", FAIL: "red", ERROR: "red"}
        for result, row in zip(results, rows(results)):
            table.add_row(*row[:-1], f"[{style[result.status]}]{row[-1]}[/]")
        console.print(table)
        for line in errors:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    out = file or sys.stdout
    table = [COLUMNS] + rows(results)
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    print(title, file=out)
    for i, row in enumerate(table):
        print("  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths))),
              file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=out)
    for line in errors:
        print(line, file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_stablehlo.golden.verify", description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", action="extend", metavar="NAME", choices=zoo.names(),
                        help="verify only these models")
    parser.add_argument("--traceback", action="store_true", help="print the traceback of each ERROR")
    options = parser.parse_args(argv)
    results = verify(options.only, progress=lambda name: print(f"verifying {name} ...", file=sys.stderr, flush=True))
    render(results)
    if options.traceback:
        for result in results:
            if result.details:
                print(f"\n--- {result.name} ---\n{result.details}", file=sys.stderr)
    failed = [r.name for r in results if not r.ok]
    print(f"{len(results) - len(failed)}/{len(results)} passed" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
