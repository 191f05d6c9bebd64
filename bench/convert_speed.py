"""Conversion speed: ExportedProgram -> StableHLO text, against ``ep.run_decompositions()``.

Both are measured on the same program in the same run (median of several runs); the ratio is
what matters. Three tables:

- GPT-2 12-layer (768 wide), sdpa and eager attention: target <= 0.15 s.
- every golden zoo model (``golden.zoo``), at its golden size.
- linearity: a 1024-wide GPT-2 decoder at 2, 12 and 24 layers (built on the meta device: conversion
  never reads weight values), with the time per graph node, which should stay flat, and a
  least-squares line time = a + b * nodes.

    .venv/bin/python bench/convert_speed.py [--repeats 5] [--skip-zoo]

The machine may be shared: medians, and ratios of two figures measured in the same run.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter import export_to_stablehlo  # noqa: E402

HEADER = f"{'model':<26}{'nodes':>7}{'ours (s)':>10}{'run_decompositions (s)':>24}{'ratio':>8}{'us/node':>9}"


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gpt2_program(attention: str = "sdpa", layers: int = 12, width: int = 768, heads: int = 12,
                 meta: bool = False) -> torch.export.ExportedProgram:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(use_cache=False, attn_implementation=attention, n_layer=layers, n_embd=width, n_head=heads)
    with torch.device("meta" if meta else "cpu"):
        model = GPT2LMHeadModel(config).eval()
        input_ids = torch.zeros((1, 16), dtype=torch.long)
    return torch.export.export(model, (input_ids,))


def zoo_program(name: str) -> torch.export.ExportedProgram:
    from golden import zoo
    from quantize import plain_quantized_weights

    built = zoo.get(name).build()
    return torch.export.export(plain_quantized_weights(built.model), tuple(built.args), built.kwargs)


def measure(name: str, program: torch.export.ExportedProgram, repeats: int) -> tuple[int, float]:
    """Prints one row; returns (nodes, our median seconds)."""
    export_to_stablehlo(program)  # warm-up: imports and caches
    ours = median_seconds(lambda: export_to_stablehlo(program), repeats)
    try:
        baseline = median_seconds(lambda: program.run_decompositions(), max(1, repeats // 2))
        baseline_text, ratio = f"{baseline:.3f}", f"{ours / baseline:.3f}"
    except Exception as error:  # noqa: BLE001  (some programs cannot be decomposed here; say so)
        baseline_text, ratio = f"fails ({type(error).__name__})", "-"
    nodes = len(program.graph.nodes)
    print(f"{name:<26}{nodes:>7}{ours:>10.3f}{baseline_text:>24}{ratio:>8}{ours / nodes * 1e6:>9.0f}", flush=True)
    return nodes, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-zoo", action="store_true", help="only the GPT-2 tables")
    options = parser.parse_args()

    print("GPT-2 12-layer (target: <= 0.15 s)")
    print(HEADER)
    for attention in ("sdpa", "eager"):
        measure(f"gpt2-12layer/{attention}", gpt2_program(attention), options.repeats)

    if not options.skip_zoo:
        from golden import zoo

        print("\ngolden zoo")
        print(HEADER)
        for name in zoo.names():
            measure(name, zoo_program(name), options.repeats)

    print("\nlinearity: GPT-2 decoder 1024 wide, 16 heads (meta weights)")
    print(HEADER)
    points = [measure(f"gpt2-1024w-{layers}layer", gpt2_program(layers=layers, width=1024, heads=16, meta=True),
                      options.repeats) for layers in (2, 12, 24)]
    slope, intercept = _fit(points)
    worst = max(abs(t - (intercept + slope * n)) / t for n, t in points)
    print(f"fit: time = {intercept * 1e3:.1f} ms + {slope * 1e6:.0f} us x nodes; largest deviation from the "
          f"line {worst:.1%}; us/node 2->24 layers: {points[0][1] / points[0][0] * 1e6:.0f} -> "
          f"{points[-1][1] / points[-1][0] * 1e6:.0f}")


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    xs, ys = [n for n, _ in points], [t for _, t in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return slope, mean_y - slope * mean_x


if __name__ == "__main__":
    main()
