"""Conversion speed: ExportedProgram -> StableHLO text, against ``ep.run_decompositions()``.

Both are measured on the same program in the same run (median of several runs);
the ratio is what matters (target: GPT-2 12-layer converts in <= 0.15 s on 2 cores).

    .venv/bin/python bench/convert_speed.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from exporter import export_to_stablehlo


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gpt2_program(attention: str) -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(use_cache=False, attn_implementation=attention)).eval()
    return torch.export.export(model, (torch.randint(0, 50257, (1, 16)),))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    print(f"{'model':<28}{'nodes':>7}{'ours (s)':>10}{'run_decompositions (s)':>24}{'ratio':>8}{'us/node':>9}")
    for attention in ("sdpa", "eager"):
        program = gpt2_program(attention)
        export_to_stablehlo(program)  # warm-up: imports and caches
        ours = median_seconds(lambda: export_to_stablehlo(program), options.repeats)
        try:
            baseline = median_seconds(lambda: program.run_decompositions(), max(1, options.repeats // 2))
            baseline_text, ratio = f"{baseline:.3f}", f"{ours / baseline:.3f}"
        except Exception as error:  # torch 2.13 cannot decompose SDPA here; say so instead of a number
            baseline_text, ratio = f"fails ({type(error).__name__})", "-"
        nodes = len(program.graph.nodes)
        print(f"{'gpt2-12layer/' + attention:<28}{nodes:>7}{ours:>10.3f}{baseline_text:>24}{ratio:>8}"
              f"{ours / nodes * 1e6:>9.0f}")


if __name__ == "__main__":
    main()
