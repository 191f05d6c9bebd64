"""One import namespace, stated dependency ranges, the import-time version check, the public entry points.

The repository's folders install as ``torch_stablehlo.<folder>`` through the links ``torch_stablehlo/<folder> ->
../<folder>`` (the folders: ``torch_stablehlo.package_layers.FOLDERS``), so ``torch_stablehlo`` is a plain package
on disk that static tools resolve, and an editable install is a plain path entry. Nothing of the package may be
imported under a top-level name as well (two copies of a module are two registries).
``torch_stablehlo.supported.SUPPORTED``, pyproject.toml's dependency ranges and constraints.txt's pins must agree.
``.ci/wheel_smoke.py`` checks the same things on the built wheel, installed alone into a fresh venv.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

import torch_stablehlo
from torch_stablehlo import package_layers, supported

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "torch_stablehlo"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


FOLDERS = list(package_layers.FOLDERS)  # the repository folders installed as torch_stablehlo.<folder>


def constraints() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not NAME==VERSION"
            pins[canonicalize_name(name)] = Version(version.strip())
    return pins


def requirements(extras: bool) -> list[Requirement]:
    texts = list(PYPROJECT["dependencies"])
    if extras:
        texts += [t for group in PYPROJECT["optional-dependencies"].values() for t in group]
    return [r for r in map(Requirement, texts) if canonicalize_name(r.name) != canonicalize_name(PYPROJECT["name"])]


# -- one namespace -------------------------------------------------------------------------------------------

def test_every_repository_package_is_installed_under_the_namespace():
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests", NAMESPACE}
    assert sorted(FOLDERS) == sorted(packages), "package_layers.FOLDERS are not the repository's packages"
    folders = {path.name: path for path in (ROOT / NAMESPACE).iterdir() if path.name != "__pycache__"
               and (path.is_dir() or path.is_symlink())}
    assert sorted(folders) == sorted(FOLDERS), (
        f"{NAMESPACE}/ holds {sorted(folders)}, not a link to each of {FOLDERS}: ln -s ../NAME {NAMESPACE}/NAME")
    for folder, path in folders.items():
        assert path.is_symlink() and os.readlink(path) == f"../{folder}", f"{path} is not a link to ../{folder}"
    spec = importlib.util.spec_from_file_location("wheel_smoke", ROOT / ".ci" / "wheel_smoke.py")
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    assert list(smoke.FOLDERS) == FOLDERS, ".ci/wheel_smoke.py's FOLDERS differ from package_layers.FOLDERS"
    assert set(smoke.RANGED) == set(supported.SUPPORTED)


def test_the_editable_install_is_a_plain_path_entry():
    """No import hook: the installed distribution maps ``torch_stablehlo`` by a path entry (a ``.pth`` naming the
    folder that holds it), which static tools follow; an import hook (a finder module) is what they cannot."""
    installed = metadata.distribution(PYPROJECT["name"])
    files = [str(f) for f in installed.files or ()]
    assert not [f for f in files if f.endswith("_finder.py")], f"installed through an import hook: {files}"
    entries = [line.strip() for f in files if f.endswith(".pth")
               for line in installed.locate_file(f).read_text().splitlines() if line.strip()]
    # an editable install (make's .venv) names the checkout; a wheel installs the package itself, no .pth
    assert all(Path(entry, NAMESPACE, "__init__.py").is_file() for entry in entries), entries


WALK = """
import importlib, json, pkgutil, sys
folders = {folders!r}
import torch_stablehlo
todo = [torch_stablehlo]
imported = {{"torch_stablehlo": torch_stablehlo.__file__}}
while todo:
    package = todo.pop()
    for found in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if found.name.endswith(".__main__") or found.name in imported:
            continue
        module = importlib.import_module(found.name)
        imported[found.name] = module.__file__
        if found.ispkg:
            todo.append(module)
