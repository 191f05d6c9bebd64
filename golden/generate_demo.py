"""The LLM part of ``make demo``: a small Llama-style decoder's whole generate loop as one program
(``export_generate``), saved as a bundle, loaded back and generating the same tokens as transformers' ``generate``
(static cache) for a left-padded batch, with its tokens/s beside eager's."""
from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from torch_stablehlo.exporter import export_generate, load_artifact

CONFIG = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=8192)
BATCH, PROMPT, PADDING, NEW_TOKENS = 2, 12, 4, 48


def decoder() -> LlamaForCausalLM:
    """Seeded random weights; no eos, so every row makes all its tokens (random weights never stop)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return model


def seconds(call) -> float:
    """The second call's wall time (the first compiles and warms caches)."""
    call()
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def run_generate_demo(out: Path) -> bool:
    """Export, save to ``out``, load, generate and compare; prints what it did. True if the tokens match."""
    model = decoder()
    input_ids = torch.randint(3, CONFIG["vocab_size"], (BATCH, PROMPT), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1:, :PADDING] = 0  # the second prompt is shorter: left-padded
    print(f"decoder: {CONFIG['num_hidden_layers']} layers, {CONFIG['hidden_size']} wide, vocabulary "
          f"{CONFIG['vocab_size']}; batch {BATCH} (one prompt left-padded), prompt {PROMPT}, {NEW_TOKENS} new tokens")
    print("export_generate -> save -> load -> generate on the CPU PJRT client ...", flush=True)
    start = time.perf_counter()
    artifact = export_generate(model, input_ids, max_new_tokens=NEW_TOKENS, attention_mask=attention_mask)
    exported = time.perf_counter() - start
    loaded = load_artifact(artifact.save(out))
    ours = loaded(input_ids, attention_mask=attention_mask)
    with torch.no_grad():
        def eager():
            return model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=NEW_TOKENS,
                                  do_sample=False, cache_implementation="static")
        expected = eager()
        eager_s = seconds(eager)
    ours_s = seconds(lambda: loaded(input_ids, attention_mask=attention_mask))
    same = ours[:, :expected.shape[1]].tolist() == expected.tolist()
    tokens = BATCH * NEW_TOKENS
    print(f"export: {exported:.1f} s; bundle: {out}; tokens equal to HF generate: {'yes' if same else 'NO'}")
    print(f"generate (prompt + {NEW_TOKENS} tokens, whole call): ours {tokens / ours_s:.0f} tokens/s, "
          f"HF eager {tokens / eager_s:.0f} tokens/s ({eager_s / ours_s:.1f}x)")
    return same
