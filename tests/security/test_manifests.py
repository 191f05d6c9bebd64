"""Manifests are data: dim texts are parsed by our grammar (never evaluated), pytree node types come only from
trusted modules (a bundle's own Python is never imported), and every malformed field is a BundleError naming it."""
import collections
import dataclasses
import json
import sys
import warnings

import numpy as np
import pytest
import sympy
import torch
import torch.utils._pytree as pytree
from transformers.modeling_outputs import CausalLMOutputWithPast

from torch_stablehlo.exporter import BundleError, load_artifact
from torch_stablehlo.exporter.conversion.dim_grammar import MAX_DEPTH, DimSyntaxError, parse
from torch_stablehlo.exporter.conversion.signature import InputSlot, OutputSlot, Signature
from torch_stablehlo.exporter.conversion.trees import TreeSpecError, load_treespec
from torch_stablehlo.exporter.formats.manifest_schema import INPUT_FIELDS, OUTPUT_FIELDS, SIGNATURE_FIELDS
from torch_stablehlo.tools import cli

from .bundles import edit_manifest

LEAF = {"type": None, "context": None, "children_spec": []}


# -- dim texts ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("batch", lambda b: b), ("2*batch + 1", lambda b: 2 * b + 1), ("5 - batch", lambda b: 5 - b),
    ("(batch//2)", lambda b: b // 2), ("(((batch - 1)//2)) + 1", lambda b: (b - 1) // 2 + 1),
    ("batch % 3", lambda b: b % 3), ("-batch + 10", lambda b: 10 - b)])
def test_the_grammar_reads_what_torch_writes(text, expected):
    batch = sympy.Symbol("batch", integer=True)
    for size in (2, 7, 16):
        assert int(parse(text).subs(batch, size)) == expected(size), (text, size)
    assert parse(str(parse(text))) == parse(text)  # printed back in the grammar


@pytest.mark.parametrize("text", [
    "batch + 0*__import__('os').system('id')", "os.system", "f(batch)", "batch ** 2", "batch / 2", "1//0",
    "batch +", "(batch", "batch)", "'batch'", "lambda: 0", "batch; 1", "x" * 300, "(" * (MAX_DEPTH + 1) + "b"
    + ")" * (MAX_DEPTH + 1), "", "1e3"])
def test_the_grammar_refuses_anything_else(text):
    with pytest.raises(DimSyntaxError):
        parse(text)


def test_a_dim_text_in_a_manifest_is_never_evaluated(saved, tmp_path):
    marker = tmp_path / "ran"
    evil = f"batch + 0*__import__('os').system('touch {marker}')"
    edit_manifest(saved, lambda m: m["signature"]["inputs"][-1]["tensor"]["shape"].__setitem__(0, evil))
    with pytest.raises(BundleError, match=r"signature\.inputs\[2\]\.tensor\.shape\[0\]: expected .*symbolic dim"):
        load_artifact(saved)
    assert not marker.exists()


def test_a_range_key_in_a_manifest_is_never_evaluated(saved, tmp_path):
    marker = tmp_path / "ran"
    edit_manifest(saved, lambda m: m["signature"]["dims"].__setitem__(
        f"__import__('os').system('touch {marker}')", [1, 2]))
    with pytest.raises(BundleError, match=r"signature\.dims key"):
        load_artifact(saved)
    assert not marker.exists()


# -- pytree node types ------------------------------------------------------------------------------------------

