"""Static tools see the package: mypy resolves every import of ``torch_stablehlo`` through the install.

    .venv/bin/python .ci/check_imports.py       # `make check-imports`; .ci/run runs it before `make test`

mypy (the version constraints.txt pins; settings in pyproject.toml's [tool.mypy]) runs from a folder outside the
checkout, so it finds ``torch_stablehlo`` as a tool in a user's editor would: through the venv's install (an
editable install is a plain path entry, ``torch_stablehlo/<folder>`` a link to each folder). It checks every
module of the package and a probe that imports each public name from ``torch_stablehlo``. The check fails (exit
status 1) on any import of ``torch_stablehlo`` that mypy cannot resolve (a module not found, a name its module
lacks, a relative import with no parent) and on a public name that mypy sees as ``Any``. mypy's other findings
(types, third-party stubs) are counted, not checked: this is the import check.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "torch_stablehlo"
LINE = re.compile(r"^(?P<where>.+?:\d+): (?P<kind>error|note): (?P<message>.*?)(?:  \[(?P<code>[a-z-]+)\])?$")
# mypy's words for an import it could not resolve: (error code or None, text the message holds)
UNRESOLVED = (("import-not-found", ""), ("import-untyped", f'"{NAMESPACE}'), ("import-untyped", '".'),
              ("attr-defined", f'Module "{NAMESPACE}'), (None, "No parent module -- cannot perform relative import"),
              (None, "Cannot find implementation or library stub"))


def public_names() -> list[str]:
    """``exporter.__all__`` (the names ``torch_stablehlo`` re-exports), read from the source."""
    tree = ast.parse((REPO / "exporter" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            return ast.literal_eval(node.value)
    raise SystemExit("check_imports: exporter/__init__.py has no literal __all__")


def unresolved(code: str | None, message: str) -> bool:
    return any((wanted is None or code == wanted) and text in message for wanted, text in UNRESOLVED)


def main() -> int:
    started = time.perf_counter()
    spec = importlib.util.find_spec(NAMESPACE)
    found = Path(spec.origin).parent if spec and spec.origin else None
    if found != REPO / NAMESPACE:
        print(f"check_imports: this Python finds {NAMESPACE} at {found}, not in this checkout ({REPO}): "
              f"install it with `make` (pip install -e .)", file=sys.stderr)
        return 1
    names = public_names()
    with tempfile.TemporaryDirectory(prefix="check-imports-") as work:
        probe = Path(work) / "public_api_probe.py"
        probe.write_text(f"from {NAMESPACE} import {', '.join(names)}\n"
                         + "".join(f"reveal_type({name})\n" for name in names))
        result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                                 "--cache-dir", str(REPO / ".mypy_cache"), "-p", NAMESPACE, "-m", probe.stem],
                                cwd=work, capture_output=True, text=True)
        lines = [LINE.match(line) for line in result.stdout.splitlines()]
        summary = result.stdout.strip().splitlines()[-1:] or [""]
        checked = re.search(r"(\d+) source files?", summary[0])
        if result.returncode not in (0, 1) or not checked:
            print(f"check_imports: mypy exited {result.returncode}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}",
                  file=sys.stderr)
            return 1
        bad = [match[0] for match in lines if match and match["kind"] == "error"
               and unresolved(match["code"], match["message"])]
        revealed = [match for match in lines if match and Path(match["where"].rsplit(":", 1)[0]).name == probe.name
                    and match["message"].startswith("Revealed type is")]
        as_any = [names[int(match["where"].rsplit(":", 1)[1]) - 2] for match in revealed
                  if match["message"] == 'Revealed type is "Any"']
    errors = sum(1 for match in lines if match and match["kind"] == "error")
    if len(revealed) != len(names):
        bad.append(f"mypy revealed {len(revealed)} types for the {len(names)} public names:\n{result.stdout[-3000:]}")
    bad += [f"from {NAMESPACE} import {name}: mypy sees Any, not the name itself" for name in as_any]
    if bad:
        print(f"check_imports: FAILED: {len(bad)} imports of {NAMESPACE} that mypy does not resolve, or sees as Any:",
              file=sys.stderr)
        print("\n".join(bad), file=sys.stderr)
        return 1
    print(f"check_imports: mypy resolved every import of {NAMESPACE} in {checked[1]} files and saw the "
          f"{len(names)} public names as themselves ({errors} other findings of mypy, not checked "
          f"here); {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
