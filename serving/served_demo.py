"""The served part of ``make demo``: a small Llama-style decoder exported as an engine (``export_engine``), saved,
loaded back and served by ``Engine`` to a few concurrent requests of different lengths arriving together on fewer
slots than requests; each request's tokens equal transformers' ``generate`` on its prompt alone, and the engine's
tokens/s stands beside that of ``generate`` serving the same requests one at a time.

    python -m torch_stablehlo.serving.served_demo [--out DIR]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from torch_stablehlo.exporter import export_engine, load_artifact

from .engine import Engine

CONFIG = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=8192)
SLOTS, CACHE, MAX_PROMPT = 4, 128, 32
REQUESTS = [(12, 48), (5, 40), (30, 24), (9, 48), (20, 32), (3, 40)]  # (prompt tokens, new tokens)


def decoder() -> LlamaForCausalLM:
    """Seeded random weights; no eos, so every request makes all its tokens (random weights never stop)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return model


def run_served_demo(out: Path) -> bool:
    """Export, save, load, serve and compare; prints what it did. True if every request's tokens match."""
    model = decoder()
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, CONFIG["vocab_size"], (n,), generator=generator).tolist() for n, _ in REQUESTS]
    print(f"decoder: {CONFIG['num_hidden_layers']} layers, {CONFIG['hidden_size']} wide; {len(REQUESTS)} concurrent "
          f"requests (prompts of {min(n for n, _ in REQUESTS)} to {max(n for n, _ in REQUESTS)} tokens) on {SLOTS} "
          "slots")
    print("export_engine -> save -> load -> Engine on the CPU PJRT client ...", flush=True)
    start = time.perf_counter()
    artifact = load_artifact(export_engine(model, slots=SLOTS, max_cache_len=CACHE, max_prompt_len=MAX_PROMPT,
                                           buckets=(MAX_PROMPT,)).save(out))  # one bucket: fewer compiles
    exported = time.perf_counter() - start
    with Engine(artifact) as engine:
        for bucket in artifact.config.buckets:  # compile before timing
            list(engine.submit([5] * bucket, max_new_tokens=2))
        start = time.perf_counter()
        requests = [engine.submit(p, max_new_tokens=new) for p, (_, new) in zip(prompts, REQUESTS)]
        ours = [list(r) for r in requests]
        served = time.perf_counter() - start
    start = time.perf_counter()
    with torch.no_grad():
        expected = [model.generate(torch.tensor([p]), max_new_tokens=new, do_sample=False)[0, len(p):].tolist()
                    for p, (_, new) in zip(prompts, REQUESTS)]
    eager = time.perf_counter() - start
    tokens = sum(new for _, new in REQUESTS)
    same = ours == expected
    print(f"export: {exported:.1f} s; bundle: {out}; every request's tokens equal HF generate alone: "
          f"{'yes' if same else 'NO'}")
    print(f"served: ours {tokens / served:.0f} tokens/s ({len(REQUESTS)} requests together), HF generate "
          f"{tokens / eager:.0f} tokens/s (one request at a time) ({eager / served:.1f}x)")
    return same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where to save the engine bundle (default: a temporary folder)")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temporary:
        ok = run_served_demo(options.out or Path(temporary) / "engine")
    print(f"served demo: {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
