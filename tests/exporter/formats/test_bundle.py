"""The bundle format: sharded weights, target versions, manifest, checks on load, atomic save."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
from jaxlib.mlir.dialects import stablehlo

from torch_stablehlo.exporter import BundleError, BundleVersionError, export_to_stablehlo, load_artifact
from torch_stablehlo.exporter.formats.bundle import load_manifest
from torch_stablehlo.exporter.formats.versions import resolve_target_version


class Tower(torch.nn.Module):
    """Four 64x64 layers (16 KB of f32 weights each), a buffer and a tied head."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(4))
        self.head = torch.nn.Linear(64, 64, bias=False)
        self.head.weight = self.layers[0].weight
        self.register_buffer("scale", torch.full((64,), 0.5))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x) * self.scale


@pytest.fixture(scope="module")
def tower():
    torch.manual_seed(0)
    model, x = Tower().eval(), torch.randn(3, 64)
    return model, x, export_to_stablehlo(model, (x,))


@pytest.fixture
def saved(tower, tmp_path):
    return tower[2].save(tmp_path / "tower")


def test_weights_over_the_shard_size_round_trip(tower, tmp_path):
    model, x, artifact = tower
    path = artifact.save(tmp_path / "sharded", shard_size=20_000)  # one layer (16.6 KB) per shard
    shards = sorted(p.name for p in path.glob("weights-*.safetensors"))
    assert shards == [f"weights-{i:05d}-of-00004.safetensors" for i in (1, 2, 3, 4)]
    assert not (path / "weights.safetensors").exists()
    manifest = load_manifest(path)
    assert {record["file"] for record in manifest["weights"].values()} == set(shards)
    assert manifest["weight_aliases"] == {"head.weight": "layers.0.weight"}
    loaded = load_artifact(path)
    for name, value in artifact.weights.items():
        assert torch.equal(loaded.weights[name], value), name
    torch.testing.assert_close(loaded(x), model(x))


def test_a_tensor_larger_than_the_shard_size_gets_a_shard_of_its_own(tower, tmp_path):
    path = tower[2].save(tmp_path / "tiny-shards", shard_size=1)
    assert len(list(path.glob("weights-*.safetensors"))) == 9  # 4 weights + 4 biases + the buffer
    torch.testing.assert_close(load_artifact(path)(tower[1]), tower[0](tower[1]))


def test_manifest_records_versions_signature_and_checksums(saved):
    manifest = json.loads((saved / "manifest.json").read_text())
    assert manifest["format_version"] == 3
    assert manifest["stablehlo_version"] == resolve_target_version("week12")
    assert manifest["torch_version"] == torch.__version__
    assert {"jaxlib_version", "producer", "producer_version", "stablehlo_target"} <= set(manifest)
    signature = manifest["signature"]
    assert [(s["name"], s["kind"]) for s in signature["inputs"]][-2:] == [("scale", "buffer"), ("x", "user_input")]
    assert signature["inputs"][-1]["tensor"] == {"name": "x", "dtype": "float32", "shape": [3, 64]}
    assert signature["dims"] == {} and signature["in_spec"] and signature["out_spec"]
    files = {p.name for p in saved.iterdir()} - {"manifest.json"}
    assert set(manifest["files"]) == files == {"module.mlirbc", "module.mlir", "weights.safetensors"}
    assert all(len(record["sha256"]) == 64 and record["bytes"] > 0 for record in manifest["files"].values())


def test_symbolic_dims_and_their_ranges_are_in_the_manifest(tmp_path):
    batch = torch.export.Dim("batch", min=2)  # no upper bound: null in the manifest
    program = torch.export.export(torch.nn.Linear(4, 3), (torch.randn(5, 4),), dynamic_shapes=({0: batch},))
    path = export_to_stablehlo(program).save(tmp_path / "dynamic")
    signature = load_manifest(path)["signature"]
    (symbol, bounds), = signature["dims"].items()
    assert bounds == [2, None]
    assert signature["inputs"][-1]["tensor"]["shape"] == [symbol, 4]
    assert signature["outputs"][0]["tensor"]["shape"] == [symbol, 3]
    assert "tensor<?x4xf32>" in (path / "module.mlir").read_text()


