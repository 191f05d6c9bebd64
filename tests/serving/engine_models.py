"""Tiny decoders for the engine tests (seeded random weights, no downloads) and ``generate``'s tokens for a prompt
alone, the reference every engine request is checked against."""
from __future__ import annotations

import time

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM,
                          Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM)

VOCAB = 128
SHAPES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, initializer_range=0.2,
              bos_token_id=1, eos_token_id=None, pad_token_id=0)
GEMMA = dict(head_dim=16, sliding_window=4, initializer_range=0.05, layer_types=["sliding_attention", "full_attention"])
FAMILIES = {
    "llama": (LlamaForCausalLM, LlamaConfig, SHAPES),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, {**SHAPES, "tie_word_embeddings": True}),
    # a sliding window of 4 on layer 0: windows counted over a slot's left padding must stay the request's own
    "gemma2": (Gemma2ForCausalLM, Gemma2Config, {**SHAPES, **GEMMA}),
    "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig, {**SHAPES, **GEMMA}),
    "gpt2": (GPT2LMHeadModel, GPT2Config, dict(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=256,
                                                initializer_range=0.2, bos_token_id=1, eos_token_id=None)),
}


def tiny(family: str, eos_token_id=None):
    model_class, config_class, shapes = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(**shapes)).eval()
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = 0
    return model


def prompts(lengths, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in lengths]


def generated(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """``model.generate``'s new tokens for ``prompt`` alone, greedy (up to and with its eos, where one comes)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                             max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt):].tolist()


def staggered(engine, requests, gap: float = 0.02) -> list:
    """Submit ``(prompt, max_new_tokens)`` pairs a little apart, then read every stream; their token lists."""
    submitted = []
    for prompt, new in requests:
        submitted.append(engine.submit(prompt, max_new_tokens=new))
        time.sleep(gap)
    return [list(request) for request in submitted], submitted
