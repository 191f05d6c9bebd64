"""The layer table holds: each package imports only packages of lower layers (never one of its own layer or
above), read from the imports of every .py file with ``ast``. The table is ``torch_stablehlo.package_layers``
(one place in code); README's "Layout" table shows it, and a test here checks that the two agree.

The namespace root ``torch_stablehlo/`` is two things: its ``__init__`` (the public API, re-exported) and
``__main__`` (the CLI) sit above everything and are not checked; its other modules (``supported``,
``exported_program``, ``package_layers``) are the table's layer 0, below every package: they import no package.

Imports are resolved here, from the source alone: absolute ones (``torch_stablehlo.<package>...``), relative ones
(``from ..runtime import pjrt``, climbing out of a package into the namespace), ``from torch_stablehlo import
<public name>`` (the exporter's API, re-exported by the namespace) and ``importlib.import_module("...")`` with a
literal name. An import of a package's folder as a top-level module (``import exporter``) is an error wherever
it is: it would load a second copy.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from torch_stablehlo import package_layers

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "torch_stablehlo"
PUBLIC_API = "exporter"  # `torch_stablehlo.<name>` for a name of exporter.__all__ (torch_stablehlo/__init__.py)
FACADE = {"__init__.py", "__main__.py"}  # of the namespace root: above everything, not checked
# the namespace root's other modules (supported.py, exported_program.py, ...): an import of one counts as one of
# the root's layer (0), which every package may import
BASE = {path.stem for path in (ROOT / NAMESPACE).glob("*.py") if path.name not in FACADE}


LAYERS = package_layers.LAYER_OF  # package folder -> layer number (higher layers import lower ones)


def readme_table() -> dict[str, int]:
    """README's "Layout" table, as package folder -> layer number."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Layout"):]
    section = section[:section.index("\n## ", 1)]
    return {match["package"]: int(match["layer"]) for match in
            re.finditer(r"^\|\s*(?P<layer>\d+)\s*\|\s*`(?P<package>\w+)/`\s*\|", section, re.M)}


def files(package: str) -> list[Path]:
    """The package's .py files; for the namespace root, its modules besides the facade (not its subfolders)."""
    if package == NAMESPACE:
        return sorted(path for path in (ROOT / NAMESPACE).glob("*.py") if path.name not in FACADE)
    return sorted(path for path in (ROOT / package).rglob("*.py") if "__pycache__" not in path.parts)


def module_parts(path: Path) -> list[str]:
    """``exporter/formats/bundle.py`` -> ``['torch_stablehlo', 'exporter', 'formats', 'bundle']``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != NAMESPACE:
        parts.insert(0, NAMESPACE)
    return parts


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, what) for every import of the package in ``path``: what is a package folder, ``torch_stablehlo``
    (a module of the namespace root) or ``top-level <name>`` for a package folder or root module imported as a
    top-level module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parts = module_parts(path)
    package = parts[:-1]  # a module's package; for `x/__init__.py` (parts end in `__init__`), `x` itself
    found = []

    def named(line: int, dotted: list[str], names: list[str] = ()):
        if not dotted:
            return
        if dotted[0] != NAMESPACE:
            if dotted[0] in LAYERS or dotted[0] in BASE:
                found.append((line, f"top-level {dotted[0]}"))
            return
        for name in dotted[1:2] or names or [None]:  # `from torch_stablehlo import x` or `import torch_stablehlo`
            found.append((line, name if name in LAYERS and name != NAMESPACE
                          else NAMESPACE if name in BASE else PUBLIC_API))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                named(node.lineno, alias.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names]
            if node.level == 0:
                named(node.lineno, node.module.split("."), names)
                continue
            assert node.level <= len(package), f"{path}:{node.lineno}: relative import beyond {NAMESPACE}"
            base = package[:len(package) - (node.level - 1)]
            named(node.lineno, base + (node.module.split(".") if node.module else []), names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) ==
              "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and not node.args[0].value.startswith(".")):
            named(node.lineno, node.args[0].value.split("."))
    return found


def test_the_table_names_every_package():
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests", NAMESPACE}
    assert packages <= set(LAYERS), f"package_layers.LAYERS lacks {sorted(packages - set(LAYERS))}"
    others = set(LAYERS) - packages - {NAMESPACE}
    assert others == set(package_layers.SCRIPTS), f"package_layers.LAYERS names {sorted(others)}, not packages"
    for folder in package_layers.SCRIPTS:
        assert (ROOT / folder).is_dir() and not (ROOT / folder / "__init__.py").exists(), \
            f"package_layers.SCRIPTS names {folder}, which is not a folder of scripts"


def test_readme_shows_the_table():
    assert readme_table() == LAYERS, (
        "README's Layout table differs from torch_stablehlo/package_layers.py: README has "
        f"{sorted(readme_table().items())}, the code {sorted(LAYERS.items())}")


def test_the_namespace_root_is_the_bottom_layer():
    assert LAYERS.get(NAMESPACE) == 0 < min(layer for package, layer in LAYERS.items() if package != NAMESPACE)
    assert {"supported", "exported_program", "package_layers"} <= BASE


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_a_package_imports_only_lower_layers(package):
    wrong = []
    for path in files(package):
        for line, what in imported(path):
            if what.startswith("top-level "):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports the folder as a module ({what}); "
                             f"use {NAMESPACE}.{what.split()[1]} or a relative import")
            elif what != package and not LAYERS[what] < LAYERS[package]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {what} (layer {LAYERS[what]}) from "
                             f"{package} (layer {LAYERS[package]})")
    assert not wrong, "imports against the layer table (torch_stablehlo/package_layers.py):\n" + "\n".join(wrong)


def test_the_namespace_root_modules_import_no_package():
    for path in files(NAMESPACE):
        assert {what for _, what in imported(path)} <= {NAMESPACE}, path


def test_the_resolution_itself(tmp_path, monkeypatch):
    """The resolver on a made-up module in ``exporter/formats/``: relative imports climbing into the namespace,
    absolute ones, the namespace's public names, top-level folder names and import_module."""
    source = '''
import torch
from . import bundle
from .. import api
from ...runtime import pjrt
from ... import golden, supported, export_to_stablehlo
from torch_stablehlo.quantize import plain_quantized_weights
import torch_stablehlo.tools.cli
from torch_stablehlo import export_to_stablehlo
import stablehlo_ir.passes
def lazy():
    import importlib
    importlib.import_module("torch_stablehlo.aten_lowerings")
'''
    folder = tmp_path / "exporter" / "formats"
    folder.mkdir(parents=True)
    (folder / "made_up.py").write_text(source)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert sorted(imported(folder / "made_up.py")) == [
        (3, "exporter"), (4, "exporter"), (5, "runtime"), (6, "exporter"), (6, "golden"), (6, "torch_stablehlo"),
        (7, "quantize"), (8, "tools"), (9, "exporter"), (10, "top-level stablehlo_ir"), (13, "aten_lowerings")]
