"""Decode speed: a Llama-style decoder's greedy decoding, ms per new token, side by side in one run.

The model: 8 layers, 512 wide (8 heads of 64, MLP 1536), 32k vocabulary, untied embeddings (60M parameters,
240 MB in float32), a static KV cache of 1024 positions (34 MB), batch 1, greedy. Rows:

- ``HF eager``: ``model.generate(do_sample=False)`` with ``cache_implementation="static"``;
- ``per-token loop``: our artifact of transformers' recipe (``TorchExportableModuleForDecoderOnlyLM``, exported
  with ``torch.export.export``, strict=False) called once per token, as the recipe's runner loop does; its cache is
  the artifact's state, kept on the device and donated to each call;
- ``dynamic prompt``: the same recipe exported as transformers' own ``.export()`` and ExecuTorch/optimum export it,
  with a dynamic prompt length (``Dim("seq", 1..128)`` on ``input_ids`` and ``cache_position``), called the same
  way (one token a call: each call's module is refined to size 1 before XLA compiles it); target: within 1.1x of
  the per-token loop. The two are timed in lockstep, one call of each in turn (which goes first alternating), the
  same token fed to both: the ratio is the median of each decode step's pair, so a load that changes during the
  run reaches both sides of every pair (timed one run after the other, as the rows above are, the ratio moved by
  15% between runs on a loaded machine where the two compiled programs are the same); its ms/token is the median
  decode call of that run;
- ``export_generate``: the whole generate loop as one program (``exporter.export_generate``, one artifact per
  token count), its call timed whole (prompt in, tokens out);
- ``roofline``: the bytes one decode step reads when its attention reads the whole static cache (every weight but
  the input embedding table, of which it reads one row, and the whole cache) over the memory bandwidth measured
  in this run (XLA summing a 512 MB array, timed between the decoding runs, median); the figures with the whole
  table counted, and with the cache read only up to each step's position (what must be read: our attention
  reads the live prefix, in buckets of 64 keys and up, ``aten_lowerings/emit/live_prefix.py``), are printed
  too.

ms/token is the decode steps alone: (time for prompt + N new tokens - time for prompt + 1) / (N - 1), for
both sides. Both get the same CPUs: the process is pinned to ``--threads`` CPUs before torch and XLA start their
pools, torch uses that many threads. Targets, each printed with its ratio: per-token loop <= 1.0x HF eager and
<= 1.25x the roofline; export_generate <= 1.1x the roofline; dynamic prompt <= 1.1x the per-token loop. The CPU
and the load average at the start and the end are printed: the roofline ratios hold for a machine whose pinned
CPUs run nothing else (a load shares the CPUs, not the bandwidth probe's memory alike).
One step's call of the per-token loop is split into the executable (runtime.analysis's execution times) and the
rest of the call (inputs placed, outputs read back).

    .venv/bin/python bench/decode_speed.py [--threads 2] [--new-tokens 64] [--repeats 3] [--small]

``--small``: a 2-layer, 64-wide decoder with a 1k vocabulary and a cache of 128 (seconds, for a smoke test).
"""
from __future__ import annotations

import argparse
import io
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="a tiny decoder: runs in seconds")
    return parser.parse_args()


OPTIONS = _arguments()
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:OPTIONS.threads])  # before torch and XLA make pools

import jax  # noqa: E402  (the imports below start thread pools: after the CPUs are pinned)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from generate_speed import cpu, recipe_tokens  # noqa: E402  (this folder's: the recipe's runner loop)
from torch.export import Dim  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM  # noqa: E402

from torch_stablehlo import export_generate, export_to_stablehlo  # noqa: E402
from torch_stablehlo.runtime import analysis  # noqa: E402

FULL = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
            num_key_value_heads=8, vocab_size=32000, cache=1024)
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1024, cache=128)
PROMPT = 8
TARGETS = {("per-token loop", "HF eager"): 1.0, ("per-token loop", "roofline"): 1.25,
           ("dynamic prompt", "per-token loop"): 1.1, ("export_generate", "roofline"): 1.1}
