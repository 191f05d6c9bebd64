"""Convolutions and pooling: convolution (1d/2d/3d, groups, stride, padding, dilation), max/avg/adaptive pooling."""
from __future__ import annotations

import torch

from .registry import lower

aten = torch.ops.aten
