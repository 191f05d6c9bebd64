"""An engine bundle crosses the trust boundary as a program bundle does: each tampered file or field is a
BundleError naming it, raised before anything runs; a load while a save replaces the folder reads one version
whole; ``trusted`` skips the child-process check of the modules, as for a program bundle. One tiny Llama engine is
exported once for the module (the round trip's tokens are checked in tests/serving/test_engine.py)."""
import shutil

import numpy as np
import pytest
import safetensors.torch
import torch

from torch_stablehlo.exporter import BundleError, export_engine, load_artifact
from torch_stablehlo.exporter.engine.state import sampling_rows
from torch_stablehlo.exporter.errors import BundleVersionError
from torch_stablehlo.exporter.formats import bundle
from torch_stablehlo.exporter.formats.engine_artifact import ENGINE_MANIFEST, EngineArtifact
from torch_stablehlo.runtime import settings

from ..serving.engine_models import VOCAB, tiny
from .bundles import edit_manifest, loads_while_saving, read_manifest, rewrite_file, with_string_count

PROMPT = [5, 17, 33, 2, 90]
READERS, LOADS = 3, 6
TOLERANCE = dict(rtol=1e-5, atol=1e-5)  # f32 caches of a 2-layer model of width 64
HUGE = "an integer of 5000 digits"
"""Written into the manifest as 5000 nines (more than Python converts to an int from text by default)."""


@pytest.fixture(scope="module")
def engine():
    return export_engine(tiny("llama"), slots=2, max_cache_len=32, max_prompt_len=8)


@pytest.fixture(scope="module")
def saved_engine(engine, tmp_path_factory):
    return engine.save(tmp_path_factory.mktemp("engine") / "bundle")


@pytest.fixture
def copy(saved_engine, tmp_path):
    """A fresh copy of the saved engine bundle, for one test to tamper with."""
    return shutil.copytree(saved_engine, tmp_path / "bundle")


def _set(path, value, *keys):
    def change(manifest):
        for key in keys[:-1]:
            manifest = manifest[key]
        manifest[keys[-1]] = value
    edit_manifest(path, change, ENGINE_MANIFEST)
    text = (path / ENGINE_MANIFEST).read_text()
    (path / ENGINE_MANIFEST).write_text(text.replace(f'"{HUGE}"', "9" * 5000))


def _caches(artifact: EngineArtifact) -> list[np.ndarray]:
    """The caches prefill computes for ``PROMPT`` (floats: they differ between any two sets of weights)."""
    prefilled = artifact.runner().prefill(PROMPT, sampling_rows(1, VOCAB), 4)
    return [np.asarray(cache) for cache in prefilled.caches]


@pytest.mark.parametrize("keys, value, message", [
    (("config", "slots"), "two", r"config\.slots: expected an integer in \[0, 2\*\*63\), got str 'two'"),
    (("config", "buckets"), [8, 4], r"config\.buckets: expected a non-empty ascending list of positive integers"),
    (("config", "defaults", "top_k"), HUGE, r"config\.defaults\.top_k: expected an integer in \[0, 2\*\*63\), got "
                                             r"OversizedInteger <an integer of 5000 digits>"),
    (("config", "cache_dtype"), "float128", r"config\.cache_dtype: expected a dtype name"),
    (("entry_points", "shift", "module"), "../shift.mlirbc", r"entry_points\['shift'\]\.module: expected a plain "
                                                              r"file name"),
    (("entry_points", "generate", "signature", "inputs"), {}, r"entry_points\['generate'\]\.signature\.inputs: "
                                                              r"expected a list"),
    (("weight_aliases",), {"lm_head.weight": "nowhere"}, r"weight_aliases\['lm_head\.weight'\]: expected the name "
                                                         r"of a weight"),
    (("format_version",), "2", r"format_version: expected an integer"),
])
def test_a_malformed_field_is_a_bundle_error_naming_it(copy, keys, value, message):
    _set(copy, value, *keys)
    with pytest.raises(BundleError, match=rf"engine\.json is invalid: manifest field {message}"):
        load_artifact(copy)


