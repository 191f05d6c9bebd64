"""The versions of torch and JAX this code supports, checked when ``torch_stablehlo`` is imported.

The code uses torch internals (``torch.export`` graph signatures, FX metadata, ``torch._subclasses``) and
builds ``jax.export.Exported`` from its fields, so each is supported over a range of minor versions, not
any version. ``pyproject.toml`` states the same ranges (a test holds the two together); the exact versions
CI runs are pinned in ``constraints.txt``.
"""
import re
from importlib import metadata

# distribution -> (lowest supported, first unsupported), compared on (major, minor, patch)
SUPPORTED = {
    "torch": ((2, 13, 0), (2, 14, 0)),
    "jax": ((0, 10, 2), (0, 11, 0)),
    "jaxlib": ((0, 10, 2), (0, 11, 0)),
}


class UnsupportedVersionError(ImportError):
    """An installed dependency is outside the range ``torch_stablehlo`` supports."""


def release(version: str) -> tuple[int, int, int]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``: the leading release numbers, padded with zeros."""
    numbers = [int(part) for part in re.match(r"\d+(?:\.\d+)*", version).group().split(".")[:3]]
    return tuple(numbers + [0] * (3 - len(numbers)))


def spell(numbers: tuple[int, ...]) -> str:
    return ".".join(map(str, numbers))


def requirement(name: str) -> str:
    """The pip requirement for ``name``, e.g. ``torch>=2.13.0,<2.14.0``."""
    low, high = SUPPORTED[name]
    return f"{name}>={spell(low)},<{spell(high)}"


def check_installed() -> None:
    """Raise ``UnsupportedVersionError`` naming every dependency installed outside its supported range."""
    wrong = []
    for name, (low, high) in SUPPORTED.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{name} is not installed (need {requirement(name)})")
            continue
        if not low <= release(installed) < high:
            wrong.append(f"{name} {installed} is installed, this torch_stablehlo supports {requirement(name)}")
    if wrong:
        raise UnsupportedVersionError("; ".join(wrong) + ". Install a supported version, e.g. "
                                      f"`pip install '{requirement('torch')}' '{requirement('jax')}' "
                                      f"'{requirement('jaxlib')}'`.")