PROMPT_DIM_MAX = 128  # the dynamic prompt dim's bound, as transformers' recipe exports it
BANDWIDTH_BYTES = 512 * 1024 ** 2


def main(options: argparse.Namespace) -> None:
    torch.set_num_threads(options.threads)
    size = SMALL if options.small else FULL
    model = build(size)
    parameters = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cache_bytes = 2 * size["num_hidden_layers"] * size["num_key_value_heads"] * size["cache"] * \
        (size["hidden_size"] // size["num_attention_heads"]) * 4
    print(f"decoder: {size['num_hidden_layers']} layers, {size['hidden_size']} wide, vocabulary "
          f"{size['vocab_size']}, {parameters / 1e6:.1f}M parameters ({weight_bytes / 1e6:.0f} MB), static cache "
          f"{size['cache']} ({cache_bytes / 1e6:.1f} MB); batch 1, greedy, prompt {PROMPT}, {options.new_tokens} new "
          f"tokens; {options.threads} threads for torch and XLA; medians of {options.repeats}")
    print(f"CPU: {cpu()}; load average {load()} at the start")
    prompt = torch.randint(0, size["vocab_size"], (1, PROMPT), generator=torch.Generator().manual_seed(0))

    artifact = recipe_artifact(model, size["cache"])
    runs = {"eager": hf_eager(model, prompt), "ours": per_token_loop(artifact, prompt),
            "export_generate": whole_loop(model, prompt, size["cache"], options.new_tokens)}
    timings, probe_seconds = decode_ms(runs, options.new_tokens, options.repeats, bandwidth_probe())
    (eager_ms, eager_tokens), (loop_ms, loop_tokens), (generate_ms, generate_tokens) = timings.values()
    dynamic = lockstep(artifact, recipe_artifact(model, size["cache"], dynamic_prompt=True), prompt,
                       options.new_tokens, options.repeats)
    call_ms, execute_ms = call_split(runs["ours"], options.new_tokens)
    bandwidth = BANDWIDTH_BYTES / probe_seconds
    embedding = model.get_input_embeddings().weight
    read_bytes = weight_bytes - embedding[1:].numel() * embedding.element_size() + cache_bytes  # one row of it
    roofline_ms = read_bytes / bandwidth * 1e3
    positions = range(PROMPT, PROMPT + options.new_tokens)  # the cache columns each decode step attends over
    live_bytes = read_bytes - cache_bytes + cache_bytes * statistics.mean(p + 1 for p in positions) / size["cache"]
    assert loop_tokens == eager_tokens, f"tokens differ:\n  eager {eager_tokens}\n  ours  {loop_tokens}"
    assert generate_tokens == eager_tokens, f"tokens differ:\n  eager {eager_tokens}\n  export_generate {generate_tokens}"
    assert dynamic.tokens == eager_tokens, f"tokens differ:\n  eager {eager_tokens}\n  dynamic {dynamic.tokens}"

    print(f"bandwidth (XLA, sum of {BANDWIDTH_BYTES // 1024 ** 2} MB): {bandwidth / 1e9:.1f} GB/s; "
          f"roofline: {read_bytes / 1e6:.0f} MB read per token -> {roofline_ms:.2f} ms/token (with the whole "
          f"embedding table: {(weight_bytes + cache_bytes) / bandwidth * 1e3:.2f}; with the cache read up to each "
          f"step's position only: {live_bytes / bandwidth * 1e3:.2f})")
    print(f"{'':<18}{'ms/token':>10}{'tokens/s':>10}{'x eager':>9}{'x roofline':>12}")
    rows = {"HF eager": eager_ms, "per-token loop": loop_ms, "dynamic prompt": dynamic.dynamic_ms,
            "export_generate": generate_ms, "roofline": roofline_ms}
    for label, ms in rows.items():
        print(f"{label:<18}{ms:>10.2f}{1e3 / ms:>10.1f}{ms / eager_ms:>9.2f}{ms / roofline_ms:>12.2f}")
    print(f"per-token loop, one step's call: {call_ms:.2f} ms, of which {execute_ms:.2f} ms in the executable and "
          f"{call_ms - execute_ms:.2f} ms in the rest of the call (inputs placed, logits read back)")
    print(f"dynamic prompt against the per-token loop, calls in lockstep ({dynamic.pairs} decode steps): "
          f"{dynamic.dynamic_ms:.2f} against {dynamic.static_ms:.2f} ms a call (medians), median ratio of the pairs "
          f"{dynamic.ratio:.3f}; of their CPU time (medians) {dynamic.cpu_ratio:.3f}")
    ratios = {key: rows[key[0]] / rows[key[1]] for key in TARGETS}
    ratios["dynamic prompt", "per-token loop"] = dynamic.ratio
    for (label, baseline), target in TARGETS.items():
        ratio = ratios[label, baseline]
        print(f"target: {label} <= {target}x {baseline}: {ratio:.2f} ({'met' if ratio <= target else 'missed'})")
    print(f"load average {load()} at the end (above 1 per pinned CPU, other work shared them: the ratios to the "
          "roofline are then not the machine's)")


def build(size: dict):
    config = LlamaConfig(**{k: v for k, v in size.items() if k != "cache"}, tie_word_embeddings=False,
                         max_position_embeddings=4096, initializer_range=0.1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.cache_implementation = "static"
    model.generation_config.cache_config = {"max_cache_len": size["cache"]}
    model.generation_config.eos_token_id = None  # every run makes exactly the tokens asked for
    return model


def decode_ms(runs: dict, new_tokens: int, repeats: int, probe) -> tuple[dict, float]:
    """For each ``run(n)`` (which makes the prompt's tokens and ``n`` new ones): ms per decode step, and its
    tokens; and the median seconds of ``probe()``, timed between the runs (so that it sees the machine as they
    do). The runs alternate, after one warm-up each (compiles, places the weights)."""
    tokens = {label: run(new_tokens) for label, run in runs.items()}
    times = {(label, count): [] for label in runs for count in (1, new_tokens)}
    probes = []
    for _ in range(repeats):
        for (label, count), seconds in times.items():
            start = time.perf_counter()
            runs[label](count)
            seconds.append(time.perf_counter() - start)
            start = time.perf_counter()
            probe()
            probes.append(time.perf_counter() - start)
    steps = {label: statistics.median(times[label, new_tokens]) - statistics.median(times[label, 1])
             for label in runs}
    return ({label: (steps[label] / (new_tokens - 1) * 1e3, tokens[label]) for label in runs},
            statistics.median(probes))


def hf_eager(model, prompt):
    def run(count):
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=count, min_new_tokens=count, do_sample=False)[0].tolist()

    return run


def recipe_artifact(model, cache: int, dynamic_prompt: bool = False):
    """Our artifact of transformers' recipe, exported with ``torch.export.export`` (strict=False): for one token,
    or (``dynamic_prompt``) for 1 to ``PROMPT_DIM_MAX`` tokens a call, traced with two."""
    recipe = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=cache)
    if not dynamic_prompt:
        step = {"input_ids": torch.tensor([[0]]), "cache_position": torch.tensor([0])}
        return export_to_stablehlo(torch.export.export(recipe.model, (), step, strict=False))
    seq = Dim("seq", min=1, max=PROMPT_DIM_MAX)
    step = {"input_ids": torch.tensor([[0, 0]]), "cache_position": torch.tensor([0, 1])}
    program = torch.export.export(recipe.model, (), step, strict=False,
                                  dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}})
    return export_to_stablehlo(program)


