"""Reductions: sum, mean, amax/amin, max/min with indices, argmax/argmin, var/std, prod, any/all, cumsum, softmax, log_softmax."""
from __future__ import annotations

import torch

from .registry import lower

aten = torch.ops.aten