@pytest.mark.parametrize("field, value, message", [
    ("slots", 3, r"config: the state it makes has 15 leaves, leaf 0 int64\[3, 32\]; entry point 'insert' takes 15, "
                 r"leaf 0 int64\[2, 32\]"),
    ("cache_dtype", "bfloat16", r"config: .* leaf 11 bfloat16\[2, 2, 32, 16\]; .* leaf 11 float32\[2, 2, 32, 16\]"),
    ("max_cache_len", 2 ** 62, r"config: no state can be built of it \(Storage size calculation overflowed"),
    ("buckets", [4, 8, 9], r"config\.buckets: \[9\] outside the range \[2, 8\] of prefill's dim bucket"),
    ("steps_per_call", 100, r"config\.steps_per_call: 100 steps of 2 slots; entry point 'generate' returns tokens "
                            r"\[8, 2\]"),
])
def test_a_config_that_does_not_fit_the_entry_points_is_named(copy, field, value, message):
    _set(copy, value, "config", field)
    with pytest.raises(BundleError, match=rf"engine\.json is invalid: manifest field {message}"):
        load_artifact(copy)


def test_a_missing_entry_point_and_another_format_version_are_named(copy):
    manifest = read_manifest(copy, ENGINE_MANIFEST)
    _set(copy, 1, "format_version")
    with pytest.raises(BundleVersionError, match="bundle format 1 is not readable by this exporter"):
        load_artifact(copy)
    _set(copy, manifest["format_version"], "format_version")
    del manifest["entry_points"]["shift"]
    _set(copy, manifest["entry_points"], "entry_points")
    with pytest.raises(BundleError, match=r"manifest field entry_points: expected \['prefill', 'insert', 'generate', "
                                          r"'shift'\], got \['generate', 'insert', 'prefill'\]"):
        load_artifact(copy)


def test_a_weight_slot_of_another_dtype_than_the_stored_weight_is_named(copy):
    manifest = read_manifest(copy, ENGINE_MANIFEST)
    slot = next(i for i, s in enumerate(manifest["entry_points"]["prefill"]["signature"]["inputs"])
                if s["kind"] == "parameter")
    _set(copy, "float16", "entry_points", "prefill", "signature", "inputs", slot, "tensor", "dtype")
    with pytest.raises(BundleError, match=rf"engine\.json \(entry point 'prefill'\) is invalid: manifest field "
                                          rf"signature\.inputs\[{slot}\]: weight '.*' is float32\[.*\] in weights, "
                                          rf"float16\[.*\] here"):
        load_artifact(copy)


def test_a_weight_stored_as_another_dtype_is_named(copy):
    stored = safetensors.torch.load((copy / "weights.safetensors").read_bytes())
    name = sorted(stored)[0]
    stored[name] = stored[name].double()
    rewrite_file(copy, "weights.safetensors", safetensors.torch.save(stored), ENGINE_MANIFEST)
    with pytest.raises(BundleError, match=rf"weights\.safetensors: weight '{name}' is stored as float64\[.*\]; the "
                                          rf"manifest says float32"):
        load_artifact(copy)


def test_a_state_input_of_another_element_type_than_main_takes_is_named(copy):
    inputs = read_manifest(copy, ENGINE_MANIFEST)["entry_points"]["generate"]["signature"]["inputs"]
    index = next(i for i, s in enumerate(inputs) if s["name"] == "state_padding")
    _set(copy, "int32", "entry_points", "generate", "signature", "inputs", index, "tensor", "dtype")
    with pytest.raises(BundleError, match=rf"engine\.json \(entry point 'generate'\) does not fit its module: @main's "
                                          rf"argument {index} \(state_padding\) holds i64 in the module, int32 \(i32\)"):
        load_artifact(copy)


def test_another_entry_points_module_is_refused_by_its_main(copy):
    rewrite_file(copy, "shift.mlirbc", (copy / "generate.mlirbc").read_bytes(), ENGINE_MANIFEST)
    with pytest.raises(BundleError, match=r"engine\.json \(entry point 'shift'\) does not fit its module"):
        load_artifact(copy)


