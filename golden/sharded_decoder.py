"""A small Llama-style decoder (RMSNorm, causal attention with q/k/v/o projections, SwiGLU MLP) and its
Megatron-style shardings over a ``data`` x ``model`` mesh: for the sharding tests and ``bench/tensor_parallel.py``."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class DecoderConfig:
    vocab: int = 256
    hidden: int = 64
    heads: int = 4
    ffn: int = 128
    layers: int = 2


class RMSNorm(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.heads = config.heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(config.hidden, config.hidden, bias=False) for _ in range(4))

    def forward(self, x):
        batch, length, hidden = x.shape

        def split(t):  # [batch, heads, length, head_dim]
            return t.view(batch, length, self.heads, hidden // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)),
                                             is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, hidden))


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden, config.ffn, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.ffn, bias=False)
        self.down_proj = nn.Linear(config.ffn, config.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.input_norm, self.post_norm = RMSNorm(config.hidden), RMSNorm(config.hidden)
        self.self_attn, self.mlp = Attention(config), MLP(config)

    def forward(self, x):
        x = x + self.self_attn(self.input_norm(x))
        return x + self.mlp(self.post_norm(x))


class Decoder(nn.Module):
    def __init__(self, config: DecoderConfig = DecoderConfig()):
        super().__init__()
        self.embed = nn.Embedding(config.vocab, config.hidden)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden)
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


# Megatron: q/k/v and gate/up split by output (heads, ffn columns), o and down by input (one all-reduce each);
# the vocabulary projection by output
TENSOR_PARALLEL = {"*.q_proj.weight": ("model", None), "*.k_proj.weight": ("model", None),
                   "*.v_proj.weight": ("model", None), "*.o_proj.weight": (None, "model"),
                   "*.gate_proj.weight": ("model", None), "*.up_proj.weight": ("model", None),
                   "*.down_proj.weight": (None, "model"), "lm_head.weight": ("model", None)}
SHARDINGS = {"input_ids": ("data", None), **TENSOR_PARALLEL}


def decoder_example(config: DecoderConfig = DecoderConfig(), batch: int = 4, length: int = 8, seed: int = 0):
    """``(model, (input_ids,))`` with seeded weights and tokens."""
    torch.manual_seed(seed)
    model = Decoder(config).eval()
    return model, (torch.randint(0, config.vocab, (batch, length)),)
