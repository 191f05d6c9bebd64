"""Errors raised by the exporter, each saying what was wrong and what would be right."""
from __future__ import annotations

from .terminal import printable


class InputError(ValueError):
    """An input does not match the signature; the message names it and what was expected."""


class ExportError(Exception):
    """Base class for conversion errors."""


class UnsupportedOpsError(ExportError):
    """Raised once per program, listing every op that has neither a lowering nor a decomposition."""

    def __init__(self, unsupported: dict[str, tuple[int, str]]):
        self.unsupported = unsupported
        lines = [f"  {name}  (x{count}), first at {where}{_hint(name)}"
                 for name, (count, where) in sorted(unsupported.items())]
        super().__init__(
            f"{len(unsupported)} op(s) in this program have no StableHLO lowering and no torch "
            "decomposition:\n" + "\n".join(lines)
            + "\nRewrite the model to avoid them, or register a lowering for each with "
              "torch_stablehlo.exporter.lowering(op) (a JAX function).")


_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "c10d", "_dtensor")


def _hint(name: str) -> str:
    """What an op without a lowering needs, by its kind: a custom op or a collective needs the user's lowering."""
    namespace = name.split(".")[0].split("(")[0]
    if namespace.startswith("auto_functionalized"):
        return ("\n    a custom op that writes its arguments (mutates_args): it needs a user lowering "
                "(torch_stablehlo.exporter.lowering) returning the op's results, then the new value of each argument "
                "it writes")
    if namespace in _COLLECTIVE_NAMESPACES:
        return ("\n    a collective (torch.distributed): it needs a user lowering (torch_stablehlo.exporter.lowering), "
                "or export the single-device model and split it with mesh= and shardings=")
    if namespace not in ("aten", "prims", "higher_order") and "." in name:
        return f"\n    a custom op ({namespace}): it needs a user lowering, torch_stablehlo.exporter.lowering({name})"
    return ""


class LoweringError(ExportError):
    """A lowering rule failed on a node; names the node, the op and where it came from."""


class DimensionError(InputError):
    """A symbolic dim of an input is out of its range, or disagrees with another dim it must equal (the same
    symbol on another input, or a derived dim such as ``2*batch``); names the input, the dim, the value given
    and the range or relation it breaks. A ValueError, like every InputError."""


class BundleError(Exception):
    """A bundle folder cannot be read: a file is missing, truncated or corrupt, or the manifest is invalid. Its
    message quotes the bundle, so it is made terminal-safe (``terminal.printable``)."""

    def __init__(self, message: str):
        super().__init__(printable(message))


class BundleVersionError(BundleError):
    """A bundle needs a StableHLO (or bundle format) version this installation cannot read."""


class WeightsError(ValueError):
    """A weightless artifact cannot run yet, or the weights offered to it do not fit: names every weight
    missing from the source or found there with another shape or dtype."""


class ShardingError(ExportError, ValueError):
    """A ``mesh`` or ``shardings`` that cannot work: names the tensor, the axis or dim and what would be right."""