@pytest.mark.parametrize("target", ["current", "minimum", "week4", "1.10.0"])
def test_target_versions(tower, tmp_path, target):
    path = tower[2].save(tmp_path / target, target_version=target)
    expected = {"current": stablehlo.get_current_version(), "minimum": stablehlo.get_minimum_version()}
    assert load_manifest(path)["stablehlo_version"] == expected.get(target, resolve_target_version(target))
    torch.testing.assert_close(load_artifact(path)(tower[1]), tower[0](tower[1]))


@pytest.mark.parametrize("target, message", [("99.0.0", "outside what jaxlib"), ("0.0.1", "outside what jaxlib"),
                                             ("latest", "expected one of week12")])
def test_a_target_version_this_jaxlib_cannot_write_is_refused(tower, tmp_path, target, message):
    with pytest.raises(ValueError, match=message):
        tower[2].save(tmp_path / "bad", target_version=target)
    assert not (tmp_path / "bad").exists()


def test_readable_module_text_is_optional(tower, tmp_path):
    path = tower[2].save(tmp_path / "no-text", include_text=False)
    assert not (path / "module.mlir").exists()
    assert "layers.0/aten.linear.default" in load_artifact(path).stablehlo_text  # locations survive


# -- damaged bundles ------------------------------------------------------------------------------

def _edit_manifest(path, **changes):
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(changes)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_missing_file(saved):
    (saved / "weights.safetensors").unlink()
    with pytest.raises(BundleError, match=r"weights\.safetensors is missing"):
        load_artifact(saved)


def test_truncated_file(saved):
    data = (saved / "module.mlirbc").read_bytes()
    (saved / "module.mlirbc").write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleError, match=rf"module\.mlirbc is truncated: {len(data) // 2} of {len(data)} bytes"):
        load_artifact(saved)


