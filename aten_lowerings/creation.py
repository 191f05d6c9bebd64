"""Tensor creation and identity-like ops: arange, full, zeros/ones (and new_*/*_like), scalar_tensor, dtype casts, clone/alias/detach, eval-mode dropout, metadata asserts."""
from __future__ import annotations

import torch

from .registry import lower

aten = torch.ops.aten
