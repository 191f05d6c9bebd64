"""Quantized decode speed: a Llama-style decoder quantized with torchao, ms per new token, ours beside torch eager
running the same quantized model, for float32, int8 weight-only, int8 dynamic activations and int4 group-wise.

The decoder is bench/generate_speed.py's (8 layers, 512 wide, 32k vocabulary, seeded random weights; static
cache of 1024, batch 1, greedy). Each scheme (``quantize_(model, config)`` on a copy; the embedding table stays float32, every linear,
the head included, is quantized) goes through transformers' recipe (``TorchExportableModuleForDecoderOnlyLM``,
exported with ``torch.export.export``, strict=False); both sides run the recipe's runner loop (the prompt token by
token, then one call per greedy token): ``torch eager`` calls the recipe's module (torchao's kernels), ``ours``
our artifact of it. ms/token is the decode steps alone: (time for prompt + N new tokens - time for prompt + 1) /
(N - 1). ``roofline``: the bytes a step must read (every weight as stored but the embedding table, of which it
reads one row, and the whole static cache) over the bandwidth XLA reaches summing a 512 MB array, timed between
the decoding runs (median). ``tokens``: how many of ours equal eager's greedy tokens before the first that
differs; ``|dlogit|``: the largest logit difference, eager's tokens fed to both (teacher-forced); ``margin``:
eager's top-2 logit margin at the step that chose the first differing token (a quantized scheme may differ where
that margin is within its logit difference, see tests/llm/test_quantized_decoding.py).

The CPU is printed (model, VNNI, AMX) with the form torchao's dynamic int8 path took on it: int8 x int8 products,
or, on a CPU with VNNI and no AMX, uint8 x int8 ones (its activations shifted by 128, the weight's column sums
subtracted), which the module XLA compiles holds as int8 x int8 again (``stablehlo_ir.int8_products``).

Then the product forms XLA's CPU backend was measured on (``stablehlo_ir.int8_products`` emits the fast ones):
one row times an int8 weight (4096 x 8192; --small: 512 x 2048), ms per call.

    .venv/bin/python bench/quantized_decode_speed.py [--threads 2] [--new-tokens 32] [--repeats 3] [--small]

``--small``: generate_speed's 2-layer, 128-wide decoder with a 4k vocabulary and a cache of 128 (seconds).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="a tiny decoder: runs in seconds")
    return parser.parse_args()


OPTIONS = _arguments()
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:OPTIONS.threads])  # before torch and XLA make pools

import jax  # noqa: E402  (the imports below start thread pools: after the CPUs are pinned)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from jax import lax  # noqa: E402
from jaxlib.mlir import ir  # noqa: E402
from generate_speed import BANDWIDTH_BYTES, FULL, SMALL, cpu, decoder, recipe_tokens, summing  # noqa: E402  (this folder's)
from run_speed import timed  # noqa: E402  (this folder's: the calls alternated, medians)
from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,  # noqa: E402
                                  IntxWeightOnlyConfig, quantize_)
from torchao.quantization.granularity import PerGroup  # noqa: E402
from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM  # noqa: E402


from torch_stablehlo import export_to_stablehlo  # noqa: E402
from torch_stablehlo.stablehlo_ir.int8_products import has_uint8_activations  # noqa: E402
from torch_stablehlo.stablehlo_ir.mlir_context import make_context  # noqa: E402

SCHEMES = {"float32": None, "int8 weight-only": Int8WeightOnlyConfig,
           "int8 dynamic": Int8DynamicActivationInt8WeightConfig,
           "int4 group 32": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))}
PROMPT = 8


def main(options: argparse.Namespace) -> None:
    torch.set_num_threads(options.threads)
    size = dict(SMALL if options.small else FULL)
    cache = size.pop("max_cache_len")
    model = decoder(size)
    model.generation_config.cache_implementation = "static"
    prompt = torch.randint(0, size["vocab_size"], (1, PROMPT), generator=torch.Generator().manual_seed(0))
    print(f"decoder: {size['num_hidden_layers']} layers, {size['hidden_size']} wide, vocabulary {size['vocab_size']}, "
          f"static cache {cache}; batch 1, greedy, prompt {PROMPT}, {options.new_tokens} new tokens; "
          f"{options.threads} threads for torch and XLA; medians of {options.repeats}")
    print(f"CPU: {cpu()}")
    probe = summing(BANDWIDTH_BYTES)
    print(f"{'':<18}{'eager ms':>10}{'ours ms':>9}{'x eager':>9}{'x f32':>7}{'MB read':>9}{'roofline':>10}"
          f"{'x roofline':>12}{'tokens':>9}{'|dlogit|':>10}{'margin':>9}")
    baseline, forms = None, []
    for label, config in SCHEMES.items():
        recipe, artifact = quantized(model, config, cache)
        if config is Int8DynamicActivationInt8WeightConfig:
            forms.append("uint8 x int8 (VNNI without AMX), rewritten as int8 x int8 for XLA"
                         if has_uint8_activations(artifact.stablehlo_text) else "int8 x int8")
        runs = {"eager": runner_loop(recipe, prompt, reset_module), "ours": runner_loop(artifact, prompt, reset_artifact)}
        (eager_ms, eager_tokens), (ours_ms, ours_tokens), seconds = decode_ms(runs, probe, options)
        read = read_bytes(artifact)
        roofline_ms = read / (BANDWIDTH_BYTES / seconds) * 1e3
        baseline = baseline or ours_ms
        same = next((i for i, (a, b) in enumerate(zip(ours_tokens, eager_tokens)) if a != b), len(eager_tokens))
        difference, margin = teacher_forced(recipe, artifact, eager_tokens, same)
        print(f"{label:<18}{eager_ms:>10.2f}{ours_ms:>9.2f}{ours_ms / eager_ms:>9.2f}{ours_ms / baseline:>7.2f}"
              f"{read / 1e6:>9.0f}{roofline_ms:>10.2f}{ours_ms / roofline_ms:>12.2f}"
              f"{same - PROMPT:>6}/{options.new_tokens}{difference:>10.1e}{margin:>9.1e}")
    print(f"bandwidth (XLA, sum of {BANDWIDTH_BYTES // 1024 ** 2} MB): {BANDWIDTH_BYTES / seconds / 1e9:.1f} GB/s")
    print(f"int8 dynamic products on this CPU (torchao's form): {', '.join(forms)}")
    product_forms((512, 2048) if options.small else (4096, 8192), options.repeats)


def quantized(model, config, cache: int):
    """The recipe's module around a quantized copy of ``model`` (``config`` None: float32), and our artifact."""
    model = copy.deepcopy(model)
    if config is not None:
        quantize_(model, config())
    recipe = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=cache).model
    step = {"input_ids": torch.tensor([[0]]), "cache_position": torch.tensor([0])}
    return recipe, export_to_stablehlo(torch.export.export(recipe, (), step, strict=False))


