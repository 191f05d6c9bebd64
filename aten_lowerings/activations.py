"""Activation functions: relu, gelu (exact and tanh), silu, hardtanh, leaky_relu, elu, softplus, ..."""
from __future__ import annotations

import torch

from .registry import lower

aten = torch.ops.aten
