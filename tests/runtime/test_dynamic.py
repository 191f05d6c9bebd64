"""Dynamic artifacts on PJRT: one artifact refined and compiled per input shape, run at every legal size
(min and max included) and compared with eager; out-of-range and inconsistent sizes refused before running;
saved bundles, TF SavedModels and the JAX handoff keep working at sizes never seen before."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from torch_stablehlo.exporter import export_to_stablehlo, load_artifact
from torch_stablehlo.exporter.errors import DimensionError, InputError
from tests.support import make

ROOT = Path(__file__).resolve().parents[2]


def _check_sizes(model, artifact, inputs_at, sizes):
    """The artifact matches eager at each size; ``inputs_at(size)`` builds the inputs."""
    for size in sizes:
        inputs = inputs_at(size)
        with torch.no_grad():
            expected = model(*inputs)
        torch.testing.assert_close(artifact(*inputs), expected)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))

    def forward(self, x):
        return self.layers(x)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        y = F.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.head(y.flatten(1))


class Block(torch.nn.Module):
    """LayerNorm, GELU, softmax and SDPA attention over (batch, sequence, 16)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x):
        batch, seq, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(batch, seq, 3, 2, 8).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, seq, 16)
        return F.gelu(self.out(attended)) + x, torch.softmax(x, dim=-1)


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    model = MLP().eval()
    batch = Dim("batch", min=2, max=32)
    return model, export_to_stablehlo(model, (make((4, 6)),), dynamic_shapes=({0: batch},))


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    model = Block().eval()
    shapes = ({0: Dim("batch", min=2, max=8), 1: Dim("seq", min=2, max=16)},)
    return model, export_to_stablehlo(model, (make((3, 5, 16)),), dynamic_shapes=shapes)


def test_mlp_with_min_and_max_runs_at_min_max_and_between(mlp):
    model, artifact = mlp
    _check_sizes(model, artifact, lambda b: (make((b, 6), seed=b),), [2, 7, 32])
    assert len(artifact._executables) == 3
    artifact(make((7, 6)))  # a size seen before: no new executable
    assert len(artifact._executables) == 3


@pytest.mark.parametrize("kind", ["AUTO", "DYNAMIC"])
def test_dim_auto_and_dynamic(kind):
    torch.manual_seed(0)
    model = MLP().eval()
    artifact = export_to_stablehlo(model, (make((4, 6)),), dynamic_shapes=({0: getattr(Dim, kind)},))
    (low, high), = artifact.signature.dims.values()
    assert high is None
    _check_sizes(model, artifact, lambda b: (make((b, 6), seed=b),), [low, 5, 33])


class Derived(torch.nn.Module):
    def forward(self, pairs, extra):
        return pairs.reshape(pairs.shape[0], -1, 2).sum(2), extra[1:] * 2


def test_derived_dims_bind_from_the_inputs_that_carry_them():
    dx = Dim("dx", min=2, max=10)
    model = Derived()
    artifact = export_to_stablehlo(model, (make((3, 8)), make((5, 2))), dynamic_shapes=({1: 2 * dx}, {0: dx + 1}))
    _check_sizes(model, artifact, lambda n: (make((3, 2 * n), seed=n), make((n + 1, 2))), [2, 5, 10])


def test_batch_and_sequence_with_layernorm_gelu_softmax_and_attention(block):
    model, artifact = block
    _check_sizes(model, artifact, lambda bs: (make(bs + (16,), seed=bs[1]),), [(2, 2), (3, 7), (8, 16), (5, 2)])


def test_dim_shared_between_two_inputs():
    class Shared(torch.nn.Module):
        def forward(self, x, y):
            return x * y.sum(1, keepdim=True), torch.cat([x, y], dim=1)

    n = Dim("n", min=2, max=20)
    artifact = export_to_stablehlo(Shared(), (make((4, 3)), make((4, 5))), dynamic_shapes=({0: n}, {0: n}))
    _check_sizes(Shared(), artifact, lambda n: (make((n, 3), seed=n), make((n, 5))), [2, 11, 20])
    with pytest.raises(DimensionError) as error:
        artifact(make((6, 3)), make((7, 5)))
    message = str(error.value)
    assert "input 'y' dim 0 is 7" in message and "n = 6 from input 'x' dim 0" in message
    with pytest.raises(DimensionError):  # refused again: only the shapes that passed are not checked twice
        artifact(make((6, 3)), make((7, 5)))