def reset_module(recipe) -> None:
    for buffer in recipe.buffers():
        buffer.zero_()


def reset_artifact(artifact) -> None:
    artifact.reset_state()


def runner_loop(run, prompt, reset):
    """``loop(count)``: the recipe's runner loop over ``run``, the prompt and ``count`` greedy tokens."""
    def loop(count):
        reset(run)
        return recipe_tokens(run, prompt, count)

    return loop


def decode_ms(runs: dict, probe, options) -> tuple:
    """(ms per decode step, tokens) of each run, and the probe's median seconds, the calls alternating."""
    new = options.new_tokens
    calls = {(label, count): (lambda run=run, count=count: run(count)) for label, run in runs.items()
             for count in (1, new)}
    calls["probe"] = probe
    median = timed(calls, options.repeats)
    steps = [((median[label, new] - median[label, 1]) / (new - 1) * 1e3, run(new)) for label, run in runs.items()]
    return (*steps, median["probe"])


def teacher_forced(recipe, artifact, tokens: list[int], first_different: int) -> tuple[float, float]:
    """Eager's tokens fed to both: the largest logit difference over the steps, and eager's top-2 margin at the
    step that chose the first token ours does not share (inf when all are shared)."""
    reset_module(recipe)
    artifact.reset_state()
    difference, margin = 0.0, float("inf")
    with torch.no_grad():
        for position, token in enumerate(tokens[:-1]):
            step = {"input_ids": torch.tensor([[token]]), "cache_position": torch.tensor([position])}
            expected = recipe(**step)[0, -1]
            difference = max(difference, float((artifact(**step)[0, -1] - expected).abs().max()))
            if position == first_different - 1:
                top2 = expected.topk(2).values
                margin = float(top2[0] - top2[1])
    return difference, margin


