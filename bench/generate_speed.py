"""Decode speed of ``export_generate`` against transformers' eager ``generate`` and the memory roofline.

A 60M-parameter Llama-style decoder (8 layers, 512 wide, 8 heads of 64, 32k vocabulary, seeded random weights),
static cache of 1024, a 16-token prompt, greedy, no eos (every call makes all its tokens). Both sides get the same
CPUs: the process is pinned to ``--threads`` CPUs before torch and XLA start, torch uses that many threads.

- ``HF eager``: ``model.generate(cache_implementation="static")`` under ``torch.no_grad``;
- ``export_generate``: the artifact's call (inputs placed, prefill, the whole decode loop, tokens back);
- ``roofline``: the bytes one decode step must read, the weights and the whole static cache, over the memory
  bandwidth XLA reaches summing a 512 MB array, timed between the other calls (median): the machine may be
  shared, and contention then slows all three alike.

ms/token is the decode alone: (time for ``--new-tokens`` tokens - time for 1 token) / (``--new-tokens`` - 1), so the
prefill cancels out; medians of ``--repeats`` calls, alternating. Then tokens/s at batch 8, both sides.
Target: export_generate <= 1.1x the roofline.

    .venv/bin/python bench/generate_speed.py [--threads 2] [--repeats 3] [--new-tokens 64] [--small]
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from run_speed import timed  # this folder's: the calls alternated, medians


FULL = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8,
            num_key_value_heads=8, vocab_size=32000, max_cache_len=1024)
SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, vocab_size=4096, max_cache_len=128)
PROMPT_LEN, BATCHES, TARGET = 16, (1, 8), 1.1
BANDWIDTH_BYTES = 512 * 1024 ** 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--small", action="store_true", help="a 2-layer, 128-wide decoder: runs in seconds")
    options = parser.parse_args()
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:options.threads])  # before torch/XLA make pools

    import torch  # after pinning: torch and XLA size their thread pools to the CPUs they may use

    torch.set_num_threads(options.threads)
    sizes = dict(SMALL if options.small else FULL)
    cache_len = sizes.pop("max_cache_len")
    model = decoder(sizes)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"threads: {options.threads}; {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters "
          f"({weights / 1e6:.0f} MB), cache {cache_len}, prompt {PROMPT_LEN}, {options.new_tokens} new tokens; "
          f"bandwidth: XLA summing {BANDWIDTH_BYTES // 1024 ** 2} MB, timed between the calls")
    print(f"{'batch':>5}  {'HF eager':>14}  {'export_generate':>16}  {'roofline':>14}  {'GB/s':>5}  "
          f"{'ours/eager':>10}  {'ours/roofline':>13}  target")
    for batch in BATCHES:
        cache = 2 * sizes["num_hidden_layers"] * batch * sizes["num_key_value_heads"] * cache_len * (
            sizes["hidden_size"] // sizes["num_attention_heads"]) * 4
        eager, ours, bandwidth = decode_seconds(model, batch, cache_len, options.new_tokens, options.repeats)
        roofline = (weights + cache) / bandwidth
        verdict = ("ok" if ours <= TARGET * roofline else "MISSED") if batch == 1 else ""
        print(f"{batch:>5}  {rate(eager, batch):>14}  {rate(ours, batch):>16}  {rate(roofline, batch):>14}  "
              f"{bandwidth / 1e9:>5.1f}  {ours / eager:>10.2f}  {ours / roofline:>13.2f}  "
              f"{f'<= {TARGET}x roofline ' + verdict if verdict else ''}")


def decoder(sizes: dict):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=4096, **sizes)).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0  # every token made
    return model


def summing(array_bytes: int):
    """A call that sums an ``array_bytes`` float32 array already on the device (compiled, warm) and waits."""
    import jax
    import jax.numpy as jnp

    array = jax.device_put(jnp.ones(array_bytes // 4, jnp.float32))
    total = jax.jit(jnp.sum)
    total(array).block_until_ready()
    return lambda: total(array).block_until_ready()


def decode_seconds(model, batch: int, cache_len: int, new_tokens: int, repeats: int) -> tuple[float, float, float]:
    """Seconds per decode step of HF eager generate and of export_generate's artifact (see the module doc), and the
    bandwidth of the sums timed between them (bytes/s, median)."""
    import torch

    from torch_stablehlo import exporter

    prompt = torch.randint(3, model.config.vocab_size, (batch, PROMPT_LEN))
    artifacts = {n: exporter.export_generate(model, prompt, max_new_tokens=n, max_cache_len=cache_len)
                 for n in (1, new_tokens)}
    runs = {("eager", n): (lambda n=n: hf_generate(model, prompt, n, cache_len)) for n in artifacts}
    runs.update({("ours", n): (lambda n=n: artifacts[n](prompt)) for n in artifacts})
    runs["sum"] = summing(BANDWIDTH_BYTES)
    median = timed(runs, repeats)  # alternating, after a warm-up each (compiles, caches)
    steps = [(median[(side, new_tokens)] - median[(side, 1)]) / (new_tokens - 1) for side in ("eager", "ours")]
    return steps[0], steps[1], BANDWIDTH_BYTES / median["sum"]


def hf_generate(model, prompt, new_tokens: int, cache_len: int):
    import torch

    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, cache_implementation="static",
                              max_cache_len=cache_len)


def recipe_tokens(step, prompt, count: int) -> list[int]:
    """transformers' recipe runner loop (``TorchExportableModuleWithStaticCache.generate``) over ``step`` (a per-token
    call, ``step(input_ids=..., cache_position=...)`` -> logits, stateful): the prompt one token at a time, then
    ``count`` greedy tokens, each fed back at the next position. The prompt's tokens and the new ones."""
    import torch

    tokens = prompt[0].tolist()
    with torch.no_grad():
        for position in range(prompt.shape[1]):
            logits = step(input_ids=prompt[:, position:position + 1], cache_position=torch.tensor([position]))
        for _ in range(count):
            tokens.append(int(logits[0, -1].argmax()))
            logits = step(input_ids=torch.tensor([[tokens[-1]]]), cache_position=torch.tensor([len(tokens) - 1]))
    return tokens


def cpu() -> str:
    """The CPU's model name and whether it has VNNI and AMX (which pick torchao's int8 product form)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in info.splitlines())}
    name = fields.get("model name", "unknown")
    flags = set(fields.get("flags", "").split())
    return f"{name}, VNNI {'avx512_vnni' in flags or 'avx_vnni' in flags}, AMX {'amx_tile' in flags}"


def rate(seconds_per_step: float, batch: int) -> str:
    return f"{seconds_per_step * 1e3:.2f} ms/token" if batch == 1 else f"{batch / seconds_per_step:.0f} tok/s"


if __name__ == "__main__":
    main()
