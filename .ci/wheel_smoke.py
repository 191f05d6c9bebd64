"""What a user installs, checked: the wheel built from this checkout, installed alone into a fresh venv.

    python .ci/wheel_smoke.py build DIST            # the wheel from the checkout's files (a copy), into DIST
    python .ci/wheel_smoke.py check WHEEL           # its contents and metadata (any Python >= 3.11)
    VENV/bin/python -I .ci/wheel_smoke.py smoke     # in the venv the wheel was installed into, from a folder
                                                    # outside the checkout: import, export, run, save, load, CLI

``.ci/run`` runs the three in turn. Every check raises (exit status 1) with what it found; nothing is skipped.
``smoke`` must not see the checkout: ``-I`` keeps the script's folder and $PYTHONPATH off ``sys.path``, and the
script refuses to run when ``torch_stablehlo`` is not imported from the venv's site-packages.
"""
from __future__ import annotations

import email.parser
import importlib
import os
import pkgutil
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

NAMESPACE = "torch_stablehlo"
DISTRIBUTION = "torch-stablehlo-exporter"
REPO = Path(__file__).resolve().parent.parent
# the repository's folders that install as torch_stablehlo.<folder>: none may be importable at the top level
# (read from the checkout's layer table, a module that imports nothing: run, not imported from the checkout)
FOLDERS = runpy.run_path(str(REPO / NAMESPACE / "package_layers.py"))["FOLDERS"]
RANGED = ("torch", "jax", "jaxlib")  # dependencies that must be stated as ranges (code uses their internals)
# import name -> the extra that installs it: a module of the package needing one of these may fail to import
# in the core install (``smoke``), and only with that import's ModuleNotFoundError
OPTIONAL = {"transformers": "golden", "tensorflow": "serving", "torchao": "quant", "model_explorer": "explore",
            "iree": "dev", "anyio": "serve", "fastapi": "serve", "starlette": "serve", "pydantic": "serve",
            "uvicorn": "serve", "prometheus_client": "serve", "ray": "serve"}


class CheckFailed(SystemExit):
    def __init__(self, message: str):
        super().__init__(f"wheel_smoke: FAILED: {message}")


