"""The command line: an export in a fresh process (the sharded bundle and SavedModel the other tests read, and
output free of third-party logs), then run / verify / inspect / a dynamic export / failures through ``main`` in
this process (tests/test_documented_commands.py runs README's commands, each in a process of its own), and the
details (help, coverage, .pt2 input, errors)."""
import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torch_stablehlo.aten_lowerings.registry import LOWERINGS, lowering_for
from torch_stablehlo.exporter import export_to_stablehlo, load_artifact
from torch_stablehlo.exporter.formats.bundle import load_manifest
from torch_stablehlo.tools.cli import main, parse_dynamic, parse_size
from torch_stablehlo.golden import store, zoo
from tests.exporter.models import tiny_example

COMMANDS = ("export", "run", "verify", "inspect", "coverage", "explore")
FACTORY = '''
import torch


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x, *, bias):
        return {"y": torch.relu(self.fc(x)) + bias, "norm": x.norm(dim=1)}


def build():
    torch.manual_seed(0)
    return TwoInputs().eval(), (torch.randn(3, 8),), {"bias": torch.randn(4)}
'''


def _cli(*args, cwd):
    """``python -m torch_stablehlo ARGS`` in a fresh process."""
    return subprocess.run([sys.executable, "-m", "torch_stablehlo", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``torch-stablehlo export`` of a factory in the working folder to a sharded bundle and a SavedModel, in a
    fresh process (``python -m torch_stablehlo``; README's commands run the ``torch-stablehlo`` script)."""
    folder = tmp_path_factory.mktemp("cli")
    (folder / "cli_factory.py").write_text(FACTORY)
    result = _cli("export", "cli_factory:build", "--bundle", "bundle", "--saved-model", "served",
                  "--shard-size", "100B", cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    sys.path.insert(0, str(folder))
    try:
        model, args, kwargs = importlib.import_module("cli_factory").build()
    finally:
        sys.path.remove(str(folder))
    with torch.no_grad():
        expected = model(*args, **kwargs)
    return folder, result, args, kwargs, expected


def test_export_writes_a_sharded_bundle_and_a_saved_model(exported):
    folder, result, args, kwargs, expected = exported
    stdout = result.stdout
    assert "bundle: bundle (" in stdout and "saved model: served (" in stdout and "x: float32[3, 8]" in stdout
    assert len(list((folder / "bundle").glob("weights-*-of-00002.safetensors"))) == 2
    assert (folder / "served" / "saved_model.pb").is_file()
    torch.testing.assert_close(load_artifact(folder / "bundle")(*args, **kwargs), expected)


def test_export_prints_no_third_party_logs(exported):
    """The export's output, TensorFlow's SavedModel included, is ours alone (no PJRT, TF, torchao or pytree
    lines)."""
    result = exported[1]
    assert result.stderr == "", result.stderr[-3000:]
    assert result.stdout.startswith("inputs:\n")


def test_dynamic_dims_of_a_factory_that_also_passes_kwargs(exported, capsys, monkeypatch):
    """--dynamic names x only; the CLI fills in bias (static) for torch.export."""
    folder, _, args, kwargs, _ = exported
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    assert main(["export", "cli_factory:build", "--bundle", "dynamic", "--dynamic", "x:0=batch[1,64]"]) == 0
    assert "batch in [1, 64]" in capsys.readouterr().out
    model = importlib.import_module("cli_factory").build()[0]
    x = torch.randn(5, 8)
    got = load_artifact(folder / "dynamic")(x, **kwargs)
    torch.testing.assert_close(got, model(x, **kwargs))


def test_run_reads_and_writes_npz(exported, capsys, monkeypatch):
    folder, _, args, kwargs, expected = exported
    monkeypatch.chdir(folder)
    np.savez(folder / "inputs.npz", x=args[0].numpy(), bias=kwargs["bias"].numpy())
    assert main(["run", "bundle", "--inputs", "inputs.npz", "--output", "outputs.npz"]) == 0
    assert "y: float32[3, 4]" in capsys.readouterr().out  # the outputs are named after the model's dict keys
    with np.load(folder / "outputs.npz") as outputs:
        assert sorted(outputs.files) == ["norm", "y"]
        np.testing.assert_allclose(outputs["y"], expected["y"].numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(outputs["norm"], expected["norm"].numpy(), rtol=1e-6, atol=1e-6)


def test_verify_against_a_golden(exported, capsys, monkeypatch):
    folder, _, args, kwargs, expected = exported
    monkeypatch.chdir(folder)
    store.save_golden("two_inputs", args, kwargs, expected, data_dir=folder / "golden")
    assert main(["verify", "bundle", "--golden", str(folder / "golden" / "two_inputs.safetensors")]) == 0
    assert capsys.readouterr().out.startswith("PASS: bundle vs golden two_inputs: max abs error ")


def test_verify_fails_when_outputs_differ(exported, capsys):
    folder, _, args, kwargs, expected = exported
    wrong = {"y": expected["y"] + 1, "norm": expected["norm"]}
    store.save_golden("wrong", args, kwargs, wrong, data_dir=folder / "golden")
    assert main(["verify", str(folder / "bundle"), "--golden", str(folder / "golden" / "wrong.safetensors")]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("FAIL: ") and "outputs differ from golden wrong" in captured.err


def test_verify_bisect_names_the_op_that_disagrees(tmp_path, capsys, monkeypatch):
    """A zoo model's bundle verified with --bisect: the planted wrong gelu is named, with its node and line."""
    built = zoo.ZOO["mlp"].build()
    export_to_stablehlo(built.model, built.args).save(tmp_path / "mlp")
    assert main(["verify", str(tmp_path / "mlp"), "--golden", "mlp", "--bisect"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "bisect: every op agrees with eager torch"
    gelu = torch.ops.aten.gelu.default
    monkeypatch.setitem(LOWERINGS, gelu if gelu in LOWERINGS else gelu.overloadpacket,
                        lowering_for(torch.ops.aten.relu.default))
    report = tmp_path / "divergence.json"
    assert main(["verify", str(tmp_path / "mlp"), "--golden", "mlp", "--bisect-report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "bisect: aten.gelu.default (node gelu in module 'act1'" in out
    assert json.loads(report.read_text())["op"] == "aten.gelu.default"


def test_inspect_reports_signature_ops_versions_and_weights(exported, capsys):
    folder = exported[0]
    assert main(["inspect", str(folder / "bundle"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["versions"]["stablehlo_version"] == load_manifest(folder / "bundle")["stablehlo_version"]
    assert [s["name"] for s in report["signature"]["inputs"]] == ["fc.weight", "fc.bias", "x", "bias"]
    assert report["ops"]["stablehlo.dot_general"] == 1 and report["ops"]["func.func"] == 1
    assert report["weights"]["bytes"] == (8 * 4 + 4) * 4
    assert report["weights"]["largest"][0] == {"name": "fc.weight", "file": "weights-00001-of-00002.safetensors",
                                               "dtype": "float32", "shape": [4, 8], "bytes": 128}



def test_inspect_as_text(exported, capsys):
    assert main(["inspect", str(exported[0] / "bundle")]) == 0
    text = capsys.readouterr().out
    assert "stablehlo_version: " in text and "x: float32[3, 8]" in text and "128 B  fc.weight" in text


def test_a_failure_is_one_line_and_a_non_zero_exit(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing"), "--inputs", "x.npz", "--output", "y.npz"]) == 1
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"torch-stablehlo run: error: BundleError: {tmp_path / 'missing'}: no such bundle folder")


# -- in-process ------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: torch-stablehlo {command} ")


def test_export_with_dynamic_dims(tmp_path, capsys):
    assert main(["export", "tests.exporter.models:tiny_example", "--bundle", str(tmp_path / "b"),
                 "--dynamic", "x:0=batch[2,64]"]) == 0, capsys.readouterr().err
    signature = load_manifest(tmp_path / "b")["signature"]
    (symbol, bounds), = signature["dims"].items()
    assert bounds == [2, 64] and signature["inputs"][-1]["tensor"]["shape"] == [symbol, 8]
    assert f"{symbol} in [2, 64]" in capsys.readouterr().out


def test_export_from_a_saved_exported_program(tmp_path):
    model, args = tiny_example()
    torch.export.save(torch.export.export(model, args), tmp_path / "tiny.pt2")
    assert main(["export", str(tmp_path / "tiny.pt2"), "--bundle", str(tmp_path / "b"), "--no-text",
                 "--target-version", "minimum"]) == 0
    assert not (tmp_path / "b" / "module.mlir").exists()
    torch.testing.assert_close(load_artifact(tmp_path / "b")(*args), model(*args))


@pytest.mark.parametrize("argv, reason", [
    (["export", "tests.exporter.models:tiny_example"], "nothing to write: give --bundle DIR and/or --saved-model"),
    (["export", "no_such_module:build", "--bundle", "b"], "ModuleNotFoundError: No module named 'no_such_module'"),
    (["export", "tests.exporter.models:Counter", "--bundle", "b"], "returned a Counter; expected (model, args)"),
    (["export", "x.pt2", "--bundle", "b"], "FileNotFoundError: x.pt2: no such file"),
    (["export", "tests.exporter.models:tiny_example", "--bundle", "b", "--dynamic", "x=batch"],
     "--dynamic 'x=batch': expected ARG:DIM=NAME"),
    (["export", "tests.exporter.models:tiny_example", "--bundle", "b", "--target-version", "9.9.9"],
     "StableHLO target version 9.9.9 is outside"),
])
def test_errors_are_one_line(argv, reason, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))  # the tests package, from the temporary folder
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and reason in err, err
    assert not (tmp_path / "b").exists()


def test_traceback_on_request(capsys):
    assert main(["inspect", "nowhere", "--traceback"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.strip().splitlines()[-1].startswith("torch-stablehlo inspect: error:")


def test_coverage_writes_the_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCH_STABLEHLO_CACHE_DIR", "off")
    assert main(["coverage", "--out", str(tmp_path), "--ops", "sin", "--jobs", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {tmp_path / 'coverage.md'}",
                                                    f"wrote {tmp_path / 'coverage.json'}"]
    report = json.loads((tmp_path / "coverage.json").read_text())
    summary = report["summary"]
    assert summary["core_ops"] == len(report["ops"]) > 150
    assert summary["lowered"] == sum(row["lowering"] for row in report["ops"]) > 100
    assert list(report["opinfo"]) == ["sin"]
    assert set(report["opinfo"]["sin"]["static"]) == {"float32", "float16", "bfloat16", "int32", "int64", "bool"}
    assert report["opinfo"]["sin"]["static"]["float32"] == "P"
    static = summary["opinfo_static"]
    assert static["entries"] == 1 and static["passed"] == static["eligible"] == 6
    rows = {row["op"]: row for row in report["ops"]}
    assert rows["aten.sin.default"]["opinfo"]["float32"] == [1, 0, 0]  # one sample, passed
    assert rows["aten.convolution.default"]["quantized"] and not rows["aten.sin.default"]["quantized"]
    assert "quantized_decomposed.quantize_per_channel.default" in report["quantized_forms"]
    markdown = (tmp_path / "coverage.md").read_text()
    assert f"**{summary['lowered']} of {summary['core_ops']}** core ATen overloads" in markdown
    assert "| `aten.sin.default` | yes | 1/1 |" in markdown
    assert "| `quantized_decomposed.dequantize_per_tensor.default` | stablehlo.uniform_dequantize" in markdown


def test_parse_dynamic_shares_dims_by_name():
    shapes = parse_dynamic(["x:0=batch[1,64]", "y:0=batch[1,64]", "y:1=seq[,512]", "z:2=free"])
    assert shapes["x"][0] is shapes["y"][0]
    assert (shapes["x"][0].min, shapes["x"][0].max) == (1, 64)
    assert shapes["y"][1].max == 512 and shapes["z"][2].__name__ == "free"
    with pytest.raises(ValueError, match="dim 'batch' is given two ranges"):
        parse_dynamic(["x:0=batch[1,64]", "y:0=batch[2,64]"])
    with pytest.raises(ValueError, match="dim 0 of 'x' is given twice"):
        parse_dynamic(["x:0=a", "x:0=b"])


def test_parse_size():
    assert parse_size("2GB") == 2 * 10 ** 9 and parse_size("1.5 MiB") == 3 * 2 ** 19 and parse_size("123") == 123
    with pytest.raises(Exception, match="is not a size"):
        parse_size("lots")
