"""The golden zoo: every model through export -> save -> load -> PJRT run, against stored eager outputs.

Also checks that each model, rebuilt from its seed, still reproduces the stored
golden in eager torch (the weights are not stored, so a change in torch's RNG or in
a model's init code would silently invalidate the goldens otherwise).
"""
from __future__ import annotations

import math

import pytest
import torch

from torch_stablehlo.golden import store, zoo
from torch_stablehlo.golden.regenerate import run_eager
from torch_stablehlo.golden.verify import ERROR, PASS, main, verify_one
from torch_stablehlo.stablehlo_ir.op_counts import count_ops

from ..conftest import sampled

# eager vs eager on the same inputs: only thread-count / CPU-kernel differences are allowed
EAGER_TOLERANCE = 1e-5

MANIFEST = store.read_manifest()
REGENERATE = "python -m torch_stablehlo.golden.regenerate --only {name}"


def test_every_zoo_model_has_a_stored_golden():
    missing = [name for name in zoo.names()
               if name not in MANIFEST["models"] or not store.golden_path(name).is_file()]
    assert not missing, f"no stored golden for {missing}; run `python -m torch_stablehlo.golden.regenerate --only {' '.join(missing)}`"
    stale = sorted(set(MANIFEST["models"]) - set(zoo.names()))
    assert not stale, f"manifest lists models that are no longer in the zoo: {stale}"
    assert MANIFEST["seed"] == zoo.SEED, "the zoo's seed changed since the goldens were made; regenerate them"


FULL_SWEEP_ONLY = {"gpt2_12layer"}  # minutes on 2 cores; make test's gpt2_2layer is its architecture, and .ci/run's
# documented commands export and run it (`make demo`)


def pytest_generate_tests(metafunc):
    if "zoo_model" in metafunc.fixturenames:
        sampled(metafunc, "zoo_model", zoo.names(), [n for n in zoo.names() if n not in FULL_SWEEP_ONLY],
                indirect=True, scope="module")


@pytest.fixture(scope="module")
def zoo_model(request) -> tuple[str, zoo.Built]:
    """Each model built once for both tests below (pytest groups the tests by model)."""
    return request.param, zoo.get(request.param).build()


def test_eager_reproduces_golden(zoo_model):
    name, built = zoo_model
    if name not in MANIFEST["models"]:
        pytest.fail(f"{name}: not in golden/data/manifest.json; run `{REGENERATE.format(name=name)}`", pytrace=False)
    record, golden = MANIFEST["models"][name], store.load_golden(name)
    made_with = (f"golden made with torch {record['torch_version']} / transformers {record['transformers_version']}, "
                 f"now torch {torch.__version__} / transformers {_transformers_version()}")
    fix = (f"If that change is expected, check it, then regenerate: `{REGENERATE.format(name=name)}`.")

    assert store.weights_fingerprint(built.model) == record["weights_sha256"], (
        f"{name}: rebuilding the model with torch.manual_seed({zoo.SEED}) no longer gives the weights the "
        f"golden was made with (sha256 of the state dict differs): torch's RNG, the model's init code or "
        f"its parameters changed ({made_with}). The stored outputs no longer belong to this model. {fix}")

    inputs, _ = store.flatten_inputs(built.args, built.kwargs)
    stored, _ = store.flatten_inputs(golden.args, golden.kwargs)
    assert list(inputs) == list(stored), f"{name}: the factory's inputs are {list(inputs)}, stored {list(stored)}"
    changed = [key for key in inputs if not torch.equal(inputs[key], stored[key])]
    assert not changed, (f"{name}: the factory now makes different values for {changed} than the stored golden "
                         f"inputs (seeded generator changed? {made_with}). {fix}")

    outputs = run_eager(zoo.Built(built.model, golden.args, golden.kwargs))
    comparison = store.compare_outputs(outputs, golden, EAGER_TOLERANCE)
    assert comparison.ok, (
        f"{name}: the rebuilt model (same weights) no longer reproduces its stored golden in eager torch: "
        f"max rel error {comparison.max_rel:.3e} > {EAGER_TOLERANCE:.0e} {comparison.problems or ''} "
        f"({made_with}). The model's code or torch's kernels changed. {fix}")


