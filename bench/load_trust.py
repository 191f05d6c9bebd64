"""What reading a bundle from elsewhere costs: ``load_artifact`` reads its module in a child process first (so crafted
bytecode cannot crash the caller), against a trusted load (``trusted=True``, or a bundle this process saved).

    .venv/bin/python bench/load_trust.py [--model gpt2_2layer] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from torch_stablehlo.exporter import export_to_stablehlo, load_artifact
from torch_stablehlo.exporter.formats import bundle
from torch_stablehlo.golden import zoo


def median_load_s(path: Path, repeats: int, *, trusted: bool, forget: bool) -> float:
    """Median seconds of ``load_artifact(path, trusted=trusted)``; ``forget``: as if this process never saw the
    module (its digest dropped), so an untrusted load reads it in a child each time."""
    times = []
    for _ in range(repeats):
        if forget:
            bundle._READABLE.clear()
        start = time.perf_counter()
        load_artifact(path, trusted=trusted)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2_2layer")
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    built = zoo.get(options.model).build()
    with tempfile.TemporaryDirectory() as folder:
        path = export_to_stablehlo(built.model, built.args, built.kwargs).save(Path(folder) / "bundle")
        module_kb = (path / bundle.MODULE_PORTABLE).stat().st_size / 1024
        saved_here = median_load_s(path, options.repeats, trusted=False, forget=False)
        trusted = median_load_s(path, options.repeats, trusted=True, forget=True)
        untrusted = median_load_s(path, options.repeats, trusted=False, forget=True)
    print(f"{'model':<16}{'module (KB)':>12}{'trusted (s)':>13}{'saved here (s)':>16}{'untrusted (s)':>15}"
          f"{'untrusted/trusted':>19}")
    print(f"{options.model:<16}{module_kb:>12.1f}{trusted:>13.3f}{saved_here:>16.3f}{untrusted:>15.3f}"
          f"{untrusted / trusted:>19.2f}")


if __name__ == "__main__":
    main()
