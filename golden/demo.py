"""``make demo``: GPT-2 (12 layers, random weights) to StableHLO and back, checked against its golden; then an LLM's
whole generate loop as one program.

    python -m torch_stablehlo.golden.demo [--out DIR] [--model NAME] [--no-llm]

Exports the ``gpt2_12layer`` zoo model (or ``--model``'s), saves the artifact (to ``--out``, else a
temporary folder), loads it back, runs it on jaxlib's CPU PJRT client and compares
its logits with the stored eager golden. Then (unless ``--no-llm``) a small decoder through ``export_generate``,
saved and loaded back, generating the same tokens as transformers' ``generate`` (``generate_demo``), with its
tokens/s beside eager's. Exits non-zero if anything does not match.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from torch_stablehlo.exporter.terminal import quiet_third_party_logs

from . import store, zoo
from .generate_demo import run_generate_demo
from .verify import render, verify_one

DEMO_MODEL = "gpt2_12layer"


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_stablehlo.golden.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="save the artifact to this folder, kept (default: a temporary one); "
                                                 "an existing folder is replaced only if it holds an artifact")
    parser.add_argument("--model", default=DEMO_MODEL, choices=zoo.names(),
                        help=f"the zoo model to take through (default: {DEMO_MODEL})")
    parser.add_argument("--no-llm", action="store_true", help="leave out the export_generate part")
    parser.add_argument("--traceback", action="store_true", help="print the traceback of an error")
    parser.add_argument("--verbose", action="store_true", help="let third-party libraries log (PJRT, torchao, ...)")
    options = parser.parse_args(argv)
    if not options.verbose:
        quiet_third_party_logs()

    name = options.model
    entry = zoo.get(name)
    golden = store.load_golden(name)
    print(f"{name}: {entry.description}")
    shapes = [*(f"arg{i}{list(v.shape)}" for i, v in enumerate(golden.args) if hasattr(v, "shape")),
              *(f"{k}{list(v.shape)}" for k, v in golden.kwargs.items() if hasattr(v, "shape"))]
    print("inputs: " + ", ".join(shapes))
    print("export -> StableHLO -> save -> load -> run on the CPU PJRT client ...", flush=True)

    temporary = options.out is None
    out = Path(tempfile.mkdtemp(prefix="golden-demo-")) / name if temporary else options.out
    try:
        result = verify_one(name, artifact_dir=out)
        render([result], title=f"{name}: StableHLO on PJRT vs eager torch")
        if result.artifact_dir is not None:
            where = " (temporary, removed on exit)" if temporary else ""
            print(f"artifact: {result.artifact_dir}, {_size(result.artifact_dir) / 1e6:.1f} MB{where}")
        if result.details and options.traceback:
            print(result.details, file=sys.stderr)
        ok = result.ok
        if not options.no_llm:
            print()
            ok = run_generate_demo(out.parent / "llm" if temporary else out.with_name(out.name + "_llm")) and ok
        print(f"demo: {result.status}" + ("" if options.no_llm else f"; generate: {'ok' if ok else 'FAIL'}"))
    finally:
        if temporary:
            shutil.rmtree(out.parent, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