def test_export_save_load_run_matches_golden(zoo_model):
    name, built = zoo_model
    result = verify_one(name, built=built)
    if result.status == ERROR:
        pytest.fail(f"{result.summary()}\n\n{result.details}", pytrace=False)
    assert result.max_rel is not None and result.max_abs is not None
    assert math.isfinite(result.max_rel), result.summary()
    bound = result.abs_tolerance is not None and result.max_abs <= result.abs_tolerance  # quantized models
    assert bound or result.max_rel <= zoo.get(name).tolerance, result.summary()
    assert result.status == PASS, result.summary()
    assert result.op_count and result.op_count > 0


# -- the machinery itself (fast) ---------------------------------------------------------

def test_golden_roundtrip(tmp_path):
    args = (torch.arange(6.0).reshape(2, 3),)
    kwargs = {"mask": torch.tensor([[1, 0]]), "nested": {"b": torch.ones(1)}}
    outputs = {"x": torch.zeros(2), "y": (torch.ones(3, dtype=torch.float64),)}
    record = store.save_golden("toy", args, kwargs, outputs, data_dir=tmp_path)
    assert set(record["inputs"]) == {"input.args.0", "input.kwargs.mask", "input.kwargs.nested.b"}
    golden = store.load_golden("toy", data_dir=tmp_path)
    assert torch.equal(golden.args[0], args[0])
    assert torch.equal(golden.kwargs["mask"], kwargs["mask"])
    assert torch.equal(golden.kwargs["nested"]["b"], kwargs["nested"]["b"])
    assert [o.dtype for o in golden.outputs] == [torch.float32, torch.float64]
    assert store.compare_outputs(outputs, golden, 0.0).ok
    flipped = {"x": torch.zeros(2), "y": [torch.ones(3, dtype=torch.float64)]}  # same leaves, list not tuple
    assert not store.compare_outputs(flipped, golden, 0.0).ok


def test_compare_is_relative_to_output_scale():
    golden = [torch.tensor([100.0, -200.0]), torch.tensor([1.0, 2.0])]
    ok = store.compare([torch.tensor([100.01, -200.0]), torch.tensor([1.0, 2.0])], golden, 1e-4)
    assert ok.ok and ok.max_abs == pytest.approx(0.01, rel=1e-3) and ok.max_rel == pytest.approx(5e-5, rel=1e-3)
    # the worst output decides: 1e-3 off on an output of scale 2
    bad = store.compare([golden[0], torch.tensor([1.0, 2.002])], golden, 1e-4)
    assert not bad.ok and bad.max_rel == pytest.approx(1e-3, rel=1e-3)


def test_compare_flags_nan_shape_and_count():
    golden = [torch.ones(3)]
    assert not store.compare([torch.tensor([1.0, float("nan"), 1.0])], golden, 1e-4).ok
    assert not store.compare([torch.ones(4)], golden, 1e-4).ok
    assert not store.compare([torch.ones(3, dtype=torch.float64)], golden, 1e-4).ok
    assert not store.compare([torch.ones(3), torch.ones(3)], golden, 1e-4).ok
    assert not store.compare([torch.tensor([1, 2])], [torch.tensor([1, 3])], 1e-4).ok


def test_count_ops_counts_nested_stablehlo_ops():
    text = """
    func.func @main(%arg0: tensor<4xf32>) -> tensor<f32> {
      %0 = stablehlo.constant dense<0.0> : tensor<f32>
      %1 = stablehlo.reduce(%arg0 init: %0) across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
        reducer(%a: tensor<f32>, %b: tensor<f32>) {
          %2 = stablehlo.add %a, %b : tensor<f32>
          stablehlo.return %2 : tensor<f32>
        }
      return %1 : tensor<f32>
    }"""
    assert count_ops(text) == 4  # constant, reduce, add, return (func.return is not counted)


def test_verify_cli_exit_status(capsys):
    assert main(["--only", "mlp"]) == 0
    assert "PASS" in capsys.readouterr().out


def _transformers_version():
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__
