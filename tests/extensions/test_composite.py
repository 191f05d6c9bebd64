"""``exporter.composite``: a module's or a function's calls lowered as ``stablehlo.composite "name"`` with their
attributes and version, the body as the decomposition; equal to eager, static and dynamic, nested, through
bundles, the SavedModel and ``to_jax()``; ``find_divergence`` names the composite whose body disagrees."""
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from torch_stablehlo import exporter
from torch_stablehlo.exporter import compile_for_iree, export_to_stablehlo, find_divergence, load_artifact
from torch_stablehlo.tools.inspection import bundle_report
from tests.iree.test_iree import run_in_iree

TOLERANCE = dict(rtol=1e-5, atol=1e-5)  # float32: the same ops, converted


class Block(torch.nn.Module):
    def __init__(self, width: int = 8, hidden: int = 32):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def swiglu(a, b):
    return F.silu(a) * b


class Model(torch.nn.Module):
    """A module composite called twice (one decomposition function) and a function composite."""

    def __init__(self):
        super().__init__()
        self.block = exporter.composite(Block(), name="mylib.mlp", attributes={"act": "gelu_tanh", "width": 32})
        self.fused = exporter.composite(swiglu, name="mylib.swiglu", version=2,
                                        attributes={"alpha": 0.5, "on": True, "dims": [1, 2], "names": ["a", "b"]})

    def forward(self, x):
        h = self.block(x)
        return self.fused(h, x) + self.block(h)


class Outer(torch.nn.Module):
    """A composite whose body calls another composite."""

    def __init__(self):
        super().__init__()
        self.inner = exporter.composite(Block(), name="mylib.inner")

    def forward(self, x):
        return self.inner(x) * 2 + 1


def _example():
    torch.manual_seed(0)
    return Model().eval(), torch.randn(3, 8)


@pytest.fixture(scope="module")
def dynamic():
    model, x = _example()
    return model, export_to_stablehlo(model, (x,), dynamic_shapes=({0: Dim("batch", min=2, max=16)},))


def test_module_and_function_composites_with_their_attributes_equal_eager():
    model, x = _example()
    artifact = export_to_stablehlo(model, (x,))
    text = artifact.stablehlo_text
    mlp = re.findall(r'stablehlo.composite "mylib.mlp" .*\{composite_attributes = \{(.*?)\}, decomposition = '
                     r'@(\w+)\}', text)
    assert len(mlp) == 2 and mlp[0] == mlp[1] == ('act = "gelu_tanh", width = 32 : i64', "mylib_mlp")
    swiglu_line = next(line for line in text.splitlines() if 'stablehlo.composite "mylib.swiglu"' in line)
    for attribute in ("alpha = 5.000000e-01 : f32", "dims = [1, 2]", 'names = ["a", "b"]', "on = true",
                      "version = 2 : i32"):
        assert attribute in swiglu_line, attribute
    assert artifact.signature.held_inputs[0].name == "block.up.weight"  # the module's names kept
    torch.testing.assert_close(artifact(x), model(x), **TOLERANCE)


def test_a_composite_under_a_dynamic_batch(dynamic):
    model, artifact = dynamic
    assert 'stablehlo.composite "mylib.mlp"' in artifact.stablehlo_text and "tensor<?x8xf32>" in artifact.stablehlo_text
    for batch in (2, 9, 16):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(artifact(x), model(x), **TOLERANCE)


def test_composites_survive_the_bundle_and_to_jax(tmp_path):
    model, x = _example()
    artifact = export_to_stablehlo(model, (x,))
    path = artifact.save(tmp_path / "bundle")
    loaded = load_artifact(path)
    assert 'stablehlo.composite "mylib.swiglu"' in loaded.stablehlo_text
    assert bundle_report(path)["composites"] == {"mylib.mlp": 2, "mylib.swiglu": 1}
    torch.testing.assert_close(loaded(x), model(x), **TOLERANCE)
    jax_model = artifact.to_jax()
    assert 'stablehlo.composite "mylib.mlp"' in str(jax_model.exported.mlir_module())
    np.testing.assert_allclose(np.asarray(jax_model(x.numpy())), model(x).detach().numpy(), **TOLERANCE)