def per_token_loop(artifact, prompt):
    """The recipe's runner loop over ``artifact``: the prompt token by token, then one call per new token
    (the seconds of each call kept in ``run.calls``)."""
    def step(**inputs):
        start = time.perf_counter()
        logits = artifact(**inputs)
        run.calls.append(time.perf_counter() - start)
        return logits

    def run(count):
        artifact.reset_state()
        run.calls.clear()
        return recipe_tokens(step, prompt, count)

    run.calls = []
    return run


class Lockstep(NamedTuple):
    static_ms: float   # medians of the decode steps' calls
    dynamic_ms: float
    ratio: float       # median over the decode steps of dynamic / static, each step's pair timed together
    cpu_ratio: float   # the same of the process's CPU time in each call (what a load slows least)
    pairs: int
    tokens: list       # the prompt's tokens and the new ones (both programs', checked equal at every step)


def lockstep(static, dynamic, prompt, new_tokens: int, repeats: int) -> Lockstep:
    """The recipe's runner loop over both artifacts at once: each step calls one, then the other (which goes first
    alternating), with the same token; their logits must pick the same next token. ``repeats`` runs after one
    warm-up (compiles); the decode steps' pairs of all runs."""
    seconds = {static: [], dynamic: []}  # (wall, CPU) seconds of each call

    def step(**inputs):
        order = (static, dynamic) if len(seconds[static]) % 2 == 0 else (dynamic, static)
        logits = {}
        for artifact in order:
            start, cpu_start = time.perf_counter(), time.process_time()
            logits[artifact] = artifact(**inputs)
            seconds[artifact].append((time.perf_counter() - start, time.process_time() - cpu_start))
        pick = [int(logits[a][0, -1].argmax()) for a in (static, dynamic)]
        assert pick[0] == pick[1], f"the dynamic-prompt program picks {pick[1]}, the static one {pick[0]}"
        return logits[static]

    pairs = []
    for run in range(repeats + 1):
        for artifact in seconds:
            artifact.reset_state()
            seconds[artifact].clear()
        tokens = recipe_tokens(step, prompt, new_tokens)
        if run:
            pairs += list(zip(seconds[static][PROMPT:], seconds[dynamic][PROMPT:]))
    (static_wall, static_cpu), (dynamic_wall, dynamic_cpu) = (zip(*side) for side in zip(*pairs))
    return Lockstep(statistics.median(static_wall) * 1e3, statistics.median(dynamic_wall) * 1e3,
                    statistics.median(d / s for s, d in zip(static_wall, dynamic_wall)),
                    statistics.median(dynamic_cpu) / statistics.median(static_cpu), len(pairs), tokens)


