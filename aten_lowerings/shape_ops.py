"""Views and shape ops: view/reshape, (un)squeeze, permute/transpose, expand, flatten, cat/stack, split/chunk, slice/select/narrow, diff, repeat, tril/triu."""
from __future__ import annotations

import torch

from .registry import lower

aten = torch.ops.aten
