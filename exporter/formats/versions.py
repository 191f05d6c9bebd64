"""StableHLO versions: the target a module is serialized at, and whether a stored version is readable here."""
from __future__ import annotations

import importlib.metadata
import re

import jaxlib
import torch
from jaxlib.mlir.dialects import stablehlo

from ..errors import BundleVersionError

_WINDOWS = {"week4": stablehlo.StablehloCompatibilityRequirement.WEEK_4,
            "week12": stablehlo.StablehloCompatibilityRequirement.WEEK_12}
DEFAULT_TARGET = "week12"
TARGET_CHOICES = ("week12", "week4", "current", "minimum")


def _parse(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def resolve_target_version(target: str) -> str:
    """``week12`` (default: readable by StableHLO consumers up to about 12 weeks old), ``week4``,
    ``current``, ``minimum``, or an explicit version such as ``1.10.0`` within what this jaxlib writes."""
    if target in _WINDOWS:
        return stablehlo.get_version_from_compatibility_requirement(_WINDOWS[target])
    if target == "current":
        return stablehlo.get_current_version()
    if target == "minimum":
        return stablehlo.get_minimum_version()
    if not re.fullmatch(r"\d+\.\d+\.\d+", target):
        raise ValueError(f"StableHLO target version {target!r}: expected one of {', '.join(TARGET_CHOICES)} "
                         "or a version such as '1.10.0'")
    low, high = stablehlo.get_minimum_version(), stablehlo.get_current_version()
    if not _parse(low) <= _parse(target) <= _parse(high):
        raise ValueError(f"StableHLO target version {target} is outside what jaxlib {jaxlib.__version__} "
                         f"can write: [{low}, {high}]")
    return target


def check_readable(version: str, what: str) -> None:
    """Raise BundleVersionError if this jaxlib cannot read StableHLO ``version``."""
    low, high = stablehlo.get_minimum_version(), stablehlo.get_current_version()
    if not isinstance(version, str) or not re.fullmatch(r"\d{1,9}\.\d{1,9}\.\d{1,9}", version):
        raise BundleVersionError(f"{what}: invalid StableHLO version {str(version)[:40]!r}: expected a version "
                                 "such as '1.10.0'")
    if _parse(version) > _parse(high):
        raise BundleVersionError(f"{what} was written at StableHLO {version}, newer than jaxlib "
                                 f"{jaxlib.__version__} reads (up to {high}); upgrade jaxlib, or re-save it "
                                 "with an older target version")
    if _parse(version) < _parse(low):
        raise BundleVersionError(f"{what} was written at StableHLO {version}, older than jaxlib "
                                 f"{jaxlib.__version__} reads (from {low}); re-export it")


def producer_versions() -> dict:
    """Versions of what made an artifact: this package, torch and jaxlib."""
    try:
        producer = importlib.metadata.version("torch-stablehlo-exporter")
    except importlib.metadata.PackageNotFoundError:  # running from a source checkout that is not installed
        producer = "unknown"
    return {"producer": "torch-stablehlo-exporter", "producer_version": producer,
            "torch_version": torch.__version__, "jaxlib_version": jaxlib.__version__}
