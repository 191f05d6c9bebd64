"""Indexing: embedding, index.Tensor, index_select, gather, masked_fill, scatter, where."""
from __future__ import annotations

import torch

from .registry import lower

aten = torch.ops.aten
