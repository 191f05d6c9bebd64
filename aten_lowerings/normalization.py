"""Normalization: layer_norm, batch_norm (inference and training forms), group_norm, rms_norm."""
from __future__ import annotations

import torch

from .registry import lower

aten = torch.ops.aten
