"""MLIR locations for FX nodes: ``"module.path/aten.op"("file.py":line:0)``."""
from __future__ import annotations

import os
import re
from functools import lru_cache

import torch
from jaxlib.mlir import ir

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


@lru_cache(maxsize=4096)
def source_line(stack_trace: str | None) -> tuple[str, int] | None:
    """The innermost frame outside torch itself and the code it generates (``<eval_with_key>.N``, where the
    graphs of torch.cond's branches and loop bodies run): the model code that called the op."""
    if not stack_trace:
        return None
    frames = _FRAME.findall(stack_trace)
    for path, line in reversed(frames):
        if not path.startswith((_TORCH_DIR, "<")):
            return path, int(line)
    return (frames[-1][0], int(frames[-1][1])) if frames else None


def module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    return next(reversed(stack.values()))[0]


def describe(node: torch.fx.Node) -> str:
    """Human-readable origin of a node for error messages."""
    where = source_line(node.meta.get("stack_trace"))
    path = module_path(node)
    parts = [f"module '{path}'" if path else "top-level module"]
    if where:
        parts.append(f"{where[0]}:{where[1]}")
    return ", ".join(parts)


class LocationCache:
    """Builds (and reuses) file locations; one per exported module."""

    def __init__(self):
        self._files: dict[tuple[str, int], ir.Location] = {}

    def for_node(self, node: torch.fx.Node, op_name: str) -> ir.Location:
        where = source_line(node.meta.get("stack_trace"))
        path = module_path(node)
        name = f"{path}/{op_name}" if path else op_name
        if where is None:
            return ir.Location.name(name)
        file_loc = self._files.get(where)
        if file_loc is None:
            file_loc = self._files[where] = ir.Location.file(where[0], where[1], 0)
        return ir.Location.name(name, childLoc=file_loc)