def test_corrupt_file(saved):
    data = bytearray((saved / "weights.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (saved / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"weights\.safetensors is corrupt: its sha256 differs"):
        load_artifact(saved)


def test_corrupt_manifest(saved):
    (saved / "manifest.json").write_text('{"format_version": 2, "stablehlo')
    with pytest.raises(BundleError, match="manifest.json is corrupt: not valid JSON"):
        load_artifact(saved)


def test_not_a_bundle(tmp_path):
    with pytest.raises(BundleError, match="no such bundle folder"):
        load_artifact(tmp_path / "nothing")
    with pytest.raises(BundleError, match="manifest.json is missing"):
        load_artifact(tmp_path)


def test_stablehlo_version_newer_than_this_jaxlib_reads(saved):
    _edit_manifest(saved, stablehlo_version="99.0.0")
    with pytest.raises(BundleVersionError, match=rf"StableHLO 99\.0\.0, newer than jaxlib .* reads \(up to "
                                                 rf"{stablehlo.get_current_version()}\); upgrade jaxlib"):
        load_artifact(saved)


def test_bundle_format_newer_than_this_exporter_reads(saved):
    _edit_manifest(saved, format_version=4)
    with pytest.raises(BundleVersionError, match="bundle format 4 is not readable .* upgrade torch-stablehlo-exporter"):
        load_artifact(saved)


# -- atomic save -------------------------------------------------------------------------------------

def _interrupt_weights(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", interrupted)


def test_an_interrupted_save_leaves_no_bundle(tower, tmp_path, monkeypatch):
    _interrupt_weights(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        tower[2].save(tmp_path / "interrupted")
    assert list(tmp_path.iterdir()) == [], "neither the bundle nor its staging folder is left"


def test_an_interrupted_save_keeps_the_previous_bundle(tower, saved, monkeypatch):
    before = load_manifest(saved)
    _interrupt_weights(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        tower[2].save(saved, target_version="current")
    assert load_manifest(saved) == before
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]
    monkeypatch.undo()
    assert load_manifest(tower[2].save(saved, target_version="current"))["stablehlo_version"] == \
        stablehlo.get_current_version(), "a later save replaces it"


def test_a_save_into_an_empty_folder_and_not_into_another_folder(tower, tmp_path):
    (tmp_path / "empty").mkdir()
    assert load_manifest(tower[2].save(tmp_path / "empty"))  # as tempfile.TemporaryDirectory() callers do
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="is not an artifact folder nor an empty folder"):
        tower[2].save(tmp_path / "other")
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


STAGING_WRITER = """
import sys, time
from torch_stablehlo.exporter.formats.bundle import bundle_files
from torch_stablehlo.exporter.formats.folders import staged_folder
with staged_folder(sys.argv[1], "an artifact folder", bundle_files) as staging:
    (staging / "weights.safetensors").write_bytes(bytes(1 << 20))
    print(staging, flush=True)
    time.sleep(120)
"""


def test_a_killed_save_leaves_staging_that_the_next_save_removes_unless_it_is_live(tower, saved):
    """A save killed midway (SIGKILL) leaves its hidden staging folder; a save while it is still writing leaves
    it alone, and the first save after it died removes it. The previous bundle is intact throughout."""
    writer = subprocess.Popen([sys.executable, "-c", STAGING_WRITER, str(saved)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    try:
        staging = Path(writer.stdout.readline().strip())
        assert staging.is_dir() and staging.name.startswith(f".{saved.name}.")
        tower[2].save(saved)  # the writer is alive: its folder stays
        assert staging.is_dir()
    finally:
        writer.kill()
        writer.wait(timeout=60)
    assert staging.is_dir() and load_manifest(saved)
    tower[2].save(saved)
    assert not staging.exists() and sorted(p.name for p in saved.parent.iterdir()) == [saved.name]


# -- large models: nothing is held twice ------------------------------------------------------------

def test_export_and_sharded_save_never_copy_the_weights(tower, tmp_path, monkeypatch):
    """The path bench/multi_gb_export.py takes for a multi-GB model, on a small one: the artifact holds the
    model's own tensors, the module text embeds none of them, and each shard is written straight from them."""
    model, x, artifact = tower
    pointers = {name: t.data_ptr() for name, t in model.state_dict().items()}
    assert {name: artifact.weights[name].data_ptr() for name in pointers} == pointers
    assert 'dense<"0x' not in artifact.stablehlo_text  # weights are @main arguments, not constants
    written = []
    save_file = safetensors.torch.save_file

    def recording(tensors, filename, *args, **kwargs):
        written.append({name: t.data_ptr() for name, t in tensors.items()})
        return save_file(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", recording)
    path = artifact.save(tmp_path / "sharded", shard_size=40_000)  # two layers per shard, the buffer with the last
    assert [len(shard) for shard in written] == [4, 5], "one call per shard, each with its own tensors only"
    assert all(pointers[name] == pointer for shard in written for name, pointer in shard.items())
    torch.testing.assert_close(load_artifact(path)(x), model(x))


# -- signatures with in-place input updates, scalar and constant outputs -----------------------------

class MutatesAndReturnsScalars(torch.nn.Module):
    def forward(self, x, state):
        state.mul_(0.5).add_(x)
        return x.mean().item(), 3, x + state


def test_bundle_keeps_input_mutations_scalars_and_constants(tmp_path):
    x, state = torch.randn(4), torch.randn(4)
    eager_state = state.clone()
    expected = MutatesAndReturnsScalars()(x, eager_state)
    path = export_to_stablehlo(MutatesAndReturnsScalars(), (x, state.clone())).save(tmp_path / "mutates")
    outputs = load_manifest(path)["signature"]["outputs"]
    assert [(o["kind"], o["target"], o["scalar"], o["value"]) for o in outputs] == [
        ("user_input_mutation", "state", None, None), ("user_output", None, "float", None),
        ("user_output", None, None, 3), ("user_output", None, None, None)]
    loaded_state = state.clone()
    actual = load_artifact(path)(x, loaded_state)
    torch.testing.assert_close(loaded_state, eager_state)
    assert type(actual[0]) is float and actual[0] == pytest.approx(expected[0], rel=1e-6)
    assert actual[1] == 3
    torch.testing.assert_close(actual[2], expected[2])