def require(condition, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


# -- build -------------------------------------------------------------------------------------------------

def build(dist: Path) -> Path:
    """Build the wheel from a copy of the checkout's files (tracked, and untracked ones git does not ignore; links
    copied as links): setuptools' in-tree ``build/`` keeps files from earlier builds, which would end up in the
    wheel."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True).stdout.decode().split("\0")
    with tempfile.TemporaryDirectory(prefix="wheel-src-") as source:
        for name in filter(None, listed):
            path, copy = REPO / name, Path(source) / name
            if path.is_symlink():  # torch_stablehlo/<folder> -> ../<folder>: the link itself
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.symlink_to(os.readlink(path))
            elif path.is_file():  # a file deleted in the work tree but still in the index is left out
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, copy)
        dist.mkdir(parents=True, exist_ok=True)
        before = set(dist.glob("*.whl"))
        result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), source],
                                capture_output=True, text=True)
        require(result.returncode == 0, f"pip wheel exited {result.returncode}:\n{result.stdout[-3000:]}"
                                        f"{result.stderr[-3000:]}")
    wheels = sorted(set(dist.glob("*.whl")) - before)
    require(len(wheels) == 1, f"pip wheel wrote {len(wheels)} new wheels to {dist}, not 1: {wheels}")
    print(wheels[0])
    return wheels[0]


# -- check ---------------------------------------------------------------------------------------------------

def pyproject_dependencies() -> dict[str, str]:
    """pyproject.toml's [project] dependencies: distribution name -> its version specifier text."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return dict(split_requirement(text) for text in project["dependencies"])


def split_requirement(text: str) -> tuple[str, str]:
    """``'torch<2.14.0,>=2.13.0'`` -> ``('torch', '<2.14.0,>=2.13.0')`` (markers and extras are left out)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?([^;)]*)\)?", text)
    require(match, f"cannot read the requirement {text!r}")
    return match[1].lower().replace("_", "-"), match[2].strip()


def specifiers(text: str) -> set[str]:
    return {part.replace(" ", "") for part in text.split(",") if part.strip()}


def check(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = [n for n in {name.split("/")[0] for name in names} if n.endswith(".dist-info")]
        require(len(info) == 1, f"{wheel.name}: {len(info)} .dist-info folders: {info}")
        info = info[0]
        record = archive.read(f"{info}/RECORD").decode()
        metadata = email.parser.Parser().parsestr(archive.read(f"{info}/METADATA").decode())
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    recorded = [line.rsplit(",", 2)[0] for line in record.splitlines() if line.strip()]
    tops = {name.split("/")[0] for name in names + recorded} - {info}
    require(tops == {NAMESPACE}, f"{wheel.name} installs top-level {sorted(tops)}, not only {NAMESPACE!r}: "
                                 "two import names for one module would mean two copies of every registry")
    require(sorted(recorded) == sorted(names), f"{wheel.name}: RECORD and the archive list different files: "
                                               f"{sorted(set(recorded) ^ set(names))[:10]}")
    for folder in FOLDERS:
        require(f"{NAMESPACE}/{folder}/__init__.py" in names, f"{wheel.name} lacks {NAMESPACE}.{folder}")
    require(any(n.startswith(f"{NAMESPACE}/golden/data/") for n in names), f"{wheel.name} lacks golden/data")
    require(f"{NAMESPACE}/py.typed" in names, f"{wheel.name} lacks py.typed: users' type checkers would skip it")
    require(not [n for n in names if "/tests/" in n or n.startswith(f"{NAMESPACE}/bench/")],
            f"{wheel.name} ships tests or bench scripts")

    required = dict(split_requirement(text) for text in metadata.get_all("Requires-Dist", [])
                    if "extra ==" not in text)
    stated = pyproject_dependencies()
    for name in RANGED:
        spec = required.get(name)
        require(spec is not None, f"{wheel.name}: no Requires-Dist for {name} (has {sorted(required)})")
        parts = specifiers(spec)
        require(not any(p.startswith(("==", "===", "~=")) for p in parts),
                f"{wheel.name}: Requires-Dist {name}{spec} pins a version; it must be a range (>=low,<high)")
        require(any(p.startswith(">=") for p in parts) and any(p.startswith("<") for p in parts),
                f"{wheel.name}: Requires-Dist {name}{spec} is not a range with a lower and an upper bound")
        require(parts == specifiers(stated[name]),
                f"{wheel.name}: Requires-Dist {name}{spec} differs from pyproject.toml's {name}{stated[name]}")
    require(set(required) == set(stated), f"{wheel.name}: Requires-Dist names {sorted(required)}, pyproject.toml "
                                          f"{sorted(stated)}")
    for script, target in (("torch-stablehlo", f"{NAMESPACE}.tools.cli:main"),
                           ("stablehlo-golden", f"{NAMESPACE}.golden.verify:main")):
        require(re.search(rf"^{re.escape(script)}\s*=\s*{re.escape(target)}\s*$", entry_points, re.M),
                f"{wheel.name}: no console script {script} = {target}")
    print(f"wheel {wheel.name}: {len(names)} files, top-level {sorted(tops)}; Requires-Dist "
          + ", ".join(f"{n}{required[n]}" for n in RANGED))


# -- smoke (inside the wheel's venv) -------------------------------------------------------------------------

def import_every_module() -> tuple[list[str], dict[str, str]]:
    """Import every module of the installed package (its ``__main__`` aside, which runs the CLI); returns the
    modules imported and, per module that needs an optional extra not installed, the extra."""
    import torch_stablehlo

    imported, needs_extra, todo = [NAMESPACE], {}, [torch_stablehlo]
    while todo:
        package = todo.pop()
        for found in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if found.name.endswith(".__main__"):
                continue
            try:
                module = importlib.import_module(found.name)
            except ModuleNotFoundError as error:
                missing = (error.name or "").split(".")[0]
                require(missing in OPTIONAL, f"import {found.name}: {error} (not an optional extra's module)")
                needs_extra[found.name] = OPTIONAL[missing]
                continue
            imported.append(found.name)
            if found.ispkg:
                todo.append(module)
    return imported, needs_extra


def run(command: list[str], cwd: Path, expect: str) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    require(result.returncode == 0, f"`{' '.join(command)}` exited {result.returncode}:\n{result.stderr[-3000:]}")
    require(expect in result.stdout, f"`{' '.join(command)}` printed no {expect!r}:\n{result.stdout[-3000:]}")
    return result.stdout


def smoke() -> None:
    started = time.perf_counter()
    work = Path.cwd()
    require(REPO not in work.resolve().parents and work.resolve() != REPO,
            f"run smoke from a folder outside the checkout (not {work})")
    import torch

    import torch_stablehlo
    from torch_stablehlo import export_to_stablehlo, load_artifact

    venv = Path(sys.prefix)
    location = Path(torch_stablehlo.__file__).resolve()
    require(venv.resolve() in location.parents, f"torch_stablehlo imported from {location}, not from the venv "
                                                f"{venv}: the checkout (or an editable install) is on sys.path")
    require(not any(Path(p or ".").resolve() == REPO for p in sys.path), f"the checkout is on sys.path: {sys.path}")

    imported, needs_extra = import_every_module()
    doubles = sorted(name for name in sys.modules if name.split(".")[0] in FOLDERS)
    require(not doubles, f"modules imported under a top-level name as well as under {NAMESPACE}: {doubles}")
    outside = sorted(name for name in imported
                     if venv.resolve() not in Path(sys.modules[name].__file__).resolve().parents)
    require(not outside, f"modules imported from outside the venv: {outside}")
    print(f"imported {len(imported)} modules of {NAMESPACE} from {location.parent}; needing an extra not "
          f"installed: {', '.join(f'{m} [{e}]' for m, e in sorted(needs_extra.items())) or 'none'}")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        expected = model(x)
    batch = torch.export.Dim("batch", min=1, max=64)
    artifact = export_to_stablehlo(model, (x,), dynamic_shapes=({0: batch},))
    require("stablehlo." in artifact.stablehlo_text, "the artifact's text has no StableHLO op")
    torch.testing.assert_close(artifact(x), expected)
    bigger = torch.randn(5, 8)
    with torch.no_grad():
        torch.testing.assert_close(artifact(bigger), model(bigger))
    bundle = artifact.save(work / "bundle")
    reloaded = load_artifact(bundle)
    torch.testing.assert_close(reloaded(x), expected)
    print(f"exported, ran on PJRT (batch 2 and 5) and matched eager; saved {bundle} and reloaded it")

    scripts = Path(sys.executable).parent
    run([str(scripts / "torch-stablehlo"), "inspect", str(bundle)], work, "batch")
    run([sys.executable, "-m", NAMESPACE, "--help"], work, "inspect")
    run([str(scripts / "stablehlo-golden"), "--only", "mlp"], work, "mlp")  # golden/data came with the wheel
    print(f"torch-stablehlo inspect, python -m {NAMESPACE} --help and stablehlo-golden --only mlp ran; "
          f"smoke passed in {time.perf_counter() - started:.1f} s")


def main(argv: list[str]) -> None:
    if argv[:1] == ["build"] and len(argv) == 2:
        build(Path(argv[1]))
    elif argv[:1] == ["check"] and len(argv) == 2:
        check(Path(argv[1]))
    elif argv == ["smoke"]:
        smoke()
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main(sys.argv[1:])
