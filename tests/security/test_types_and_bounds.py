"""Typed and bounded: element types of every weight, state and input slot are checked against @main (PJRT takes
any buffer of the right byte size, so a mismatch would be reinterpreted bits), and every malformed bundle is a
BundleError naming the field or file: sizes bounded in product, integers of any length, a manifest of bounded size,
its format and an integer format_version."""
import json

import pytest
import safetensors.torch
import torch

from torch_stablehlo.exporter import BundleError, export_to_stablehlo, load_artifact
from torch_stablehlo.exporter.errors import BundleVersionError
from torch_stablehlo.runtime import settings

from .bundles import MANIFEST, edit_manifest, read_manifest, rewrite_file


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("n", torch.zeros(()))

    def forward(self, x):
        self.n.add_(1)
        return x * self.n


def test_a_state_stored_as_another_dtype_of_the_same_size_is_refused(tmp_path):
    """The adversary keeps everything consistent but the module: the state is int32 in the manifest and in the
    weights file (a counter of 7), float32 in @main, so only the element type check can refuse it."""
    path = export_to_stablehlo(Counter(), (torch.ones(3),)).save(tmp_path / "counter")

    def declare_int32(manifest):
        slot = next(s for s in manifest["signature"]["inputs"] if s["kind"] == "state")
        slot["tensor"]["dtype"] = manifest["weights"][slot["target"]]["dtype"] = "int32"
    edit_manifest(path, declare_int32)
    rewrite_file(path, "weights.safetensors", safetensors.torch.save({"n": torch.tensor(7, dtype=torch.int32)}))
    with pytest.raises(BundleError, match=r"@main's argument 0 \(n\) holds f32 in the module, int32 \(i32\) in the "
                                          r"signature"):
        load_artifact(path)


def test_an_input_of_another_dtype_than_the_module_takes_is_refused(saved):
    edit_manifest(saved, lambda m: m["signature"]["inputs"][-1]["tensor"].__setitem__("dtype", "int32"))
    with pytest.raises(BundleError, match=r"@main's argument 2 \(input\) holds f32 in the module, int32"):
        load_artifact(saved)


def test_an_output_of_another_dtype_than_the_module_returns_is_refused(saved):
    edit_manifest(saved, lambda m: m["signature"]["outputs"][0]["tensor"].__setitem__("dtype", "float16"))
    with pytest.raises(BundleError, match=r"@main's result 0 .*holds f32 in the module, float16"):
        load_artifact(saved)


def _unused_weight(shape, dtype="float32", nbytes=None):
    def change(manifest):
        manifest["weights"]["unused"] = {"file": None, "dtype": dtype, "shape": shape,
                                         "bytes": nbytes if nbytes is not None else 0}
    return change


@pytest.mark.parametrize("change, field", [
    (_unused_weight([2 ** 62, 3], nbytes=2 ** 62 * 12), r"weights\['unused'\]\.bytes: expected an integer in"),
    (_unused_weight([2 ** 62, 3], nbytes=8), r"weights\['unused'\]\.bytes: expected float32\[.*\]'s size"),
    (_unused_weight([2 ** 31, 2 ** 31], "float64", 2 ** 62), r"weights\['unused'\]\.bytes: expected float64"),
    (lambda m: m["signature"]["inputs"][-1]["tensor"].__setitem__("shape", ["batch", 2 ** 40, 2 ** 40]),
     r"signature\.inputs\[2\]\.tensor\.shape: expected static sizes whose product in bytes is below 2\*\*63"),
    (lambda m: m.__setitem__("format_version", "3"), "format_version: expected an integer .*got str '3'"),
    (lambda m: m.__setitem__("format_version", True), "format_version: expected an integer"),
    (lambda m: m.__setitem__("format", "someone-elses-bundle"), "its format is str 'someone-elses-bundle', expected "
                                                                "'torch-stablehlo-bundle'"),
    (lambda m: m.pop("format"), "its format is NoneType None"),
])
def test_sizes_and_format_fields_that_do_not_fit_are_bundle_errors_naming_them(saved, change, field):
    edit_manifest(saved, change)
    with pytest.raises(BundleError, match=field):
        load_artifact(saved)


@pytest.mark.parametrize("field", ["format_version", "weights.weight.bytes", "signature.dims.batch.1"])
def test_an_integer_of_5000_digits_is_a_bundle_error_not_pythons_digit_limit(saved, field):
    keys = field.split(".")
    marker = 123456789123
    manifest = read_manifest(saved)
    target = manifest
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    target[int(keys[-1]) if keys[-1].isdigit() else keys[-1]] = marker
    text = json.dumps(manifest).replace(str(marker), "9" * 5000)
    (saved / MANIFEST).write_text(text)
    with pytest.raises(BundleError, match="an integer of 5000 digits"):
        load_artifact(saved)


def test_a_stablehlo_version_of_5000_digits_is_a_bundle_version_error(saved):
    edit_manifest(saved, lambda m: m.__setitem__("stablehlo_version", "1." + "9" * 5000 + ".0"))
    with pytest.raises(BundleVersionError, match="invalid StableHLO version"):
        load_artifact(saved)


def test_a_manifest_over_the_bound_is_refused_unparsed(saved, monkeypatch):
    (saved / MANIFEST).write_text("[" + "{}," * (6 * 1024 ** 2) + "{}]")  # 18 MiB of empty objects
    with pytest.raises(BundleError, match=r"manifest\.json is \d+ bytes, over the 16777216 bytes .*"
                                          r"\$TORCH_STABLEHLO_MAX_MANIFEST_BYTES raises the bound"):
        load_artifact(saved)
    monkeypatch.setenv(settings.MAX_MANIFEST_BYTES.variable, "1KB")
    (saved / MANIFEST).write_text(json.dumps({"format_version": 3, "padding": "x" * 2000}))
    with pytest.raises(BundleError, match="over the 1000 bytes"):
        load_artifact(saved)
