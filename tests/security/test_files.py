"""Files stay inside: every file a manifest names is a plain name of a regular file inside the bundle folder,
checked before anything is opened (an audit hook records what Python opens); stored weights must have the
manifest's shapes and dtypes; a folder of weights to attach holds its files itself."""
import os
import shutil

import pytest
import safetensors.torch
import torch

from torch_stablehlo.exporter import BundleError, WeightsError, export_to_stablehlo, load_artifact
from torch_stablehlo.exporter.formats.bundle import load_bundle

from .bundles import edit_manifest, opened_files, outside, rewrite_file


def _outside_copy(saved, tmp_path):
    """A copy of the bundle's weights file outside it (same bytes, so size and sha256 match the manifest)."""
    copy = tmp_path / "elsewhere" / "weights.safetensors"
    copy.parent.mkdir()
    shutil.copy(saved / "weights.safetensors", copy)
    return copy


def _point_weights_at(saved, name):
    def change(manifest):
        record = manifest["files"].pop("weights.safetensors")
        manifest["files"][name] = record
        for weight in manifest["weights"].values():
            weight["file"] = name
    edit_manifest(saved, change)


def test_loading_a_bundle_opens_nothing_outside_it(saved, small):
    with opened_files() as opened:
        artifact = load_artifact(saved)
    assert outside(opened, saved) == [] and opened
    x = torch.randn(5, 8)
    torch.testing.assert_close(artifact(x), small[0](x), rtol=1e-5, atol=1e-5)  # f32 matmul of 8 terms


@pytest.mark.parametrize("how", ["parent", "absolute"])
def test_a_weights_file_named_outside_the_bundle_is_refused_unopened(saved, tmp_path, how):
    copy = _outside_copy(saved, tmp_path)
    _point_weights_at(saved, "../elsewhere/weights.safetensors" if how == "parent" else str(copy))
    with opened_files() as opened, pytest.raises(BundleError, match=r"weights\[.*\]\.file|files key"):
        load_artifact(saved)
    assert str(copy) not in opened


@pytest.mark.parametrize("name", ["weights.safetensors", "module.mlirbc", "manifest.json"])
def test_a_link_to_a_file_outside_the_bundle_is_refused_unopened(saved, tmp_path, name):
    target = tmp_path / "elsewhere" / name
    target.parent.mkdir()
    shutil.move(saved / name, target)
    os.symlink(target, saved / name)
    with opened_files() as opened, pytest.raises(BundleError, match=f"{name} is a link"):
        load_artifact(saved)
    assert str(target) not in opened


def test_a_link_inside_the_bundle_is_refused_too(saved):
    os.rename(saved / "weights.safetensors", saved / "real.safetensors")
    os.symlink("real.safetensors", saved / "weights.safetensors")
    with pytest.raises(BundleError, match="weights.safetensors is a link"):
        load_artifact(saved)


def test_a_folder_where_a_file_should_be_is_refused(saved):
    (saved / "module.mlir").unlink()
    (saved / "module.mlir").mkdir()
    with pytest.raises(BundleError, match="module.mlir is not a regular file"):
        load_artifact(saved)


@pytest.mark.parametrize("stored", [torch.randn(8, 4), torch.randint(0, 9, (4, 8), dtype=torch.int32)],
                         ids=["transposed shape", "other dtype"])
def test_a_stored_weight_of_the_right_size_but_another_shape_or_dtype_is_refused(saved, stored):
    weights = safetensors.torch.load_file(str(saved / "weights.safetensors"))
    weights["weight"] = stored  # the same 128 bytes
    rewrite_file(saved, "weights.safetensors", safetensors.torch.save({k: v.contiguous() for k, v in weights.items()}))
    with pytest.raises(BundleError, match=r"weight 'weight' is stored as .*; the manifest says float32\[4, 8\]"):
        load_artifact(saved)


def test_a_stored_weight_the_manifest_does_not_place_is_refused(saved):
    weights = safetensors.torch.load_file(str(saved / "weights.safetensors"))
    rewrite_file(saved, "weights.safetensors", safetensors.torch.save({**weights, "extra": torch.ones(2)}))
    with pytest.raises(BundleError, match="holds 'extra', which the manifest does not place in it"):
        load_artifact(saved)


def test_local_shards_check_each_stored_weight_before_reading_it(tmp_path):
    model = torch.nn.Linear(8, 4).eval()
    artifact = export_to_stablehlo(model, (torch.randn(4, 8),), mesh={"data": 2},
                                   shardings={"weight": ("data", None)})
    saved = artifact.save(tmp_path / "sharded")
    assert set(load_bundle(saved, local_shards=True).readers) == {"weight", "bias"}
    weights = safetensors.torch.load_file(str(saved / "weights.safetensors"))
    weights["weight"] = weights["weight"].t().contiguous()
    rewrite_file(saved, "weights.safetensors", safetensors.torch.save(weights))
    with pytest.raises(BundleError, match=r"weight 'weight' is stored as float32\[8, 4\]"):
        load_bundle(saved, local_shards=True)


def test_a_folder_of_weights_to_attach_holds_its_own_files(small, tmp_path):
    model, artifact = small
    folder, elsewhere = tmp_path / "weights", tmp_path / "elsewhere.safetensors"
    folder.mkdir()
    safetensors.torch.save_file(dict(model.state_dict()), str(elsewhere))
    os.symlink(elsewhere, folder / "model.safetensors")
    meta = {name: torch.empty_like(t, device="meta") for name, t in artifact.weights.items()}
    weightless = type(artifact)(artifact.stablehlo_text, artifact.signature, meta)
    with opened_files() as opened, pytest.raises(WeightsError, match="model.safetensors is a link"):
        weightless.attach_weights(folder)
    assert str(elsewhere) not in opened
    saved = weightless.save(tmp_path / "weightless")
    with pytest.raises(WeightsError, match="model.safetensors is a link"):
        load_artifact(saved, weights=folder)
    x = torch.randn(3, 8)  # named explicitly, the same file is the caller's choice
    torch.testing.assert_close(load_artifact(saved, weights=[folder / "model.safetensors"])(x), model(x),
                               rtol=1e-5, atol=1e-5)  # f32 matmul of 8 terms


@pytest.mark.parametrize("name", ["module.mlir", "manifest.json"])
def test_a_fifo_where_a_file_should_be_is_refused_without_blocking(saved, name):
    (saved / name).unlink()
    os.mkfifo(saved / name)  # opening it for reading would wait for a writer: it is opened non-blocking
    with pytest.raises(BundleError, match=f"{name} is not a regular file"):
        load_artifact(saved)
