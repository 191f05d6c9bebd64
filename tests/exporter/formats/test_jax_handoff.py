"""JAX handoff: a jax.export.Exported of @main and a callable with the weights bound; state carried and donated;
the seed of a program that draws random numbers."""
import jax
import numpy as np
import pytest
import torch

from torch_stablehlo.exporter import InputError, export_to_stablehlo
from tests.exporter.models import Counter, served_example


@pytest.fixture(scope="module")
def served():
    model, tokens, scale = served_example()
    artifact = export_to_stablehlo(model, (tokens,), {"scale": scale})
    return artifact, tokens, scale, artifact.to_jax()


def _assert_same(actual, expected):
    """Same structure, same numbers (the PJRT run and JAX compile with the same XLA)."""
    actual_leaves, actual_tree = jax.tree_util.tree_flatten(actual)
    expected_leaves, expected_tree = jax.tree_util.tree_flatten(expected)
    assert actual_tree == expected_tree
    for got, want in zip(actual_leaves, expected_leaves):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-6, atol=1e-6)


def test_callable_equals_the_pjrt_run_with_the_models_structure(served):
    artifact, tokens, scale, model = served
    outputs = model(tokens.numpy(), scale=scale.numpy())
    assert isinstance(outputs["logits"], jax.Array)
    _assert_same(outputs, artifact(tokens, scale=scale))


def test_exported_serializes_and_round_trips(served):
    artifact, tokens, scale, model = served
    exported = jax.export.deserialize(model.exported.serialize())
    assert [a.shape for a in exported.in_avals] == [(10, 8), (8, 8), (8,), (10, 8), (2, 5), (2, 5, 8)]
    with jax.enable_x64(True):  # int64 tokens
        outputs = exported.call(*model.weights, tokens.numpy(), scale.numpy())
    _assert_same(list(outputs), artifact.run_flat([tokens, scale]))


def test_apply_takes_the_weights_as_an_argument_under_jit(served):
    artifact, tokens, scale, model = served
    with jax.enable_x64(True):
        outputs = jax.jit(lambda weights, t, s: model.apply(weights, t, scale=s))(model.weights, tokens.numpy(),
                                                                                 scale.numpy())
    _assert_same(outputs, artifact(tokens, scale=scale))
    assert model.weights[0] is model.weights[3], "the tied weight is placed once"


def test_wrong_input_structure_is_an_input_error(served):
    model = served[3]
    with pytest.raises(InputError, match="missing \\['scale'\\]"):
        model(served[1].numpy())


def test_symbolic_dims_become_symbolic_shapes(tmp_path):
    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(torch.nn.Linear(4, 3), (torch.randn(5, 4),), dynamic_shapes=({0: batch},))
    exported = export_to_stablehlo(program).to_jax().exported
    symbol = str(exported.in_avals[-1].shape[0])
    assert str(exported.out_avals[0].shape) == f"({symbol}, 3)"
    assert exported.uses_global_constants
    assert "jax.uses_shape_polymorphism = true" in exported.mlir_module()


def test_state_is_carried_between_calls_and_donated():
    """Counter's buffer: model(x) carries it from call to call as eager does, ``state`` reads it and
    ``reset_state`` returns it to zeros; the functional form under jit with the state donated consumes the
    arrays passed and returns the new state."""
    model = export_to_stablehlo(Counter(), (torch.ones(3),)).to_jax()
    eager = Counter()
    for step in range(3):
        x = torch.full((3,), float(step + 1))
        np.testing.assert_array_equal(np.asarray(model(x.numpy())), eager(x).numpy())  # small integers: exact
    np.testing.assert_array_equal(np.asarray(model.state["total"]), eager.total.numpy())
    assert not np.asarray(model.reset_state().state["total"]).any()

    state = model.state
    new_state, outputs = jax.jit(model.apply, donate_argnums=1)(model.weights, state, np.full(3, 2, np.float32))
    assert state["total"].is_deleted()
    np.testing.assert_array_equal(np.asarray(new_state["total"]), [2, 2, 2])
    np.testing.assert_array_equal(np.asarray(outputs), [4, 4, 4])


class WritesItsInput(torch.nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


def test_writes_to_user_inputs_are_refused():
    with pytest.raises(NotImplementedError, match="writes its input\\(s\\) x in place"):
        export_to_stablehlo(WritesItsInput(), (torch.ones(3),)).to_jax()


class Noisy(torch.nn.Module):
    def forward(self, x):
        return x + torch.rand(3)


class NoisyWithSeed(torch.nn.Module):
    def forward(self, x, seed):
        return x * seed + torch.rand(3)


def test_a_random_program_takes_a_seed():
    """``seed=`` draws as the artifact does after ``manual_seed``; without it, the model's own next seed."""
    artifact = export_to_stablehlo(Noisy(), (torch.zeros(3),))
    model, x = artifact.to_jax(), np.zeros(3, np.float32)
    expected = {seed: artifact.manual_seed(seed)(torch.zeros(3)).numpy() for seed in (4, 5)}
    assert not np.array_equal(expected[4], expected[5])
    np.testing.assert_array_equal(np.asarray(model(x, seed=4)), expected[4])
    np.testing.assert_array_equal(np.asarray(model.manual_seed(4)(x)), expected[4])
    np.testing.assert_array_equal(np.asarray(model(x)), expected[5])
    with pytest.raises(InputError, match="draws random numbers: pass its seed as seed="):
        model.apply(model.weights, x)
    with pytest.raises(ValueError, match="has an input named 'seed'"):
        export_to_stablehlo(NoisyWithSeed(), (torch.zeros(3), torch.ones(3))).to_jax()
