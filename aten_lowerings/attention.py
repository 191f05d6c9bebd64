"""Attention: scaled_dot_product_attention (masks, causal, scale, grouped-query)."""
from __future__ import annotations

import torch

from .registry import lower

aten = torch.ops.aten
