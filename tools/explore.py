"""A bundle's module drawn in Google's Model Explorer, with our per-op data laid over it.

Two overlays (Model Explorer "node data"), both keyed by the node ids Model Explorer's MLIR adapter gives
``@main``'s ops (ids count every op of the function in pre-order, nested regions and terminators included):

- ``source line``: the model source line each op was lowered from (its MLIR location's ``file:line``);
- ``max abs error``: from a bisect report (``torch-stablehlo verify --bisect-report``, ``find_divergence``),
  the error of the op that disagrees with eager torch, on every StableHLO op lowered from it.
"""
from __future__ import annotations

import re
from pathlib import Path

from jaxlib.mlir import ir
from model_explorer import visualize
from model_explorer.node_data_builder import GraphNodeData, ModelNodeData, NodeDataResult

from torch_stablehlo.exporter.formats import bundle
from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.refine import main_function

GRAPH = "main"
HOST = "127.0.0.1"
ERROR_COLOR = "#e53935"
# loc("fc1/aten.linear.default"("/path/model.py":122:0)): the module path and op, then the source line
_LOCATION = re.compile(r'^loc\("(?P<name>[^"]*)"(?:\("(?P<file>[^"]*)":(?P<line>\d+):\d+\))?\)$')


def op_locations(module_text: str) -> dict[str, tuple[str, str | None, int | None]]:
    """Model Explorer's node id -> (``module.path/aten.op``, source file, line) for each op of ``@main``."""
    with make_context():
        module = ir.Module.parse(module_text)
        located: dict[str, tuple] = {}
        _number(main_function(module).regions[0].blocks[0], located)
        return located


def _number(block, located: dict) -> None:
    for op in block.operations:
        match = _LOCATION.match(str(op.location))
        located[str(len(located))] = ((match["name"], match["file"], int(match["line"]) if match["line"] else None)
                                      if match else ("", None, None))
        for region in op.regions:
            for inner in region.blocks:
                _number(inner, located)


def overlays(module_text: str, divergence: dict | None = None) -> dict[str, ModelNodeData]:
    """The node data to show: ``source line`` always, ``max abs error`` where a bisect report is given."""
    located = op_locations(module_text)
    lines = {node: NodeDataResult(value=line) for node, (_, _, line) in located.items() if line is not None}
    shown = {"source line": ModelNodeData(graphsData={GRAPH: GraphNodeData(results=lines)})}
    if divergence:
        name = f"{divergence['module']}/{divergence['op']}" if divergence["module"] else divergence["op"]
        errors = {node: NodeDataResult(value=divergence["max_abs_err"], bgColor=ERROR_COLOR)
                  for node, (op, file, line) in located.items()
                  if op == name and divergence["source"] == f"{file}:{line}"}
        shown["max abs error"] = ModelNodeData(graphsData={GRAPH: GraphNodeData(results=errors)})
    return shown


def module_path(path: Path) -> Path:
    """The bundle's readable module (Model Explorer reads ``.mlir`` text), checked as ``load_artifact`` checks it."""
    path = Path(path)
    manifest = bundle.load_manifest(path)
    if bundle.MODULE_TEXT not in manifest["files"]:
        raise FileNotFoundError(f"{path} has no module.mlir (saved with --no-text?); re-save it with the text "
                                "to explore it")
    return bundle.checked_file(path, manifest, bundle.MODULE_TEXT)


def write_overlays(shown: dict[str, ModelNodeData], out: Path) -> list[Path]:
    """Each overlay as a Model Explorer node-data JSON file: ``out`` itself for one, ``out`` stem + name else."""
    paths = []
    for name, data in shown.items():
        path = out if len(shown) == 1 else out.with_name(f"{out.stem}.{name.replace(' ', '_')}{out.suffix}")
        data.save_to_file(str(path))
        paths.append(path)
    return paths


def serve(bundle: Path, shown: dict[str, ModelNodeData], port: int) -> None:
    """Start Model Explorer's local server on 127.0.0.1 with the bundle's module and the overlays."""
    visualize(str(module_path(bundle)), host=HOST, port=port,
              node_data=[{"name": name, "node_data": data} for name, data in shown.items()])
