"""A picture of a sharding plan: for each weight and input, a grid over the mesh's devices (the first axis down,
the others across, as ``jax.debug.visualize_array_sharding`` lays devices out) whose cells say which part of each
dim that device holds, with the bytes per device. Drawn with ``rich`` (names as plain text, never markup); the
same drawing as text for ``str(plan)``.
"""
from __future__ import annotations

import io
import math

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text


def device_slices(shape, spec, mesh: dict[str, int]) -> list[str]:
    """Per device (in the mesh's order: the last axis varies fastest), the part it holds, e.g. ``0:32, :``."""
    names, sizes = list(mesh), list(mesh.values())
    cells = []
    for device in range(math.prod(sizes) if sizes else 1):
        coords, rest = {}, device
        for name, size in reversed(list(zip(names, sizes))):
            coords[name], rest = rest % size, rest // size
        parts = []
        for d, dim in enumerate(shape):
            axes = entry_axes(spec[d]) if d < len(spec) else ()
            if not axes:
                parts.append(":")
                continue
            index, count = 0, 1
            for axis in axes:
                index, count = index * mesh[axis] + coords[axis], count * mesh[axis]
            if not isinstance(dim, int):
                parts.append(f"{index}/{count}")
                continue
            step = dim // count
            parts.append(f"{index * step}:{(index + 1) * step}")
        cells.append(", ".join(parts))
    return cells


def entry_axes(entry) -> tuple:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def tensor_grid(name: str, shape, spec, mesh: dict[str, int], device_bytes: int) -> Group:
    sizes = list(mesh.values()) or [1]
    rows = sizes[0] if len(sizes) > 1 else 1
    columns = math.prod(sizes) // rows
    spec = tuple(spec) + (None,) * (len(shape) - len(spec))
    spec_words = ", ".join("None" if not entry_axes(e) else "+".join(entry_axes(e)) for e in spec)
    if not any(entry_axes(e) for e in spec):
        spec_words = "replicated"
    title = Text(f"{name}  {list(shape)}  ({spec_words})  {device_bytes} B per device")
    table = Table(show_header=False, box=box.SQUARE, padding=(0, 1))
    for _ in range(columns):
        table.add_column(justify="center")
    cells = device_slices(shape, spec, mesh)
    for r in range(rows):
        table.add_row(*[Text(f"d{r * columns + c}\n[{cells[r * columns + c]}]") for c in range(columns)])
    return Group(title, table)


def plan_picture(plan) -> Group:
    """Every tensor of ``plan`` (a ``ShardingPlan``) as a grid."""
    judged = "" if plan.cost is None else f", estimated {plan.cost * 1e3:.3f} ms per call" if not plan.timings else \
        f", chosen of {len(plan.timings)} plans timed ({plan.chosen}: {plan.cost * 1e3:.3f} ms per call)"
    header = Text(f"mesh {plan.mesh}: {plan.total_device_bytes} B of weights and inputs per device{judged}")
    return Group(header, *[tensor_grid(name, plan.held[name].shape, spec, plan.mesh, plan.device_bytes(name))
                           for name, spec in plan.items()])


def plan_text(plan, width: int = 120) -> str:
    """``plan_picture`` as plain text (no colours, no terminal codes)."""
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False, highlight=False).print(plan_picture(plan))
    return out.getvalue().rstrip("\n")
