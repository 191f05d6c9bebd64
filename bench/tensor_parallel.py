"""A Llama-style decoder tensor-parallel over 1, 2, 4 and 8 CPU devices: per-device weight bytes and step time.

Each device count runs in its own process (the CPU client's device count is fixed when it starts); the
figures are printed side by side. Virtual CPU devices share this machine's cores, so the step times show
the partitioned program's overhead (collectives, smaller kernels), not a speed-up; the weight bytes per
device are what sharding buys.

    .venv/bin/python bench/tensor_parallel.py [--devices 1 2 4 8] [--repeats 10]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.golden.sharded_decoder import TENSOR_PARALLEL, DecoderConfig, decoder_example

CONFIG = dict(vocab=2048, hidden=256, heads=8, ffn=1024, layers=4)
BATCH, LENGTH = 8, 64


def measure(devices: int, repeats: int) -> dict:
    """In this process (started with ``devices`` CPU devices): export, place, time the steps."""
    model, args = decoder_example(DecoderConfig(**CONFIG), batch=BATCH, length=LENGTH)
    sharding = dict(mesh={"model": devices}, shardings=TENSOR_PARALLEL) if devices > 1 else {}
    artifact = export_to_stablehlo(model, args, **sharding)
    with torch.no_grad():
        expected = model(*args)
    torch.testing.assert_close(artifact(*args), expected, atol=1e-4, rtol=1e-4)  # compiles, places the weights
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        artifact(*args)
        times.append(time.perf_counter() - start)
    per_device = sum(array.addressable_shards[0].data.nbytes for array in artifact._device_weights.values())
    return {"devices": devices, "weight_bytes_per_device": per_device,
            "weight_bytes": sum(t.nbytes for t in artifact.weights.values()), "step_s": statistics.median(times)}


def run_child(devices: int, repeats: int) -> dict:
    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                                     f"--xla_force_host_platform_device_count={devices}".strip())
    result = subprocess.run([sys.executable, __file__, "--child", str(devices), "--repeats", str(repeats)],
                            capture_output=True, text=True, env=env, check=True, timeout=600)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(measure(options.child, options.repeats)))
        return
    print(f"decoder {CONFIG}, batch {BATCH} x {LENGTH} tokens, tensor parallel over 'model'")
    print(f"{'devices':>8} {'weights/device':>15} {'of all':>7} {'step (median)':>14} {'vs 1 device':>12}")
    base = None
    for devices in options.devices:
        row = run_child(devices, options.repeats)
        base = base or row["step_s"]
        print(f"{devices:>8} {row['weight_bytes_per_device'] / 1e6:>12.2f} MB "
              f"{row['weight_bytes_per_device'] / row['weight_bytes']:>7.1%} {row['step_s'] * 1e3:>11.2f} ms "
              f"{row['step_s'] / base:>11.2f}x")


if __name__ == "__main__":
    main()