def call_split(run, new_tokens: int) -> tuple[float, float]:
    """ms of one decode step's call and of its executable alone (runtime.analysis's execution times), medians
    over one run of ``new_tokens`` steps."""
    log = io.StringIO()
    analysis.enable(True, log)
    run(new_tokens)
    analysis.enable(False)
    executions = [float(ms) for ms in re.findall(r"execute \S+ \[[^\]]*\]: ([\d.]+) ms", log.getvalue())]
    return statistics.median(run.calls[PROMPT:]) * 1e3, statistics.median(executions[PROMPT:])


def whole_loop(model, prompt, cache: int, new_tokens: int):
    """``export_generate``'s artifacts for 1 and ``new_tokens`` new tokens, compiled; ``run(count)`` calls one."""
    artifacts = {count: export_generate(model, prompt, max_new_tokens=count, max_cache_len=cache)
                 for count in (1, new_tokens)}
    for artifact in artifacts.values():  # compiled before timing (decode_ms warms only the new_tokens run)
        artifact(prompt)
    return lambda count: artifacts[count](prompt)[0].tolist()


def load() -> str:
    return "/".join(f"{value:.1f}" for value in os.getloadavg()) + " (1/5/15 min)"


def bandwidth_probe():
    """A call that reads ``BANDWIDTH_BYTES`` once: XLA summing a float32 array of that size (compiled here)."""
    data = jax.device_put(np.ones(BANDWIDTH_BYTES // 4, np.float32))
    total = jax.jit(jnp.sum)
    total(data).block_until_ready()
    return lambda: total(data).block_until_ready()


if __name__ == "__main__":
    main(OPTIONS)