def test_a_tampered_module_is_refused(copy, monkeypatch):
    (copy / "insert.mlirbc").write_bytes(b"\0" + (copy / "insert.mlirbc").read_bytes()[1:])
    with pytest.raises(BundleError, match=r"insert\.mlirbc is corrupt: its sha256 differs from the manifest's"):
        load_artifact(copy)
    crafted = with_string_count((copy / "prefill.mlirbc").read_bytes(), 2 ** 27)
    rewrite_file(copy, "prefill.mlirbc", crafted, ENGINE_MANIFEST)
    monkeypatch.setattr(bundle, "_READABLE", set())
    with pytest.raises(BundleError, match=r"prefill\.mlirbc is not a readable StableHLO portable artifact: reading it "
                                          r"needs more than the \d+ bytes of memory the check allows"):
        load_artifact(copy)


def test_a_missing_file_a_link_and_an_oversized_manifest_are_named(copy, tmp_path, monkeypatch):
    shutil.move(copy / "generate.mlirbc", tmp_path / "generate.mlirbc")
    with pytest.raises(BundleError, match=r"bundle: generate\.mlirbc is missing"):
        load_artifact(copy)
    (copy / "generate.mlirbc").symlink_to(tmp_path / "generate.mlirbc")
    with pytest.raises(BundleError, match=r"bundle: generate\.mlirbc is a link; a bundle's files are regular files"):
        load_artifact(copy)
    shutil.move(tmp_path / "generate.mlirbc", copy / "generate.mlirbc")
    monkeypatch.setenv(settings.MAX_MANIFEST_BYTES.variable, "1KB")
    with pytest.raises(BundleError, match=r"engine\.json is \d+ bytes, over the 1000 bytes a bundle's engine\.json "
                                          r"may have \(\$TORCH_STABLEHLO_MAX_MANIFEST_BYTES raises the bound\)"):
        load_artifact(copy)
    monkeypatch.delenv(settings.MAX_MANIFEST_BYTES.variable)
    shutil.move(copy / ENGINE_MANIFEST, tmp_path / ENGINE_MANIFEST)
    (copy / ENGINE_MANIFEST).symlink_to(tmp_path / ENGINE_MANIFEST)
    with pytest.raises(BundleError, match=r"bundle: engine\.json is a link"):
        load_artifact(copy)


def test_trusted_skips_the_child_check_as_for_a_program_bundle(saved_engine, monkeypatch):
    checked = []
    monkeypatch.setattr(bundle, "_READABLE", set())
    monkeypatch.setattr(bundle, "read_in_child", lambda data, *limits: checked.append(len(data)))
    load_artifact(saved_engine, trusted=True)
    assert checked == []
    load_artifact(saved_engine)
    assert len(checked) == 4, "each entry point's module is checked in a child process once"


def test_loads_while_a_save_replaces_the_engine_each_see_one_version(engine, tmp_path):
    """Two versions (the second's weights scaled, so its caches differ) saved in turn while readers load and
    prefill: every load computes one version's caches, never fails, never mixes."""
    second = EngineArtifact(engine.entry_points, {n: w * 1.25 for n, w in engine.weights.items()}, engine.config)
    versions = [engine, second]
    path = engine.save(tmp_path / "bundle")
    expected = [_caches(version) for version in versions]

    def outcome() -> str:
        caches = _caches(load_artifact(path))
        matches = [v for v, wanted in enumerate(expected)
                   if all(np.allclose(c, w, **TOLERANCE) for c, w in zip(caches, wanted))]
        return f"version {matches[0]}" if matches else "neither version"

    outcomes = loads_while_saving(versions, path, outcome, LOADS, READERS, pause=0.05)
    assert all(o.startswith("version") for o in outcomes), outcomes
    assert not np.allclose(expected[0][0], expected[1][0], **TOLERANCE), "the two versions compute different caches"
    assert {"version 0", "version 1"} <= set(outcomes), "the loads saw both versions (the saves did overlap them)"
