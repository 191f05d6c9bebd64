"""Control-flow zoo entries: a decoder whose blocks run as one scan (``exporter.scan_layers``), an RNN written
with torch's ``scan`` and an MLP whose head is chosen by a data-dependent ``torch.cond``."""
from __future__ import annotations

import torch
from torch import nn
from torch._higher_order_ops.scan import scan

from torch_stablehlo.exporter import scan_layers

from .quantized_zoo import TransformerBlock
from .zoo import DYNAMIC, Built, batch_variant, example_generator, register, seeded_model

VOCAB = 64


class ScanDecoder(nn.Module):
    """Token embedding, ``layers`` pre-norm causal blocks (run by ``scan_layers`` if ``scanned``, else by a
    Python loop, which export unrolls), a final norm and a language-model head."""

    def __init__(self, layers: int = 4, scanned: bool = True, width: int = 32):
        super().__init__()
        self.scanned = scanned
        self.embed = nn.Embedding(VOCAB, width)
        self.blocks = nn.ModuleList([TransformerBlock(width) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        if self.scanned:
            x = scan_layers(self.blocks, x)
        else:
            for block in self.blocks:
                x = block(x)
        return self.head(self.norm(x))


def decoder(layers: int = 4, scanned: bool = True, batch: int = 2, length: int = 8) -> Built:
    """The decoder with seeded weights and seeded tokens (``bench/unrolled_vs_scanned.py`` builds it at other
    depths)."""
    model = seeded_model(lambda: ScanDecoder(layers, scanned))
    tokens = torch.randint(0, VOCAB, (batch, length), generator=example_generator())
    return Built(model, (tokens,))


class ScanRNN(nn.Module):
    """An Elman RNN over ``(batch, time, features)`` as one torch ``scan`` along time; returns every step's
    hidden state and the last one."""

    def __init__(self, features: int = 6, hidden: int = 16):
        super().__init__()
        self.input = nn.Linear(features, hidden)
        self.recurrent = nn.Linear(hidden, hidden, bias=False)

    def forward(self, xs, h):
        def step(h, x):
            h = torch.tanh(self.input(x) + self.recurrent(h))
            return h, h.clone()

        last, states = scan(step, h, xs, dim=1)
        return states, last


class CondHeads(nn.Module):
    """A shared layer, then one of two heads chosen per call by the sign of the features' mean."""

    def __init__(self, width: int = 16, classes: int = 5):
        super().__init__()
        self.shared = nn.Linear(width, width)
        self.smooth = nn.Linear(width, classes)
        self.sharp = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, classes))

    def forward(self, x):
        h = torch.relu(self.shared(x))
        return torch.cond(h.mean() > 0.1, lambda h: self.smooth(h).tanh(), lambda h: self.sharp(h), (h,))


@register("decoder_scan_layers", tags=("torch", "small", "attention", "sdpa", "control_flow"),
          description="4-block causal decoder whose blocks run as one scan over stacked weights (scan_layers)")
def _decoder_scan_layers(batch: int = 2, length: int = 8) -> Built:
    return decoder(batch=batch, length=length)


@register("rnn_scan", tags=("torch", "small", "control_flow"),
          description="Elman RNN as one torch scan over time (dim=1), every hidden state and the last")
def _rnn_scan(batch: int = 2) -> Built:
    generator = example_generator()
    model = seeded_model(ScanRNN)
    return Built(model, (torch.randn(batch, 7, 6, generator=generator), torch.randn(batch, 16, generator=generator)))


@register("cond_heads", tags=("torch", "small", "control_flow"),
          description="MLP with a data-dependent torch.cond choosing between two heads")
def _cond_heads(batch: int = 4) -> Built:
    model = seeded_model(CondHeads)
    return Built(model, (torch.randn(batch, 16, generator=example_generator()),))


DYNAMIC.update({"rnn_scan": batch_variant(8, inputs=2), "cond_heads": batch_variant(16)})
STATIC_ONLY = {"decoder_scan_layers": "torch 2.13's scan tracing specialises the batch of the carried activations "
                                      "(torch.export raises: 'your code specialized it to be a constant')"}
"""Float zoo models without a dynamic variant, and why (tests/golden/test_dynamic_zoo.py checks the why)."""
