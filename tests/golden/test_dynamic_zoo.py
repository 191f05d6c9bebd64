"""Dynamic zoo variants (``golden.zoo.DYNAMIC``): each model exported once with a symbolic batch (and, for text
models, sequence) dim and run at every size of its variant, the min and max of each range included, against
eager torch at the zoo's tolerance; and a saved dynamic bundle run in a new process at a size it never saw.

``gpt2_12layer`` is left to ``python -m torch_stablehlo.golden.dynamic`` (its export and four compiles take minutes on a
loaded 2-core machine); every other variant is checked here.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_stablehlo.golden import zoo
from torch_stablehlo.golden.control_flow_zoo import STATIC_ONLY
from torch_stablehlo.golden.dynamic import ERROR, check_size, export_variant

from ..conftest import sampled

ROOT = Path(__file__).resolve().parents[2]
IN_RUNNER_ONLY = {"gpt2_12layer"}
FULL_SWEEP_ONLY = {"gpt2_2layer_eager"}  # gpt2_2layer's twin (eager attention): checked under --full-sweep
SAVED = "gpt2_2layer"  # also saved and run in a new process below: exported once for both tests


def test_the_static_only_models_still_cannot_export_a_dynamic_batch():
    """When torch lifts the limitation, this fails: give the model a variant in zoo.DYNAMIC then."""
    for name in STATIC_ONLY:
        built = zoo.get(name).build()
        batch = torch.export.Dim("batch", min=1, max=8)
        shapes = tuple({0: batch} if i == 0 else None for i in range(len(built.args)))
        with pytest.raises(torch._dynamo.exc.UserError, match="specialized it to be a constant"):
            torch.export.export(built.model, built.args, dynamic_shapes=shapes)


@functools.cache
def _export_saved_variant():
    return export_variant(SAVED)


def test_every_float_zoo_model_has_a_dynamic_variant():
    floats = [name for name in zoo.names() if "quantized" not in zoo.get(name).tags]
    assert sorted(zoo.DYNAMIC) == sorted(set(floats) - set(STATIC_ONLY))
    for name, variant in zoo.DYNAMIC.items():
        for param, (low, high) in variant.ranges.items():
            sizes = [size[param] for size in variant.sizes]
            assert low in sizes and high in sizes, (name, param)
            assert variant.example[param] >= 2
        if "transformers" in zoo.get(name).tags and name != "vit":
            assert set(variant.ranges) == {"batch", "length"}, name


def pytest_generate_tests(metafunc):
    if "exported" in metafunc.fixturenames:
        sampled(metafunc, "exported", [n for n in zoo.DYNAMIC if n not in IN_RUNNER_ONLY],
                [n for n in zoo.DYNAMIC if n not in IN_RUNNER_ONLY | FULL_SWEEP_ONLY], indirect=True, scope="module")


@pytest.fixture(scope="module")
def exported(request):
    """Each variant exported once; the test below runs that one artifact at every size."""
    name = request.param
    return (name, *(_export_saved_variant() if name == SAVED else export_variant(name)))


def test_one_artifact_matches_eager_at_every_size(exported):
    name, built, artifact = exported
    low_high = {zoo.DynamicVariant.DIM_NAMES[p]: list(r) for p, r in zoo.get(name).dynamic.ranges.items()}
    assert artifact.signature.dims == low_high
    results = [check_size(name, built.model, artifact, size) for size in zoo.get(name).dynamic.sizes]
    failed = [r.line(zoo.get(name).tolerance) for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    assert not any(r.status == ERROR for r in results)


LOAD_AND_RUN = """
import sys, torch
from torch_stablehlo.exporter import load_artifact
from torch_stablehlo.golden import store
artifact = load_artifact(sys.argv[1])
kwargs, expected = torch.load(sys.argv[2])
comparison = store.compare([artifact(**kwargs)[0]], [expected], float(sys.argv[3]))
assert comparison.ok, (comparison.max_rel, comparison.problems)
print("ran at", tuple(kwargs["input_ids"].shape), "max rel error", comparison.max_rel)
"""


def test_saved_dynamic_bundle_runs_in_a_new_process_at_a_new_size(tmp_path):
    name = SAVED
    built, artifact = _export_saved_variant()
    path = artifact.save(tmp_path / name)
    inputs = zoo.get(name).build(batch=5, length=23)  # no size of the variant: never compiled anywhere
    with torch.no_grad():
        expected = built.model(**inputs.kwargs)[0]
    torch.save((inputs.kwargs, expected), tmp_path / "io.pt")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", LOAD_AND_RUN, str(path), str(tmp_path / "io.pt"),
                             str(zoo.get(name).tolerance)], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ran at (5, 23)" in result.stdout