def test_a_bundle_never_imports_its_own_python(small, tmp_path, monkeypatch):
    """A bundle folder that is also a package, loaded from its parent (on sys.path), naming its own type."""
    model, artifact = small
    saved = artifact.save(tmp_path / "evilpkg")
    (saved / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    spec = [1, {"type": "evilpkg.Output", "context": json.dumps(["logits"]), "children_spec": [LEAF]}]
    edit_manifest(saved, lambda m: m["signature"].__setitem__("out_spec", json.dumps(spec)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    x = torch.randn(3, 8)
    with pytest.warns(UserWarning, match=r"evilpkg\.Output.*rebuilt as plain dicts and tuples"):
        out = load_artifact("evilpkg")(x)
    assert not (tmp_path / "ran").exists() and "evilpkg" not in sys.modules
    assert type(out) is dict and list(out) == ["logits"]
    torch.testing.assert_close(out["logits"], model(x), rtol=1e-5, atol=1e-5)  # f32 matmul of 8 terms


@pytest.mark.parametrize("context", [
    {"__enum__": True, "fqn": "evilpkg:Kind", "name": "A"},  # torch's treespec_loads imports an enum's module
    {"default_factory_module": "evilpkg", "default_factory_name": "f", "dict_context": ["logits"]}])
def test_a_context_that_names_a_module_is_refused_without_importing_it(saved, tmp_path, monkeypatch, context):
    (tmp_path / "evilpkg.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = [1, {"type": "collections.defaultdict", "context": json.dumps(context), "children_spec": [LEAF]}]
    edit_manifest(saved, lambda m: m["signature"].__setitem__("out_spec", json.dumps(spec)))
    with pytest.raises(BundleError, match="out_spec"):
        load_artifact(saved)
    assert not (tmp_path / "ran").exists() and "evilpkg" not in sys.modules


def test_model_output_types_from_trusted_modules_come_back():
    value = (torch.ones(1), {"a": torch.ones(1)}, CausalLMOutputWithPast(logits=torch.ones(2)),
             torch.return_types.max((torch.ones(1), torch.ones(1))))
    spec = pytree.tree_flatten(value)[1]
    text = pytree.treespec_dumps(pytree.TreeSpec(tuple, None, spec.children()[:3]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_treespec(text)
    rebuilt = pytree.tree_unflatten([torch.zeros(1)] * loaded.num_leaves, loaded)
    assert isinstance(rebuilt[2], CausalLMOutputWithPast) and list(rebuilt[1]) == ["a"]


@pytest.mark.parametrize("text", [
    "", "[", "[2, {}]", json.dumps([1, {"type": "builtins.dict", "context": "[\"a\", \"b\"]", "children_spec": [LEAF]}]),
    json.dumps([1, {"type": "builtins.dict", "context": None, "children_spec": [LEAF]}]),
    json.dumps([1, {"type": None, "context": None, "children_spec": [LEAF]}]),
    json.dumps([1, {"type": 3, "context": None, "children_spec": []}]),
    "[1, " + "[" * 100_000 + "]" * 100_000 + "]"])
def test_malformed_pytree_specs_are_tree_spec_errors(text):
    with pytest.raises(TreeSpecError):
        load_treespec(text)


def test_a_deeply_nested_pytree_is_refused():
    node = LEAF
    for _ in range(200):
        node = {"type": "builtins.tuple", "context": "null", "children_spec": [node]}
    with pytest.raises(TreeSpecError, match="nested deeper"):
        load_treespec(json.dumps([1, node]))


# -- the schema --------------------------------------------------------------------------------------------------

def _set(*keys_and_value):
    *keys, value = keys_and_value

    def change(manifest):
        target = manifest
        for key in keys[:-1]:
            target = target[key] if not callable(key) else key(target)
        target[keys[-1]] = value
    return change


def _first_weight(manifest):
    return next(iter(manifest["weights"].values()))


def _delete(*keys):
    def change(manifest):
        target = manifest
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]
    return change


MALFORMED = {
    "signature.inputs": _set("signature", "inputs", 5),
    r"signature.inputs\[0\].kind": _delete("signature", "inputs", 0, "kind"),
    r"signature.inputs\[0\].kind: expected one of": _set("signature", "inputs", 0, "kind", "custom_obj"),
    r"signature.inputs\[2\].tensor.dtype": _set("signature", "inputs", 2, "tensor", "dtype", "float99"),
    r"signature.inputs\[2\].tensor.shape\[1\]": _set("signature", "inputs", 2, "tensor", "shape", 1, [[8]]),
    r"signature.inputs\[2\].tensor": _set("signature", "inputs", 2, "tensor", "x"),
    r"signature.outputs\[0\].scalar": _set("signature", "outputs", 0, "scalar", "complex"),
    r"signature.dims\['batch'\]": _set("signature", "dims", "batch", [2]),
    "signature.mesh": _set("signature", "mesh", {"data": -1}),
    "signature.in_spec": _set("signature", "in_spec", "[1, {"),
    "signature.out_spec": _set("signature", "out_spec", "[1, " + "[" * 50_000 + "]" * 50_000 + "]"),
    r"weights\['weight'\].shape": _set("weights", "weight", "shape", "x"),
    r"weights\['weight'\].file": _set("weights", "weight", "file", "../weights.safetensors"),
    r"weights\['weight'\].bytes": _delete("weights", "weight", "bytes"),
    r"weight_aliases\['w2'\]": _set("weight_aliases", "w2", "nope"),
    "files key": _set("files", "/etc/passwd", {"bytes": 1, "sha256": "0" * 64}),
    r"files\['module.mlirbc'\].sha256": _set("files", "module.mlirbc", "sha256", "xyz"),
    "weights": _set("weights", []),
}


@pytest.mark.parametrize("field", list(MALFORMED))
def test_a_malformed_field_is_a_bundle_error_naming_it(saved, field):
    edit_manifest(saved, MALFORMED[field])
    with pytest.raises(BundleError, match=field.replace(".", r"\.") if "\\" not in field else field):
        load_artifact(saved)


def test_a_deeply_nested_manifest_is_a_bundle_error(saved):
    (saved / "manifest.json").write_text('{"format_version": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(BundleError, match="nested too deeply|not valid JSON"):
        load_artifact(saved)


@pytest.mark.parametrize("command", ["inspect", "run"])
def test_the_cli_refuses_a_dim_text_that_would_run_code(saved, tmp_path, command, capsys):
    """Through the CLI's ``main`` in this process: had the text run, the marker would be here."""
    marker = tmp_path / "ran"
    evil = f"batch + 0*__import__('os').system('touch {marker}')"
    edit_manifest(saved, lambda m: m["signature"]["inputs"][-1]["tensor"]["shape"].__setitem__(0, evil))
    numpy_inputs = tmp_path / "inputs.npz"
    np.savez(numpy_inputs, input=np.ones((3, 8), np.float32))
    extra = ["--inputs", str(numpy_inputs), "--output", str(tmp_path / "out.npz")] if command == "run" else []
    assert cli.main([command, str(saved), *extra]) != 0
    stderr = capsys.readouterr().err
    assert "signature.inputs[2].tensor.shape[0]" in stderr, stderr[-2000:]
    assert not marker.exists()


def test_registered_namedtuples_come_back_and_defaultdicts_are_plain_dicts_of_their_keys():
    Pair = collections.namedtuple("Pair", "a b")
    pytree._register_namedtuple(Pair, serialized_type_name="tests.security.Pair")
    value = (Pair(1, 2), collections.defaultdict(list, {"k": 3}))
    loaded = load_treespec(pytree.treespec_dumps(pytree.tree_flatten(value)[1]))
    pair, plain = pytree.tree_unflatten([1, 2, 3], loaded)
    assert type(pair) is Pair and pair == (1, 2) and type(plain) is dict and plain == {"k": 3}


def test_manifest_fields_describe_every_signature_field():
    """The manifest's one description of a signature names every field of its records: a field added to
    ``InputSlot``, ``OutputSlot`` or ``Signature`` is written, read and checked, or this fails."""
    for kind, fields in ((InputSlot, INPUT_FIELDS), (OutputSlot, OUTPUT_FIELDS), (Signature, SIGNATURE_FIELDS)):
        names = {f.name for f in dataclasses.fields(kind) if f.name != "live_trees"}
        assert names == set(fields), kind.__name__
