"""TF SavedModel: XlaCallModule over the portable module, weights as variables, named inputs and outputs."""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from tests.exporter.models import Counter, served_example

SAVED_MODEL_CLI = Path(sys.executable).with_name("saved_model_cli")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model, tokens, scale = served_example()
    artifact = export_to_stablehlo(model, (tokens,), {"scale": scale})
    path = artifact.save_tf_saved_model(tmp_path_factory.mktemp("served") / "model")
    names = [slot.tensor.name for slot in artifact.signature.user_outputs]
    expected = {name: t.numpy() for name, t in zip(names, artifact.run_flat([tokens, scale]))}
    return path, {"tokens": tokens.numpy(), "scale": scale.numpy()}, expected


def test_a_saved_model_into_an_existing_empty_folder(tmp_path):
    model, tokens, scale = served_example()
    artifact = export_to_stablehlo(model, (tokens,), {"scale": scale})
    (tmp_path / "empty").mkdir()
    path = artifact.save_tf_saved_model(tmp_path / "empty")
    assert (path / "saved_model.pb").is_file()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "data.csv").write_text("1,2")
    with pytest.raises(FileExistsError, match="is not a SavedModel folder nor an empty folder"):
        artifact.save_tf_saved_model(tmp_path / "taken")


def test_tf_serving_signature_equals_the_pjrt_run(served):
    path, inputs, expected = served
    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    assert sorted(signature.structured_input_signature[1]) == ["scale", "tokens"]
    outputs = signature(**{name: tf.constant(value) for name, value in inputs.items()})
    assert sorted(outputs) == sorted(expected) == ["logits", "pooled.0"]  # the model returns a dict of them
    for name, value in expected.items():
        np.testing.assert_allclose(outputs[name].numpy(), value, rtol=1e-6, atol=1e-6)


def test_saved_model_cli_show_and_run(served, tmp_path):
    path, inputs, expected = served
    show = subprocess.run([SAVED_MODEL_CLI, "show", "--dir", path, "--all"], capture_output=True, text=True,
                          timeout=300)
    assert show.returncode == 0, show.stderr[-2000:]
    for line in ("inputs['tokens']", "dtype: DT_INT64", "inputs['scale']", "outputs['logits']", "outputs['pooled.0']", "XlaCallModule"):
        assert line in show.stdout, line
    for name, value in inputs.items():
        np.save(tmp_path / f"{name}.npy", value)
    run = subprocess.run(
        [SAVED_MODEL_CLI, "run", "--dir", path, "--tag_set", "serve", "--signature_def", "serving_default",
         "--inputs", ";".join(f"{name}={tmp_path / name}.npy" for name in inputs), "--outdir", tmp_path / "out"],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    for name, value in expected.items():
        np.testing.assert_allclose(np.load(tmp_path / "out" / f"{name}.npy"), value, rtol=1e-6, atol=1e-6)


def test_weights_are_variables_stored_once(served):
    path = served[0]
    variables = tf.saved_model.load(str(path)).weight_variables
    assert [v.shape.as_list() for v in variables] == [[10, 8], [8, 8], [8], [10, 8]]
    assert variables[0] is variables[3], "the tied weight is one variable"
    header = re.search(r"func\.func public @main\((.*?)\) ->", _xla_module_text(path)).group(1)
    assert header.count("%arg") == 6, "the 4 weights are leading arguments of @main, then the 2 inputs"


def _xla_module_text(path) -> str:
    """The module inside the XlaCallModule op, as text."""
    from jaxlib.mlir.dialects import stablehlo

    from torch_stablehlo.stablehlo_ir.mlir_context import make_context

    graph = tf.saved_model.load(str(path)).signatures["serving_default"].graph.as_graph_def()
    calls = [node for function in graph.library.function for node in function.node_def if node.op == "XlaCallModule"]
    assert len(calls) == 1
    assert calls[0].attr["version"].i == 9 and list(calls[0].attr["platforms"].list.s) == [b"CPU"]
    with make_context() as context:
        return str(stablehlo.deserialize_portable_artifact(context, calls[0].attr["module"].s))


def test_buffer_updates_are_assigned_to_their_variable(tmp_path):
    path = export_to_stablehlo(Counter(), (torch.ones(3),)).save_tf_saved_model(tmp_path / "counter", "count")
    signature = tf.saved_model.load(str(path)).signatures["count"]
    eager = Counter()
    for step in range(3):
        x = torch.full((3,), float(step + 1))
        np.testing.assert_allclose(signature(x=tf.constant(x.numpy()))["output_0"].numpy(), eager(x).numpy())


def test_symbolic_dims_are_none_and_the_module_is_marked_for_refinement(tmp_path):
    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(torch.nn.Linear(4, 3), (torch.randn(5, 4),), dynamic_shapes=({0: batch},))
    path = export_to_stablehlo(program).save_tf_saved_model(tmp_path / "dynamic")
    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    assert signature.structured_input_signature[1]["input"].shape.as_list() == [None, 4]
    assert signature.structured_outputs["output_0"].shape.as_list() == [None, 3]
    assert "jax.uses_shape_polymorphism = true" in _xla_module_text(path)


def test_never_replaces_a_folder_that_is_not_a_saved_model(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not a SavedModel folder"):
        export_to_stablehlo(torch.nn.ReLU(), (torch.randn(2),)).save_tf_saved_model(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"
