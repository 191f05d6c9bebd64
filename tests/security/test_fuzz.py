"""Bounded fuzzing of the trust boundary: random mutations of a bundle's manifest fields and of its bytecode (sizes
and checksums kept consistent, so the checks behind them are reached). Every load either succeeds or raises
BundleError; a loaded bundle's call raises nothing but the exporter's own errors; nothing outside the bundle is
opened (an audit hook records Python's opens). A fixed sample runs by default; ``--full-sweep`` (``make
test-full``) runs a few hundred. Bytecode mutations run in a subprocess (crash-prone by nature)."""
import json
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from torch_stablehlo.exporter import BundleError, load_artifact
from torch_stablehlo.exporter.errors import ExportError, InputError, WeightsError
from torch_stablehlo.stablehlo_ir.specs import DTYPES_BY_NAME

from ..conftest import full_sweep
from .bundles import opened_files, outside, read_manifest, write_manifest

ROOT = Path(__file__).parents[2]
ODD_VALUES = [None, True, -1, 0, 3, 10 ** 30, 2 ** 62, 1.5, "int32", "bfloat16", "", "batch", "../weights.safetensors", "/etc/passwd",
              "weights.safetensors", "batch + 0*__import__('os').getpid()", "(" * 40, [], {}, [[[[]]]], [1, None],
              {"type": "builtins.dict"}, "float64", "user_input", "parameter", "state", "rng_seed", "int"]
CALL_ERRORS = (InputError, BundleError, WeightsError, ExportError)


def _cases(config, sample: int, full: int) -> range:
    return range(full if full_sweep(config) else sample)


def _places(value, path=()):
    """Every (container path, key) in a JSON value, containers included."""
    places = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, child in items:
        places.append((path, key))
        places += _places(child, path + (key,))
    return places


def mutate(manifest: dict, rng: random.Random) -> str:
    """Apply one random change to ``manifest`` in place; returns what it did."""
    path, key = rng.choice(_places(manifest))
    container = manifest
    for step in path:
        container = container[step]
    choice = rng.random()
    if choice < 0.15 and isinstance(container, dict):
        del container[key]
        return f"deleted {path + (key,)}"
    if choice < 0.25 and isinstance(container, list):
        container.append(container[key])
        return f"duplicated {path + (key,)}"
    if choice < 0.35 and isinstance(container[key], str) and container[key]:
        text = container[key]
        cut = rng.randrange(len(text))
        container[key] = text[:cut] + rng.choice(["[", "]", "{", "\"", "../", "0", "__import__"]) + text[cut + 1:]
        return f"edited the text at {path + (key,)}"
    container[key] = rng.choice(ODD_VALUES)
    return f"set {path + (key,)} to {container[key]!r}"


@pytest.fixture(scope="module")
def pristine(small, tmp_path_factory):
    return small[1].save(tmp_path_factory.mktemp("fuzz") / "pristine")


def pytest_generate_tests(metafunc):
    if "manifest_case" in metafunc.fixturenames:
        metafunc.parametrize("manifest_case", _cases(metafunc.config, 40, 400))


def test_a_mutated_manifest_loads_or_is_a_bundle_error(pristine, tmp_path, manifest_case):
    path = Path(shutil.copytree(pristine, tmp_path / "bundle"))
    rng = random.Random(manifest_case)
    manifest = read_manifest(path)
    changes = [mutate(manifest, rng) for _ in range(rng.choice([1, 1, 2, 3]))]
    write_manifest(path, manifest)
    with opened_files() as opened, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            artifact = load_artifact(path)
        except BundleError:
            artifact = None
        assert outside(opened, path) == [], changes
        if artifact is not None:
            try:
                artifact(torch.randn(3, 8))
            except CALL_ERRORS:
                pass


TYPED_FIELDS = ("dtype", "shape", "bytes", "format_version", "stablehlo_version", "format")
HUGE = 987654321987654321  # written as an integer of 5000 digits (past Python's int() limit)
TYPED_VALUES = [*sorted(DTYPES_BY_NAME), "float99", 2 ** 31, 2 ** 62, 2 ** 63 - 1, 2 ** 63, -1, 0, HUGE,
                [2 ** 62, 3], [2 ** 40, 2 ** 40], [HUGE], [], "3", "1.0.99999", True]


def mutate_typed(manifest: dict, rng: random.Random) -> str:
    """Set one dtype, shape (or one of its sizes), bytes or version field of ``manifest`` to an odd value."""
    places = [(path, key) for path, key in _places(manifest)
              if key in TYPED_FIELDS or (path and path[-1] == "shape")]
    path, key = rng.choice(places)
    container = manifest
    for step in path:
        container = container[step]
    container[key] = rng.choice(TYPED_VALUES)
    return f"set {path + (key,)} to {container[key]!r}"


@pytest.mark.parametrize("typed_case", range(24))
def test_a_mutated_dtype_or_size_loads_or_is_a_bundle_error(request, pristine, tmp_path, typed_case):
    """Dtype fields, sizes (huge products, integers of 5000 digits) and versions: a load succeeds or is a
    BundleError, and a loaded bundle's call raises only the exporter's errors. 24 cases; --full-sweep: 240."""
    for case in range(typed_case, typed_case + (240 if full_sweep(request.config) else 24), 24):
        path = Path(shutil.copytree(pristine, tmp_path / f"bundle{case}"))
        rng = random.Random(case)
        manifest = read_manifest(path)
        changes = [mutate_typed(manifest, rng) for _ in range(rng.choice([1, 2]))]
        (path / "manifest.json").write_text(json.dumps(manifest).replace(str(HUGE), "9" * 5000))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                load_artifact(path)(torch.randn(3, 8))
            except (BundleError, *CALL_ERRORS):
                continue
            except Exception as error:  # noqa: BLE001  (any other error is the finding: say which changes made it)
                pytest.fail(f"{changes}: {type(error).__name__}: {error}")


BYTECODE_FUZZ = """
import json, random, sys
from pathlib import Path
from torch_stablehlo.exporter import BundleError, load_artifact
from tests.security.bundles import rewrite_file
path, first, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
pristine = (path / "module.mlirbc").read_bytes()
outcomes = {}
for case in range(first, first + count):
    rng = random.Random(case)
    data = bytearray(pristine)
    start = rng.randrange(len(data))
    if rng.random() < 0.5:
        del data[start:start + rng.randint(1, 12)]
    else:
        data[start] = rng.randrange(256)
    rewrite_file(path, "module.mlirbc", bytes(data))
    try:
        load_artifact(path)
        outcomes[case] = "loaded"
    except BundleError as error:
        outcomes[case] = "crashed" if "crashed" in str(error) else "refused"
print(json.dumps(outcomes))
"""


def test_mutated_bytecode_loads_or_is_a_bundle_error_and_never_crashes_the_caller(request, tmp_path):
    """One subprocess loads a mutated module.mlirbc after another (MLP with GELU and LayerNorm, where deleted bytes
    crash jaxlib's reader): it must finish, each load a success or a BundleError."""
    script = ("import torch\nfrom torch_stablehlo import export_to_stablehlo\ntorch.manual_seed(0)\n"
              "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),"
              " torch.nn.Linear(16, 4)).eval()\n"
              f"export_to_stablehlo(model, (torch.randn(2, 8),)).save({str(tmp_path / 'mlp')!r})\n")
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=300)
    count = len(_cases(request.config, 8, 120))
    done = subprocess.run([sys.executable, "-c", BYTECODE_FUZZ, str(tmp_path / "mlp"), "0", str(count)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(outcomes) == count and set(outcomes.values()) <= {"loaded", "refused", "crashed"}
