"""explore: the overlays for a golden model's bundle are Model Explorer node data whose ids are the ids
Model Explorer's own MLIR adapter gives the module's ops, and the bisect's error lands on the ops lowered from
the op that disagrees."""
import json

import pytest
import torch
from model_explorer import config as explorer_config
from model_explorer.builtin_mlir_adapter import BuiltinMlirAdapter

from torch_stablehlo.aten_lowerings.registry import LOWERINGS, lowering_for
from torch_stablehlo.exporter import export_to_stablehlo, find_divergence
from torch_stablehlo.golden import zoo
from torch_stablehlo.tools.cli import main

GELU = torch.ops.aten.gelu.default


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    built = zoo.ZOO["mlp"].build()
    return export_to_stablehlo(built.model, built.args).save(tmp_path_factory.mktemp("explore") / "mlp")


@pytest.fixture(scope="module")
def adapter_nodes(bundle):
    """Model Explorer's graph of the bundle's @main: node id -> node."""
    graphs = BuiltinMlirAdapter().convert(str(bundle / "module.mlir"), {})["graphCollections"][0].graphs
    return {node["id"]: node for node in next(g for g in graphs if g["id"] == "main")["nodes"]}


@pytest.fixture
def divergence_report(tmp_path, monkeypatch):
    """A bisect report of the mlp with gelu lowered as relu."""
    monkeypatch.setitem(LOWERINGS, GELU if GELU in LOWERINGS else GELU.overloadpacket,
                        lowering_for(torch.ops.aten.relu.default))
    built = zoo.ZOO["mlp"].build()
    report = find_divergence(built.model, built.args)
    path = tmp_path / "divergence.json"
    path.write_text(json.dumps(report.to_json()))
    return path


def test_overlays_match_the_adapters_node_ids(bundle, adapter_nodes, divergence_report, tmp_path, capsys):
    out = tmp_path / "overlay.json"
    assert main(["explore", str(bundle), "--divergence", str(divergence_report), "--out", str(out)]) == 0
    lines_file, errors_file = tmp_path / "overlay.source_line.json", tmp_path / "overlay.max_abs_error.json"
    assert capsys.readouterr().out.splitlines() == [f"wrote {lines_file}", f"wrote {errors_file}"]
    lines = json.loads(lines_file.read_text())["main"]["results"]
    errors = json.loads(errors_file.read_text())["main"]["results"]
    forward = [i for i, text in enumerate(open(zoo.__file__), 1)
               if "h = self.norm(self.act1(" in text or "h = h + self.act2(" in text or "return self.head(h)" in text]
    # each id is an op of Model Explorer's graph, and carries a line of the MLP's forward (the three of them)
    assert lines and set(lines) <= set(adapter_nodes)
    assert {adapter_nodes[node]["label"] for node in lines} >= {"stablehlo.dot_general", "stablehlo.add"}
    assert len(forward) == 3 and {value["value"] for value in lines.values()} == set(forward)
    # the error sits on exactly the ops lowered from act1's gelu
    gelu_ops = {node for node, data in adapter_nodes.items()
                if data["namespace"].split("/")[:2] == ["act1", "aten.gelu.default"] or
                data["namespace"].startswith("act1/aten.gelu.default_")}
    assert set(errors) and set(errors) <= gelu_ops
    report = json.loads(divergence_report.read_text())
    assert {value["value"] for value in errors.values()} == {report["max_abs_err"]}


def test_overlays_load_in_model_explorers_config(bundle, divergence_report, tmp_path):
    out = tmp_path / "overlay.json"
    assert main(["explore", str(bundle), "--out", str(out)]) == 0  # source lines only: one file
    settings = explorer_config().add_model_from_path(str(bundle / "module.mlir")).add_node_data_from_path(str(out))
    assert settings.to_url_param_value()  # the config Model Explorer's server is started with
