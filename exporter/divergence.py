"""Numerics bisect: which op of a converted program disagrees with eager torch, and where it came from.

``find_divergence`` runs the program's graph in eager torch with every intermediate value recorded, and our
StableHLO with the same intermediates returned as extra ``@main`` results (one compile per chunk of
``chunk_size`` nodes, so memory stays bounded on large graphs). It compares them node by node in graph
order. A node that differs from eager is checked on its own: its op is run in torch on the values our
StableHLO gave its inputs. If that agrees with ours, the difference was inherited from an input and the
node is not blamed; the first node whose own computation disagrees is reported.

Tolerances are per dtype, from ``exporter.tolerances`` (the table the golden checks read too):
``|ours - eager| <= atol + rtol * max|eager|`` over the whole tensor. Integer results are exact, except those of
quantize ops, which may differ by one integer step (a value within rounding of a half step).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from torch_stablehlo.aten_lowerings import op_name
from torch_stablehlo.exported_program import STATE
from torch_stablehlo.quantize.schemes import QUANTIZE

from .formats.artifact import StableHLOArtifact
from .conversion.calls import tensor_inputs
from .conversion.locations import module_path, source_line
from .conversion.lowerable import Conversion
from .conversion.pipeline import convert
from .conversion.signature import RNG_SEED
from .tolerances import TOLERANCES

CHUNK_SIZE = 512
"""Intermediates exposed per compiled module: memory holds at most this many besides the graph's own."""

QUANTIZED_STEPS = 1
"""Integer steps a quantize op's result may differ by."""


@dataclass
class Divergence:
    """The first op whose own result disagrees with eager torch (see the module docstring)."""
    op: str                        # e.g. "aten.gelu.default"
    node: str                      # the FX node's name
    source: str | None             # "file.py:line" of the model code that called the op
    module: str                    # the nn.Module path ("" at top level)
    max_abs_err: float             # ours against the op run in torch on our inputs
    max_rel_err: float             # max_abs_err / max|expected|
    rtol: float
    atol: float
    inputs: list[tuple[str, str, list]]   # (node name, dtype, shape) of each tensor input
    output: tuple[str, list]       # (dtype, shape)
    inherited: int                 # later nodes that differ from eager only because of it (or later ones)

    def __str__(self) -> str:
        where = self.source or "no source line"
        module = f" in module '{self.module}'" if self.module else ""
        inputs = ", ".join(f"{name} {dtype}{shape}" for name, dtype, shape in self.inputs) or "none"
        return (f"{self.op} (node {self.node}{module}, {where}) disagrees with eager torch given the same inputs: "
                f"max abs error {self.max_abs_err:.4g}, max error relative to the output's scale "
                f"{self.max_rel_err:.4g} (tolerance: atol {self.atol:g} + rtol {self.rtol:g} x scale). "
                f"Inputs: {inputs}. Output: {self.output[0]}{self.output[1]}. "
                f"{self.inherited} later node(s) differ from eager because of it.")

    def to_json(self) -> dict:
        return dict(vars(self))


def find_divergence(model_or_program, args, kwargs=None, *, rtol: float | None = None, atol: float | None = None,
                    chunk_size: int = CHUNK_SIZE) -> Divergence | None:
    """The first op of ``model_or_program`` (an ``nn.Module`` or ``ExportedProgram``) whose StableHLO result for
    ``args``/``kwargs`` disagrees with eager torch, or None when every op agrees. ``rtol``/``atol`` replace the
    per-dtype defaults (``TOLERANCES``). Quantized programs are compared op by op in their unfused form."""
    kwargs = kwargs or {}
    conversion = convert(model_or_program, args, kwargs, quantized_ops="unfused")
    tensors = tensor_inputs(conversion.signature, args, kwargs)
    eager = _eager_values(conversion, tensors)
    compared = [n for n in conversion.graph_module.graph.nodes if _comparable(n)]
    ours: dict[torch.fx.Node, torch.Tensor] = {}
    for start in range(0, len(compared), chunk_size):
        ours.update(_our_values(conversion, tensors, compared[start:start + chunk_size]))
    inherited = 0
    for node in compared:
        expected = eager[node]
        tolerance = _tolerance(node, expected.dtype, rtol, atol)
        if _within(ours[node], expected, tolerance):
            continue
        own = _run_on(node, ours, eager)
        if _within(ours[node], own, tolerance):
            inherited += 1
            continue
        later = compared[compared.index(node) + 1:]
        inherited = sum(not _within(ours[n], eager[n], _tolerance(n, eager[n].dtype, rtol, atol)) for n in later)
        return _report(node, ours[node], own, tolerance, inherited)
    return None


