"""Higher-order ops: nested graphs (wrap_with_set_grad_enabled, wrap_with_autocast) lowered inline."""
from __future__ import annotations

import torch

from .registry import lower

aten = torch.ops.aten
