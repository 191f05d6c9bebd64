"""Maps the repository's top-level folders into the one installed namespace, ``torch_stablehlo``.

The folders stay at the top of the repository (``exporter/``, ``aten_lowerings/``, ...) and install as
``torch_stablehlo.exporter``, ``torch_stablehlo.aten_lowerings``, ...; ``torch_stablehlo/`` itself holds
only the namespace's ``__init__`` (version check, public API), ``__main__``, ``supported.py`` and
``exported_program.py`` (the facts read off a torch.export program, below every package).
Everything else about the package is in ``pyproject.toml``.
"""
from setuptools import find_packages, setup

NAMESPACE = "torch_stablehlo"
FOLDERS = ["exporter", "aten_lowerings", "quantize", "runtime", "stablehlo_ir", "golden", "tools", "serving"]

setup(
    package_dir={NAMESPACE: NAMESPACE, **{f"{NAMESPACE}.{folder}": folder for folder in FOLDERS}},
    packages=[NAMESPACE] + [f"{NAMESPACE}.{package}" for folder in FOLDERS
                            for package in find_packages(include=[folder, f"{folder}.*"])],
    package_data={f"{NAMESPACE}.golden": ["data/*"]},
)