def _comparable(node: torch.fx.Node) -> bool:
    """A top-graph op with one tensor result of known size that eager computes deterministically."""
    meta = node.meta.get("val")
    return (node.op == "call_function" and isinstance(meta, torch.Tensor) and not free_unbacked_symbols(meta)
            and torch.Tag.nondeterministic_seeded not in getattr(_op_of(node), "tags", ()))


def _op_of(node: torch.fx.Node):
    """The op that computes ``node`` (for ``getitem``, the multi-result op it takes a result of)."""
    return node.args[0].target if node.target is operator.getitem else node.target


def _eager_values(conversion: Conversion, tensors: list) -> dict:
    """Every node's value when torch runs the graph on the weights and inputs (on a copy of the state, which the
    graph may write in place: our run starts from the same values)."""
    weights = conversion.weights
    values: dict[torch.fx.Node, object] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            values[node] = super().run_node(node)
            return values[node]

    user_tensors = iter(tensors)
    placeholders = [weights[slot.target].clone() if slot.kind == STATE else
                    weights[slot.target] if slot.target in weights else
                    next(user_tensors) if slot.tensor is not None else slot.value
                    for slot in conversion.signature.inputs if slot.kind != RNG_SEED]
    with torch.no_grad():
        Recorder(conversion.graph_module).run(*placeholders)
    return values


def _our_values(conversion: Conversion, tensors: list, nodes: list) -> dict:
    """``nodes``' values computed by our StableHLO: ``@main`` built to return them too, run once."""
    module = conversion.lower(exposed=nodes)
    artifact = StableHLOArtifact(module.operation.get_asm(), conversion.signature, conversion.weights)
    results = artifact.main_results(tensors)
    return dict(zip(nodes, results[len(results) - len(nodes):]))


def _run_on(node: torch.fx.Node, ours: dict, eager: dict) -> torch.Tensor:
    """``node``'s op run in torch on the values our StableHLO gave its inputs (eager's where we have none)."""
    if node.target is operator.getitem:
        producer, index = node.args
        return _run_on(producer, ours, eager)[index]
    value_of = lambda arg: ours.get(arg, eager[arg])  # noqa: E731
    args = torch.fx.node.map_arg(node.args, value_of)
    kwargs = torch.fx.node.map_arg(node.kwargs, value_of)
    with torch.no_grad():
        return node.target(*args, **kwargs)


def _tolerance(node: torch.fx.Node, dtype: torch.dtype, rtol: float | None, atol: float | None):
    default_rtol, default_atol = TOLERANCES.get(dtype, (0.0, QUANTIZED_STEPS if _op_of(node) in QUANTIZE else 0))
    return (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)


def _errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(max abs error, max |expected|, the scale); a shape or NaN-placement mismatch is an infinite error."""
    if actual.shape != expected.shape:
        return math.inf, 0.0
    if expected.numel() == 0:
        return 0.0, 0.0
    wide = torch.complex128 if expected.is_complex() else torch.float64
    actual, expected = actual.to(wide), expected.to(wide)
    nan = expected.isnan()
    if not torch.equal(actual.isnan(), nan):
        return math.inf, 0.0
    same = (actual == expected) | nan  # equal infinities too
    error = torch.where(same, 0, (actual - expected).abs()).max().item()
    return error, torch.where(nan | expected.isinf(), 0, expected.abs()).max().item()


def _within(actual: torch.Tensor, expected: torch.Tensor, tolerance) -> bool:
    rtol, atol = tolerance
    error, scale = _errors(actual, expected)
    return error <= atol + rtol * scale


def _report(node: torch.fx.Node, actual: torch.Tensor, expected: torch.Tensor, tolerance, inherited: int):
    error, scale = _errors(actual, expected)
    where = source_line(node.meta.get("stack_trace"))
    producer = node.args[0] if node.target is operator.getitem else node
    inputs = [(arg.name, _dtype_name(arg.meta["val"].dtype), list(arg.meta["val"].shape))
              for arg in producer.all_input_nodes if isinstance(arg.meta.get("val"), torch.Tensor)]
    return Divergence(
        op=op_name(_op_of(node)), node=producer.name, source=f"{where[0]}:{where[1]}" if where else None,
        module=module_path(node), max_abs_err=error,
        max_rel_err=error / scale if scale else (0.0 if error == 0 else math.inf),
        rtol=tolerance[0], atol=tolerance[1], inputs=inputs,
        output=(_dtype_name(expected.dtype), list(expected.shape)), inherited=inherited)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