def test_conv_net_with_a_dynamic_batch():
    torch.manual_seed(0)
    model = ConvNet().eval()
    artifact = export_to_stablehlo(model, (make((3, 3, 8, 8)),), dynamic_shapes=({0: Dim("batch", min=2, max=16)},))
    _check_sizes(model, artifact, lambda b: (make((b, 3, 8, 8), seed=b),), [2, 5, 16])


@pytest.mark.parametrize("size, bound", [(1, "[2, 32]"), (33, "[2, 32]")])
def test_out_of_range_is_refused_before_running(mlp, size, bound):
    _, artifact = mlp
    with pytest.raises(DimensionError) as error:
        artifact(make((size, 6)))
    assert isinstance(error.value, (InputError, ValueError))
    assert str(error.value) == f"input 'x' dim 0 is {size}, outside the allowed range {bound} of its symbolic dim batch"


def test_derived_dims_that_disagree_are_refused():
    dx = Dim("dx", min=2, max=10)
    artifact = export_to_stablehlo(Derived(), (make((3, 8)), make((5, 2))), dynamic_shapes=({1: 2 * dx}, {0: dx + 1}))
    with pytest.raises(DimensionError, match=r"input 'pairs' dim 1 is 7, but it must be 2\*dx for an integer dx"):
        artifact(make((3, 7)), make((4, 2)))
    with pytest.raises(DimensionError, match=r"input 'extra' dim 0 is 5, but it must equal dx \+ 1 = 4 "
                                             r"\(dx = 3 from input 'pairs' dim 1\)"):
        artifact(make((3, 6)), make((5, 2)))
    with pytest.raises(DimensionError, match=r"input 'pairs' dim 1 is 22, outside the allowed range \[4, 20\]"):
        artifact(make((3, 22)), make((12, 2)))


def test_static_dims_of_a_dynamic_input_are_still_checked(block):
    _, artifact = block
    with pytest.raises(InputError, match=r"input 'x': expected shape \[batch, seq, 16\], got \[2, 3, 15\]"):
        artifact(make((2, 3, 15)))


LOAD_AND_RUN = """
import sys, torch
from torch_stablehlo.exporter import load_artifact
artifact = load_artifact(sys.argv[1])
inputs, expected = torch.load(sys.argv[2])
torch.testing.assert_close(artifact(*inputs), expected)
print("ran at", [tuple(t.shape) for t in inputs])
"""


def test_saved_dynamic_artifact_runs_in_a_new_process_at_a_new_size(block, tmp_path):
    model, artifact = block
    artifact(make((3, 5, 16)))
    path = artifact.save(tmp_path / "bundle")
    loaded = load_artifact(path)
    assert loaded.signature.dims == artifact.signature.dims == {"batch": [2, 8], "seq": [2, 16]}
    assert loaded.signature.user_inputs[0].tensor.shape == ("batch", "seq", 16)
    inputs = (make((6, 11, 16), seed=3),)
    with torch.no_grad():
        torch.save((inputs, model(*inputs)), tmp_path / "io.pt")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", LOAD_AND_RUN, str(path), str(tmp_path / "io.pt")],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ran at [(6, 11, 16)]" in result.stdout


def test_tf_saved_model_runs_at_two_batch_sizes(block, tmp_path):
    tf = pytest.importorskip("tensorflow")
    model, artifact = block
    path = artifact.save_tf_saved_model(tmp_path / "tf")
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    assert serve.structured_input_signature[1]["x"].shape.as_list() == [None, None, 16]
    for shape in [(2, 3, 16), (7, 12, 16)]:
        x = make(shape, seed=shape[0])
        outputs = serve(x=tf.constant(x.numpy()))
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close([torch.from_numpy(outputs[f"output_{i}"].numpy()) for i in range(2)],
                                   list(expected))


def test_jax_handoff_is_shape_polymorphic(block):
    np = pytest.importorskip("numpy")
    model, artifact = block
    jax_model = artifact.to_jax()
    assert str(jax_model.exported.in_avals[-1].shape) == "(batch, seq, 16)"
    for shape in [(2, 2, 16), (4, 9, 16)]:
        x = make(shape, seed=shape[1])
        with torch.no_grad():
            expected = model(x)
        actual = [torch.from_numpy(np.array(a)) for a in jax_model(x.numpy())]
        torch.testing.assert_close(actual, list(expected))
    assert jax_model.exported.serialize()
