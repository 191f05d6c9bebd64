"""Conformance with torch.export: a program converted by ``export_to_stablehlo`` must behave as ``ep.module()``
does on the same inputs (the same outputs, the same writes to the inputs it mutates), and converting it must leave
the program as it was (its graph, weights, ShapeEnv and so its guards, range constraints).

The check is in two phases, so that a measurement can tell them apart: ``convert_read_only`` (conversion errors
propagate as raised; ``ProgramChanged`` if the program moved) and ``run_against_module`` (run errors propagate;
``OutputsDiffer`` where the numbers or the written inputs differ; only shapes and dtypes where the program draws
random numbers or reads an ``empty`` tensor). ``tests/conformance`` runs it over ExportDB and
examples of our own; ``tools/export_tests.py`` over every program PyTorch's own export tests create.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

from torch_stablehlo.exported_program import shape_env_of
from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.conversion.read_only import ShapeEnvRecords
from torch_stablehlo.exporter.tolerances import disagreement


class ProgramChanged(AssertionError):
    """Converting changed the program it was given."""


class OutputsDiffer(AssertionError):
    """The converted program's outputs (or the inputs it writes) differ from ``ep.module()``'s."""


class ModuleFails(Exception):
    """``ep.module()`` itself raised on the inputs: there is nothing to compare with."""


@dataclass(frozen=True)
class Snapshot:
    """What converting must not change."""
    code: str
    weights: dict
    shape_env: ShapeEnvRecords | None
    ranges: dict

    @classmethod
    def of(cls, ep: torch.export.ExportedProgram) -> "Snapshot":
        shape_env = shape_env_of(ep)
        weights = {name: value.detach().clone() for name, value in [*ep.state_dict.items(), *ep.constants.items()]
                   if isinstance(value, torch.Tensor)}
        return cls(ep.graph_module.code, weights, ShapeEnvRecords.of(shape_env) if shape_env is not None else None,
                   dict(ep.range_constraints))

    def same(self, other: "Snapshot") -> bool:
        return (self.code, self.shape_env, self.ranges) == (other.code, other.shape_env, other.ranges) \
            and self.weights.keys() == other.weights.keys() \
            and all(torch.equal(self.weights[k], other.weights[k]) for k in self.weights)


def convert_read_only(ep: torch.export.ExportedProgram, twice: bool = True):
    """``export_to_stablehlo(ep)`` (twice: the second conversion sees what the first left); raises
    ProgramChanged where the program is not as it was."""
    before = Snapshot.of(ep)
    artifact = export_to_stablehlo(ep)
    if twice:
        export_to_stablehlo(ep)
    if not before.same(Snapshot.of(ep)):
        raise ProgramChanged("converting changed the program (its graph, weights, ShapeEnv or ranges)")
    return artifact


def draws_random(ep: torch.export.ExportedProgram) -> bool:
    """Whether the program draws random numbers (then only shapes and dtypes can be compared)."""
    return any(isinstance(node.target, torch._ops.OpOverload)
               and torch.Tag.nondeterministic_seeded in node.target.tags
               for module in ep.graph_module.modules() if isinstance(module, torch.fx.GraphModule)
               for node in module.graph.nodes)


aten = torch.ops.aten
_EMPTY = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default, aten.new_empty.default,
          aten.new_empty_strided.default, aten.empty_permuted.default}
_OVERWRITES = {aten.copy.default, aten.copy_.default, aten.fill.Scalar, aten.fill_.Scalar, aten.fill.Tensor,
               aten.fill_.Tensor, aten.zero.default, aten.zero_.default, aten.sym_size.int}


def reads_uninitialized(ep: torch.export.ExportedProgram) -> bool:
    """Whether the program reads an ``empty`` tensor's values before writing them (its results are undefined
    memory in eager, so only shapes and dtypes can be compared)."""
    return any(node.target in _EMPTY and any(user.target not in _OVERWRITES for user in node.users)
               for module in ep.graph_module.modules() if isinstance(module, torch.fx.GraphModule)
               for node in module.graph.nodes)


def run_against_module(ep: torch.export.ExportedProgram, artifact, calls: list[tuple[tuple, dict]]) -> None:
    """Run ``artifact`` and ``ep.module()`` on each ``(args, kwargs)`` (each on its own copy); raises
    OutputsDiffer where outputs or written inputs differ, ModuleFails where ``ep.module()`` itself raises."""
    module, values = ep.module(), not (draws_random(ep) or reads_uninitialized(ep))
    for args, kwargs in calls:
        expected_inputs, actual_inputs = copy.deepcopy((args, kwargs)), copy.deepcopy((args, kwargs))
        try:
            with torch.no_grad():
                expected = module(*expected_inputs[0], **expected_inputs[1])
        except Exception as error:  # noqa: BLE001  (whatever the reference raised, there is no reference)
            raise ModuleFails(f"ep.module() raised {type(error).__name__}: {error}") from error
        actual = artifact(*actual_inputs[0], **actual_inputs[1])
        assert_same(actual, expected, "outputs differ from ep.module()", values)
        assert_same(actual_inputs, expected_inputs, "the inputs it writes differ", values)


def check(ep: torch.export.ExportedProgram, calls: list[tuple[tuple, dict]], twice: bool = True) -> None:
    """Both phases: convert read-only, then match ``ep.module()`` on every call."""
    run_against_module(ep, convert_read_only(ep, twice), calls)


def assert_same(actual, expected, what: str, values: bool = True) -> None:
    """The same pytree; tensors agreeing by the tolerance table (``exporter.tolerances``; with ``values`` False
    the same shape and dtype only), other leaves equal. Raises OutputsDiffer."""
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    if actual_spec != expected_spec:
        raise OutputsDiffer(f"{what}: structure {actual_spec} != {expected_spec}")
    for got, want in zip(actual_leaves, expected_leaves):
        if want is None and isinstance(got, torch.Tensor) and got.numel() == 0:
            continue  # an undefined tensor: an eager kernel's None where the program's fake is an empty tensor
        if isinstance(want, torch.nn.Module) and isinstance(got, type(want)):  # a module input: its weights
            assert_same(dict(got.state_dict()), dict(want.state_dict()), what, values)
            continue
        if not isinstance(want, torch.Tensor):
            differs = None if got == want else f"{got!r} != {want!r}"
        elif not values:
            differs = None if (got.shape, got.dtype) == (want.shape, want.dtype) else \
                f"{got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}"
        else:
            differs = disagreement(got, want)
        if differs:
            raise OutputsDiffer(f"{what}: {differs}")
