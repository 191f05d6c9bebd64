"""Deep models, unrolled versus scanned: the StableHLO op count and the cold XLA compile time of the golden
decoder (``golden.control_flow_zoo.decoder``) at 4 and 32 layers, its blocks run by a Python loop (which export
unrolls) or by ``exporter.scan_layers`` (one ``stablehlo.while``), side by side in one run.

    .venv/bin/python bench/unrolled_vs_scanned.py [--depths 4 32] [--repeats 3]

Each compile goes straight to the PJRT client (no compile cache: every one is cold); the time is the best of
``--repeats``. Expect the
scanned op count to stay flat in depth and its compile time not to grow with it, and the unrolled ones to
grow with the depth.
"""
from __future__ import annotations

import argparse
import time

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.golden.control_flow_zoo import decoder
from torch_stablehlo.golden.verify import count_ops
from torch_stablehlo.runtime import pjrt
from torch_stablehlo.stablehlo_ir.passes import prepare_for_xla


def measure(layers: int, scanned: bool, repeats: int) -> tuple[int, float]:
    """(op count, best cold compile time in seconds) of the decoder of ``layers`` blocks."""
    built = decoder(layers=layers, scanned=scanned)
    text = export_to_stablehlo(built.model, built.args).stablehlo_text
    client = pjrt.client()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        client.compile_and_load(prepare_for_xla(text), client.devices()[:1], pjrt.compile_options())
        best = min(best, time.perf_counter() - start)
    return count_ops(text), best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs=2, default=[4, 32], metavar=("SHALLOW", "DEEP"))
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    shallow, deep = options.depths
    print(f"{'form':<10}{'ops @' + str(shallow):>10}{'ops @' + str(deep):>10}{'ratio':>8}"
          f"{'compile @' + str(shallow) + ' (s)':>18}{'compile @' + str(deep) + ' (s)':>18}{'ratio':>8}")
    results = {}
    for scanned in (False, True):
        (ops_a, time_a), (ops_b, time_b) = (measure(depth, scanned, options.repeats) for depth in (shallow, deep))
        results[scanned] = (ops_b, time_b)
        print(f"{'scanned' if scanned else 'unrolled':<10}{ops_a:>10}{ops_b:>10}{ops_b / ops_a:>8.2f}"
              f"{time_a:>18.3f}{time_b:>18.3f}{time_b / time_a:>8.2f}")
    (unrolled_ops, unrolled_time), (scanned_ops, scanned_time) = results[False], results[True]
    print(f"at {deep} layers, scanned / unrolled: ops {scanned_ops / unrolled_ops:.3f}, "
          f"compile time {scanned_time / unrolled_time:.3f}")


if __name__ == "__main__":
    main()