def test_a_dynamic_composite_runs_from_the_bundle_the_saved_model_and_to_jax(dynamic, tmp_path):
    """(XLA's handoffs of a dynamic module call the decompositions: ``xla_module.COMPOSITES_TO_CALLS``.)"""
    model, artifact = dynamic
    x = torch.randn(5, 8)
    torch.testing.assert_close(load_artifact(artifact.save(tmp_path / "bundle"))(x), model(x), **TOLERANCE)
    np.testing.assert_allclose(np.asarray(artifact.to_jax()(x.numpy())), model(x).detach().numpy(), **TOLERANCE)
    tf = pytest.importorskip("tensorflow")
    signature = tf.saved_model.load(str(artifact.save_tf_saved_model(tmp_path / "tf"))).signatures["serving_default"]
    (served,) = signature(x=tf.constant(x.numpy())).values()
    np.testing.assert_allclose(served.numpy(), model(x).detach().numpy(), **TOLERANCE)


def test_iree_compiles_and_runs_composites():
    model, x = _example()
    artifact = export_to_stablehlo(model, (x,))
    (result,) = run_in_iree(compile_for_iree(artifact), artifact, (x,), {})
    torch.testing.assert_close(result, model(x), **TOLERANCE)


def test_the_exported_module_itself_may_be_a_composite():
    torch.manual_seed(0)
    model, x = exporter.composite(Block(), name="mylib.root").eval(), torch.randn(2, 8)
    artifact = export_to_stablehlo(model, (x,))
    assert 'stablehlo.composite "mylib.root"' in artifact.stablehlo_text
    torch.testing.assert_close(artifact(x), model(x), **TOLERANCE)


def test_a_nested_composite_is_called_from_the_outer_ones_decomposition():
    torch.manual_seed(0)
    model = exporter.composite(torch.nn.Sequential(Outer()), name="mylib.outer", attributes={"depth": 2}).eval()
    x = torch.randn(2, 8)
    artifact = export_to_stablehlo(model, (x,))
    text = artifact.stablehlo_text
    main = text[text.index("func.func public @main"):]
    main = main[:main.index("\n  }")]
    assert 'stablehlo.composite "mylib.outer"' in main and "mylib.inner" not in main
    outer = text[text.index("func.func private @mylib_outer"):]
    assert 'stablehlo.composite "mylib.inner"' in outer[:outer.index("\n  }")]
    torch.testing.assert_close(artifact(x), model(x), **TOLERANCE)


def test_find_divergence_names_the_composite_whose_body_disagrees():
    model, x = _example()
    with exporter.scoped_lowering(torch.ops.aten.silu.default, lambda a: a * 0.5):
        divergence = find_divergence(model, (x,))
    assert divergence is not None and divergence.op == "stablehlo_composite"
    assert divergence.node.startswith("composite_mylib_swiglu"), divergence
    assert find_divergence(model, (x,)) is None


def test_bad_composites_are_refused_before_anything_runs():
    with pytest.raises(TypeError, match=r"composite attribute 'bad'=\{'nested': 1\}: attributes are str, int"):
        exporter.composite(swiglu, name="mylib.swiglu", attributes={"bad": {"nested": 1}})
    with pytest.raises(ValueError, match="a dotted identifier such as 'mylib.mlp', got 'my lib'"):
        exporter.composite(swiglu, name="my lib")
    with pytest.raises(TypeError, match="an nn.Module or a function, got int"):
        exporter.composite(3, name="mylib.three")
    block = exporter.composite(Block(), name="mylib.once")
    with pytest.raises(ValueError, match="this module is the composite 'mylib.once' already"):
        exporter.composite(block, name="mylib.twice")
