"""Every setting this toolkit reads from the environment (``TORCH_STABLEHLO_*``): its variable, what it takes, its
default, parsed and checked here and nowhere else.

A value is read when the setting is used (so a test or a long-lived process may change it), parsed once per
distinct text, and a value that does not parse is a ``SettingError`` naming the variable, what it was set to and
what it takes: never a bare ``ValueError`` of ``int()`` deep in a compile, nor a bound of 0 that fails later.
Sizes are written as a person would: ``2GB``, ``500MB``, ``1.5GiB``, ``64KiB`` or a plain count of bytes
(``KB``/``MB``/``GB``/``TB`` are powers of 1000, ``KiB``/``MiB``/``GiB``/``TiB`` of 1024).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4,
          "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class SettingError(ValueError):
    """An environment setting that does not parse: names the variable, its value and what it takes."""


def parse_size(text: str) -> int:
    """Bytes from ``2GB``, ``500 MB``, ``1.5GiB``, ``4096``; ValueError for anything else (or below one byte)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if match is None or match[2].lower() not in _UNITS or len(match[1]) > 20:
        raise ValueError(text)
    size = math.floor(float(match[1]) * _UNITS[match[2].lower()])
    if size < 1:
        raise ValueError(text)
    return size


def _positive_int(text: str) -> int:
    if not re.fullmatch(r"\s*\d{1,18}\s*", text) or int(text) < 1:
        raise ValueError(text)
    return int(text)


def _positive_seconds(text: str) -> float:
    if not re.fullmatch(r"\s*\d{1,9}(\.\d+)?\s*", text) or float(text) <= 0:
        raise ValueError(text)
    return float(text)


def _flag(text: str) -> bool:
    if text.strip().lower() not in _TRUE + _FALSE:
        raise ValueError(text)
    return text.strip().lower() in _TRUE


def _cache_folder(text: str) -> Path | None:
    return None if text.strip().lower() == "off" else Path(text).expanduser()


@dataclass(frozen=True)
class Setting:
    variable: str
    takes: str                         # what a value may be, as the error message says it
    parse: Callable[[str], object]     # raises ValueError for a value it does not take
    default: object

    def value(self):
        """The setting's value now: its default where the variable is unset or empty."""
        text = os.environ.get(self.variable, "")
        return self.default if text == "" else _parsed(self, text)


@lru_cache(maxsize=256)
def _parsed(setting: Setting, text: str):
    try:
        return setting.parse(text)
    except ValueError:
        raise SettingError(f"${setting.variable}={text[:80]!r} is not a valid setting: it takes {setting.takes} "
                           f"(unset: {setting.default})") from None


SIZE = "a size such as 2GB, 500MB, 1.5GiB or a number of bytes"
MAX_EXECUTABLES = Setting("TORCH_STABLEHLO_MAX_EXECUTABLES", "a whole number of at least 1", _positive_int, 64)
"""Compiled executables kept in memory, in the process and per artifact; the least recently used is dropped."""
CACHE_DIR = Setting("TORCH_STABLEHLO_CACHE_DIR", "a folder, or 'off' (no disk cache)", _cache_folder,
                    Path.home() / ".cache" / "torch-stablehlo" / "executables")
CACHE_MAX_BYTES = Setting("TORCH_STABLEHLO_CACHE_MAX_BYTES", SIZE, parse_size, 2 * 1024 ** 3)
CACHE_SHARED = Setting("TORCH_STABLEHLO_CACHE_SHARED", f"one of {', '.join(_TRUE + _FALSE)}", _flag, False)
"""The cache folder is shared on purpose (others may write to it: see docs/security.md)."""
DEBUG = Setting("TORCH_STABLEHLO_DEBUG", f"one of {', '.join(_TRUE + _FALSE)}", _flag, False)
"""Print every compile and execution (``runtime.analysis``)."""
MAX_MANIFEST_BYTES = Setting("TORCH_STABLEHLO_MAX_MANIFEST_BYTES", SIZE, parse_size, 16 * 1024 ** 2)
"""A bundle's manifest.json larger than this is refused unparsed (parsing JSON costs ~25x its size in memory)."""
CHECK_MEMORY_BYTES = Setting("TORCH_STABLEHLO_CHECK_MEMORY", SIZE, parse_size, 1024 ** 3)
"""The memory the bytecode-checking child may take beyond what it holds after start-up (``bytecode_check``)."""
CHECK_SECONDS = Setting("TORCH_STABLEHLO_CHECK_SECONDS", "a number of seconds above 0", _positive_seconds, 60.0)
"""How long the bytecode-checking child may run."""
ENGINE_DIR = Setting("TORCH_STABLEHLO_ENGINE_DIR", "a folder", lambda text: Path(text).expanduser(),
                     Path.home() / ".cache" / "torch-stablehlo" / "engines")
"""Where ``torch-stablehlo serve`` keeps the engine bundles it exports from checkpoints (``serving.checkpoint``)."""
SETTINGS = (MAX_EXECUTABLES, CACHE_DIR, CACHE_MAX_BYTES, CACHE_SHARED, DEBUG, MAX_MANIFEST_BYTES, CHECK_MEMORY_BYTES,
            CHECK_SECONDS, ENGINE_DIR)
