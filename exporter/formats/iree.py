"""IREE, a second consumer of our StableHLO besides XLA.

IREE (``pip install iree-base-compiler iree-base-runtime``) compiles a static module as it is. Its input
pipeline cannot lower every dynamic module: a ``gather`` whose indices have two or more ``?`` dims (an
embedding over ``[batch, seq]`` tokens) is rewritten by IREE into a ``stablehlo.reshape`` to a dynamic shape,
which StableHLO forbids (docs/iree.md holds the minimal case and the error). ``iree_module`` therefore
specialises a dynamic module to the sizes it is given (``stablehlo_ir.refine``, as a PJRT call does) and
returns text IREE compiles; ``compile_for_iree`` compiles it to a ``.vmfb``.
"""
from __future__ import annotations

from typing import Sequence

from torch_stablehlo.stablehlo_ir.refine import refine_shapes

from ..errors import DimensionError
from ..conversion.symbolic_dims import check_range, parse_dim

TARGET = "llvm-cpu"


def iree_module(artifact, sizes: dict[str, int] | None = None) -> str:
    """``artifact``'s StableHLO for IREE, as it runs on the artifact's platform (``runnable_text``): as it is
    where static (or no ``sizes`` are given), else with every symbolic dim set to ``sizes`` (dim name -> size,
    e.g. ``{"batch": 4, "seq": 16}``), each in its range."""
    signature = artifact.signature
    if not signature.is_dynamic or not sizes:
        return artifact.runnable_text()
    _check_sizes(signature.dims, sizes)
    shapes = [[_size(d, sizes) for d in slot.tensor.shape] for slot in signature.caller_inputs]
    return refine_shapes(artifact.runnable_text(), shapes)


def compile_for_iree(artifact, sizes: dict[str, int] | None = None, *, target: str = TARGET,
                     extra_args: Sequence[str] = ()) -> bytes:
    """A ``.vmfb`` of ``iree_module(artifact, sizes)`` for IREE's ``target`` backend (host CPU by default)."""
    import iree.compiler as ireec  # optional: only here

    if target == "llvm-cpu":
        extra_args = ["--iree-llvmcpu-target-cpu=host", *extra_args]
    return ireec.compile_str(iree_module(artifact, sizes), target_backends=[target], input_type="stablehlo",
                             extra_args=list(extra_args))


def parse_sizes(text: str) -> dict[str, int]:
    """``batch=4,seq=16`` as ``{"batch": 4, "seq": 16}``."""
    sizes = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if not value.strip().isdigit():
            raise ValueError(f"sizes: expected NAME=INT items separated by commas, got {item!r}")
        sizes[name.strip()] = int(value)
    return sizes


def _check_sizes(ranges: dict[str, list], sizes: dict[str, int]) -> None:
    missing, unknown = sorted(set(ranges) - set(sizes)), sorted(set(sizes) - set(ranges))
    if missing or unknown:
        raise DimensionError(f"sizes name the module's symbolic dims {sorted(ranges)}"
                             + (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else ""))
    for name, size in sizes.items():
        check_range(name, size, ranges, f"size {name}={size} is outside its range {{}}")


def _size(dim, sizes: dict[str, int]) -> int:
    return dim if isinstance(dim, int) else int(parse_dim(dim).subs({parse_dim(k): v for k, v in sizes.items()}))