tops = sorted(n for n in sys.modules if n.split(".")[0] in folders)
print(json.dumps({{"imported": imported, "tops": tops}}))
"""


def test_importing_every_module_loads_each_once_under_the_namespace(tmp_path):
    """A fresh interpreter imports every module of the package (walked with pkgutil from ``torch_stablehlo``, a
    plain package on disk): none is also in sys.modules under a top-level name, and each comes from its folder,
    found through the namespace's link to it. Another checkout is on the path too, after this one (as a venv that
    two checkouts share names the one it was installed from): not one module comes from it."""
    other = tmp_path / "other_checkout"
    other.mkdir()
    (other / NAMESPACE).symlink_to(ROOT / NAMESPACE)  # the same modules, under paths outside this checkout
    result = subprocess.run([sys.executable, "-c", WALK.format(folders=FOLDERS)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
                                                         "PYTHONPATH": str(other)})
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["tops"] == [], f"imported under a top-level name too (a second copy): {found['tops']}"
    imported = found["imported"]
    for folder in FOLDERS:
        assert any(name.startswith(f"{NAMESPACE}.{folder}.") for name in imported), folder
    for name, file in imported.items():
        folder = name.split(".")[1] if name.count(".") else NAMESPACE
        folder = folder if folder in FOLDERS else NAMESPACE
        assert Path(file).resolve().is_relative_to(ROOT / folder), f"{name} imported from {file}"
        assert Path(file).is_relative_to(ROOT / NAMESPACE), f"{name} imported from {file}, not through {NAMESPACE}/"
    assert len(imported) > 100


# -- dependency ranges -----------------------------------------------------------------------------------------

def test_supported_ranges_are_pyproject_ranges():
    stated = {canonicalize_name(r.name): r for r in requirements(extras=False)}
    for name, (low, high) in supported.SUPPORTED.items():
        requirement = stated.get(canonicalize_name(name))
        assert requirement is not None, f"pyproject.toml does not depend on {name}"
        expected = SpecifierSet(f">={supported.spell(low)},<{supported.spell(high)}")
        assert requirement.specifier == expected, (
            f"pyproject.toml says {requirement}, torch_stablehlo/supported.py {supported.requirement(name)}")
        assert not any(s.operator in ("==", "===", "~=") for s in requirement.specifier), requirement
        assert Requirement(supported.requirement(name)).specifier == expected


def test_constraints_pin_versions_inside_the_ranges():
    pins = constraints()
    for name in [*supported.SUPPORTED, *(r.name for r in requirements(extras=False))]:
        assert canonicalize_name(name) in pins, f"constraints.txt pins no version of {name}, a core dependency"
    for requirement in requirements(extras=True):
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is not None:
            assert requirement.specifier.contains(pin, prereleases=True), (
                f"constraints.txt pins {requirement.name}=={pin}, outside pyproject.toml's {requirement}")
    for name, (low, high) in supported.SUPPORTED.items():
        assert low <= supported.release(str(pins[canonicalize_name(name)])) < high, name


def test_the_venv_has_the_pinned_versions():
    """``make`` installs with ``-c constraints.txt``: the versions tests run against are the pinned ones."""
    for name, pin in constraints().items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
        assert Version(installed.public) == pin, f"{name} {installed} is installed, constraints.txt pins {pin}"


# -- the version check at import ---------------------------------------------------------------------------------

def fake_versions(monkeypatch, **versions):
    real = metadata.version

    def version(name):
        if name in versions:
            if versions[name] is None:
                raise metadata.PackageNotFoundError(name)
            return versions[name]
        return real(name)

    monkeypatch.setattr(metadata, "version", version)


@pytest.mark.parametrize("versions, says", [
    ({"torch": "2.14.0"}, ["torch 2.14.0 is installed", "torch>=2.13.0,<2.14.0"]),
    ({"torch": "2.12.1+cpu"}, ["torch 2.12.1+cpu is installed", "torch>=2.13.0,<2.14.0"]),
    ({"jax": "0.9.0", "jaxlib": "0.11.0"}, ["jax 0.9.0 is installed, this torch_stablehlo supports "
                                            "jax>=0.10.2,<0.11.0", "jaxlib 0.11.0 is installed"]),
    ({"jaxlib": None}, ["jaxlib is not installed (need jaxlib>=0.10.2,<0.11.0)"]),
])
def test_a_version_outside_the_range_raises_saying_which(monkeypatch, versions, says):
    fake_versions(monkeypatch, **versions)
    with pytest.raises(supported.UnsupportedVersionError) as raised:
        supported.check_installed()
    message = str(raised.value)
    for text in says + ["pip install 'torch>=2.13.0,<2.14.0' 'jax>=0.10.2,<0.11.0' 'jaxlib>=0.10.2,<0.11.0'"]:
        assert text in message, message
    assert isinstance(raised.value, ImportError)


@pytest.mark.parametrize("version", ["2.13.0", "2.13.5+cu128", "2.13.1rc1"])
def test_versions_inside_the_range_pass(monkeypatch, version):
    fake_versions(monkeypatch, torch=version)
    supported.check_installed()


def test_the_check_runs_when_the_package_is_imported():
    code = textwrap.dedent("""
        from importlib import metadata
        real = metadata.version
        metadata.version = lambda name: "2.12.0" if name == "torch" else real(name)
        import torch_stablehlo.runtime
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("torch_stablehlo.supported.UnsupportedVersionError: torch 2.12.0 is installed, "
                           "this torch_stablehlo supports torch>=2.13.0,<2.14.0"), result.stderr[-2000:]


# -- public entry points -------------------------------------------------------------------------------------

def test_the_public_api_is_importable_from_the_namespace():
    from torch_stablehlo import export_to_stablehlo, load_artifact
    from torch_stablehlo.exporter import __all__ as public

    exporter = importlib.import_module(f"{NAMESPACE}.exporter")
    assert export_to_stablehlo is exporter.export_to_stablehlo and load_artifact is exporter.load_artifact
    assert torch_stablehlo.__all__ == public and set(public) <= set(dir(torch_stablehlo))
    with pytest.raises(AttributeError, match="no_such_name"):
        torch_stablehlo.no_such_name  # noqa: B018


def test_python_m_torch_stablehlo_help():
    result = subprocess.run([sys.executable, "-m", NAMESPACE, "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for command in ("export", "run", "verify", "inspect", "coverage", "explore", "iree"):
        assert re.search(rf"\b{command}\b", result.stdout), (command, result.stdout)
