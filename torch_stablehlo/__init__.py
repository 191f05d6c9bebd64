"""torch -> StableHLO, proven on PJRT: ``from torch_stablehlo import export_to_stablehlo, load_artifact``.

The packages below are the project's folders: ``exporter`` (the whole public API, re-exported here),
``aten_lowerings``, ``quantize``, ``runtime``, ``stablehlo_ir``, ``golden`` and ``tools``. Importing any of
them first checks that the installed torch and JAX are versions this code supports (``supported.py``).
The public names are loaded on first use, so ``import torch_stablehlo.runtime`` stays light.
"""
import importlib
from typing import TYPE_CHECKING

from .supported import check_installed

if TYPE_CHECKING:  # what static tools see: the public names themselves (at run time, __getattr__ below)
    from .exporter import *  # noqa: F403

check_installed()


def _public():
    """The public API: the ``exporter`` package's ``__all__`` (imported on first use)."""
    return importlib.import_module(".exporter", __name__)


def __getattr__(name: str):
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    exporter = _public()
    if name == "__all__":
        return exporter.__all__
    if name in exporter.__all__:
        return getattr(exporter, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_public().__all__))
