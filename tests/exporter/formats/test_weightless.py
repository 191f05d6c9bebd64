"""Weightless export: a model built on the meta device -> a bundle without weights -> weights attached by name."""
import json

import pytest
import safetensors.torch
import torch

from torch_stablehlo.exporter import WeightsError, export_to_stablehlo, load_artifact
from torch_stablehlo.exporter.formats.bundle import load_manifest

from tests.exporter.models import Served, served_example


@pytest.fixture(scope="module")
def weightless():
    with torch.device("meta"):
        model = Served().eval()
    _, tokens, scale = served_example()
    return export_to_stablehlo(model, (tokens,), {"scale": scale})  # real inputs: traced on meta


@pytest.fixture
def real_checkpoint(tmp_path):
    """A real instance of the same model and its weights saved as a checkpoint (the tied weight once)."""
    model, tokens, scale = served_example()
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_model(model, str(path))
    return model, tokens, scale, path


def test_meta_model_saves_a_weightless_bundle(weightless, tmp_path):
    assert weightless.is_weightless
    path = weightless.save(tmp_path / "bundle")
    assert not list(path.glob("*.safetensors"))
    manifest = load_manifest(path)
    assert manifest["weights"] == {
        "embed.weight": {"file": None, "dtype": "float32", "shape": [10, 8], "bytes": 320},
        "proj.weight": {"file": None, "dtype": "float32", "shape": [8, 8], "bytes": 256},
        "proj.bias": {"file": None, "dtype": "float32", "shape": [8], "bytes": 32}}
    assert manifest["weight_aliases"] == {"out.weight": "embed.weight"}, "the tie survives the meta device"
    assert json.loads((path / "manifest.json").read_text())["files"].keys() == {"module.mlirbc", "module.mlir"}


def test_attached_weights_match_eager_of_the_real_model(weightless, real_checkpoint, tmp_path):
    model, tokens, scale, checkpoint = real_checkpoint
    path = weightless.save(tmp_path / "bundle")
    loaded = load_artifact(path)
    assert loaded.is_weightless
    with pytest.raises(WeightsError, match=r"cannot run a weightless artifact: weights .*embed\.weight"):
        loaded(tokens, scale=scale)
    loaded.attach_weights(checkpoint)
    assert not loaded.is_weightless
    torch.testing.assert_close(loaded(tokens, scale=scale), model(tokens, scale=scale))
    # the same in one step, and from a state dict
    torch.testing.assert_close(load_artifact(path, weights=checkpoint)(tokens, scale=scale),
                               model(tokens, scale=scale))
    torch.testing.assert_close(load_artifact(path, weights=model.state_dict())(tokens, scale=scale),
                               model(tokens, scale=scale))


def test_missing_and_mismatched_weights_are_named(weightless, tmp_path):
    checkpoint = tmp_path / "bad.safetensors"
    safetensors.torch.save_file({"embed.weight": torch.zeros(10, 8), "proj.weight": torch.zeros(8, 4),
                                 "extra": torch.zeros(1)}, str(checkpoint))
    path = weightless.save(tmp_path / "bundle")
    with pytest.raises(WeightsError) as caught:
        load_artifact(path, weights=checkpoint)
    message = str(caught.value)
    assert "missing (1): proj.bias" in message
    assert "proj.weight: expected float32[8, 8], got float32[8, 4]" in message
    with pytest.raises(WeightsError, match=r"embed\.weight: expected float32\[10, 8\], got float64\[10, 8\]"):
        load_artifact(path, weights={"embed.weight": torch.zeros(10, 8, dtype=torch.float64),
                                     "proj.weight": torch.zeros(8, 8), "proj.bias": torch.zeros(8)})
    with pytest.raises(WeightsError, match="does not exist"):
        load_artifact(path, weights=tmp_path / "nowhere.safetensors")


def test_a_program_exported_with_fake_tensors_is_weightless_too(real_checkpoint, tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    model, tokens, scale, checkpoint = real_checkpoint
    with FakeTensorMode(allow_non_fake_inputs=True):
        program = torch.export.export(Served().eval(), (tokens,), {"scale": scale})
    path = export_to_stablehlo(program).save(tmp_path / "fake")
    assert all(record["file"] is None for record in load_manifest(path)["weights"].values())
    torch.testing.assert_close(load_artifact(path, weights=checkpoint)(tokens, scale=scale), model(tokens, scale=scale))