def read_bytes(artifact) -> int:
    """Bytes one decode step reads: the weights and state ``@main`` reads, as stored (one row of the embedding
    table; the recipe's module also holds caches its graph never reads)."""
    with make_context():
        module = ir.Module.parse(artifact.stablehlo_text)
        main = next(op for op in module.body.operations if ir.StringAttr(op.attributes["sym_name"]).value == "main")
        read = [any(True for _ in argument.uses) for argument in main.regions[0].blocks[0].arguments]
    total = 0
    for slot, used in zip(artifact.signature.main_inputs, read):
        tensor = artifact.weights.get(slot.name)
        if used and tensor is not None:
            size = tensor.numel() * tensor.element_size()
            total += size // tensor.shape[0] if "embed_tokens" in slot.name else size
    return total


def product_forms(shape: tuple[int, int], repeats: int) -> None:
    """ms of one row times a [N, K] weight in the forms measured for ``stablehlo_ir.int8_products``."""
    depth, width = shape
    rng = np.random.default_rng(0)
    weight = jnp.asarray(rng.standard_normal((width, depth), np.float32))
    int8 = jnp.asarray(rng.integers(-127, 128, (width, depth), dtype=np.int8))
    scale = jnp.asarray(rng.random(width, np.float32))
    row = jnp.asarray(rng.standard_normal((1, depth), np.float32))
    numbers = (((1,), (1,)), ((), ()))

    def int8_dot(x, w):
        return lax.dot_general(x, w, numbers, preferred_element_type=jnp.int32)

    forms = {
        "float32 dot": (lambda x, w: lax.dot_general(x, w, numbers), row, weight),
        "dequantize, then dot": (lambda x, w: lax.dot_general(x, w.astype(jnp.float32) * scale[:, None], numbers),
                                 row, int8),
        "convert, dot, scale": (lambda x, w: lax.dot_general(x, w.astype(jnp.float32), numbers) * scale, row, int8),
        "int8 x int8, 1 row": (int8_dot, row.astype(jnp.int8), int8),
        "int8 x int8, 2 rows": (int8_dot, jnp.concatenate([row, row]).astype(jnp.int8), int8),
        "int8 x int8, 3 rows": (int8_dot, jnp.concatenate([row, row, row]).astype(jnp.int8), int8),
        "uint8 x int8, 1 row": (int8_dot, row.astype(jnp.uint8), int8),
        "uint8 x int8, 2 rows": (int8_dot, jnp.concatenate([row, row]).astype(jnp.uint8), int8),
    }
    calls = {}
    for label, (form, x, w) in forms.items():
        compiled = jax.jit(form)
        calls[label] = lambda compiled=compiled, x=x, w=w: compiled(x, w).block_until_ready()
    median = timed(calls, max(repeats, 10))
    print(f"one row times a {width} x {depth} weight (XLA CPU), ms: " +
          ", ".join(f"{label} {seconds * 1e3:.2f}" for label, seconds in median.items()))


if __name__ == "__main__":
    main(OPTIONS)
