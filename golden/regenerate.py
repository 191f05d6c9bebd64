"""Run each zoo model in eager torch and store its inputs and outputs in ``golden/data``.

    python -m torch_stablehlo.golden.regenerate                 # every model
    python -m torch_stablehlo.golden.regenerate --only cnn bert # some of them (others stay as they are)

Only torch (and transformers) is needed; nothing is exported here. Weights are not
stored: they come from the seed, and the manifest keeps their sha256 so a later
rebuild can tell whether it still produces the same weights.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

from . import store, zoo


def _versions() -> dict:
    try:
        import transformers
        transformers_version = transformers.__version__
    except ImportError:
        transformers_version = None
    return {"torch_version": torch.__version__, "transformers_version": transformers_version,
            "python_version": platform.python_version()}


def run_eager(built: zoo.Built):
    with torch.no_grad():
        return built.model(*built.args, **built.kwargs)


def regenerate(names: list[str] | None = None, data_dir: Path = store.DATA_DIR, log=print) -> dict:
    names = list(names or zoo.names())
    for name in names:
        zoo.get(name)  # unknown names fail before anything is written
    manifest = store.read_manifest(data_dir)
    manifest.update({"format": store.FORMAT, "seed": zoo.SEED, **_versions(),
                     "tolerance_rule": "max |actual - golden| <= tolerance * max |golden|, per output; "
                                       "<= abs_tolerance (one output quantization step) where given"})
    models = manifest.setdefault("models", {})
    for name in names:
        entry = zoo.get(name)
        start = time.perf_counter()
        built = entry.build()
        outputs = run_eager(built)
        record = store.save_golden(name, built.args, built.kwargs, outputs, data_dir)
        if built.abs_tolerance is not None:
            record["abs_tolerance"] = built.abs_tolerance
        record.update({"tolerance": entry.tolerance, "tags": list(entry.tags),
                       "weights_sha256": store.weights_fingerprint(built.model), **_versions()})
        models[name] = record
        size = store.golden_path(name, data_dir).stat().st_size
        shapes = ", ".join(f"{o['dtype']}{o['shape']}" for o in record["outputs"])
        log(f"{name:20s} {time.perf_counter() - start:6.2f}s  {size / 1e6:6.3f} MB  outputs: {shapes}")
    path = store.write_manifest(manifest, data_dir)
    log(f"wrote {path}")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_stablehlo.golden.regenerate", description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", action="extend", metavar="NAME", choices=zoo.names(),
                        help="regenerate only these models")
    parser.add_argument("--data-dir", type=Path, default=store.DATA_DIR, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    regenerate(options.only, options.data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
