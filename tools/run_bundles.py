"""Run saved bundles in this (fresh) process: the "load in a new process" leg of ``tools.serving``.

    python -m torch_stablehlo.tools.run_bundles FOLDER [FOLDER ...]
    python -m torch_stablehlo.tools.run_bundles < folders.txt      # one folder a line, each run as soon as it is read

Each FOLDER holds ``bundle/`` and ``inputs.npz`` (one array per tensor input, named as in
the bundle's signature); this loads the bundle, runs it and writes ``bundle_outputs.npz``
(by signature name), or ``bundle_error.txt`` if that fails. One process for all the bundles
pays Python's, torch's and jax's start-up once; reading folders from stdin lets it start
before the first bundle is written.
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

from .npz import run_npz

BUNDLE, INPUTS, OUTPUTS, ERROR = "bundle", "inputs.npz", "bundle_outputs.npz", "bundle_error.txt"


def main(argv: list[str] | None = None) -> int:
    failed = 0
    argv = sys.argv[1:] if argv is None else argv
    for folder in map(Path, argv or (line.strip() for line in sys.stdin if line.strip())):
        try:
            run_npz(folder / BUNDLE, folder / INPUTS, folder / OUTPUTS)
        except Exception:  # noqa: BLE001  (recorded per bundle; the others still run)
            (folder / ERROR).write_text(traceback.format_exc())
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
