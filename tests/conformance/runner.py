"""The conformance runner: a torch.export program is converted and must behave as ``ep.module()`` does on its
example inputs (and extra inputs, where a case gives them): the same outputs, the same writes to the inputs it
mutates; and converting it twice must leave it as it was (its graph, weights, ShapeEnv and so its guards).

Programs come from ExportDB (``torch._export.db.examples``, shipped in the torch wheel: the programs torch.export's
authors document) and from ``examples.py`` (our own, written after torch.export's public documentation).
``python -m tests.conformance`` prints each program's result and the counts.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch._export.db.case import SupportLevel
from torch._export.db.examples import all_examples

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.conversion.read_only import ShapeEnvRecords
from torch_stablehlo.exported_program import shape_env_of


@dataclass
class Case:
    """One program: exported by ``export`` (None: ``torch.export.export`` of the model on the example inputs)."""
    name: str
    model: torch.nn.Module
    args: tuple
    kwargs: dict = field(default_factory=dict)
    dynamic_shapes: Any = None
    extra_args: list[tuple] = field(default_factory=list)  # more inputs to compare on (other sizes)
    export_options: dict = field(default_factory=dict)     # e.g. prefer_deferred_runtime_asserts_over_guards

    def export(self) -> torch.export.ExportedProgram:
        return torch.export.export(self.model, self.args, self.kwargs, dynamic_shapes=self.dynamic_shapes,
                                   **self.export_options)


def exportdb_cases(supported: bool = True) -> list[Case]:
    """ExportDB's cases (the supported ones by default), each with its extra inputs."""
    cases = []
    for name, case in sorted(all_examples().items()):
        if (case.support_level == SupportLevel.SUPPORTED) != supported:
            continue
        extra = [case.extra_args] if case.extra_args is not None else []
        cases.append(Case(name, case.model, case.example_args, dict(case.example_kwargs), case.dynamic_shapes, extra))
    return cases


def _snapshot(ep: torch.export.ExportedProgram) -> tuple:
    """What converting must not change: the graph's code, the weights' values, the ShapeEnv's records."""
    shape_env = shape_env_of(ep)
    weights = {k: v.detach().clone() for k, v in [*ep.state_dict.items(), *ep.constants.items()]
               if isinstance(v, torch.Tensor)}
    return ep.graph_module.code, weights, ShapeEnvRecords.of(shape_env) if shape_env is not None else None, \
        dict(ep.range_constraints)


def _same(a, b) -> bool:
    code_a, weights_a, env_a, ranges_a = a
    code_b, weights_b, env_b, ranges_b = b
    return code_a == code_b and env_a == env_b and ranges_a == ranges_b and weights_a.keys() == weights_b.keys() \
        and all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


def check(case: Case, twice: bool = True) -> None:
    """Raise AssertionError (or the conversion's own error) unless the case converts and matches
    ``ep.module()``; with ``twice``, also unless two conversions leave the program unchanged."""
    ep = case.export()
    before = _snapshot(ep)
    artifact = export_to_stablehlo(ep)
    if twice:
        export_to_stablehlo(ep)
    assert _same(before, _snapshot(ep)), f"{case.name}: converting changed the program"
    module, calls = ep.module(), [(case.args, case.kwargs), *[(extra, {}) for extra in case.extra_args]]
    for args, kwargs in calls:
        expected_inputs, actual_inputs = copy.deepcopy((args, kwargs)), copy.deepcopy((args, kwargs))
        with torch.no_grad():
            expected = module(*expected_inputs[0], **expected_inputs[1])
        actual = artifact(*actual_inputs[0], **actual_inputs[1])
        _assert_same(actual, expected, f"{case.name}: outputs differ from ep.module()")
        _assert_same(actual_inputs, expected_inputs, f"{case.name}: the inputs it writes differ")


def _assert_same(actual, expected, what: str) -> None:
    """The same pytree, tensors close (torch's default tolerances per dtype), other leaves equal."""
    actual_leaves, actual_spec = torch.utils._pytree.tree_flatten(actual)
    expected_leaves, expected_spec = torch.utils._pytree.tree_flatten(expected)
    assert actual_spec == expected_spec, f"{what}: structure {actual_spec} != {expected_spec}"
    for got, want in zip(actual_leaves, expected_leaves):
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(got, want.detach(), equal_nan=True, msg=lambda m: f"{what}: {m}")
        else:
            assert got == want, f"{what}: {got!r} != {want!r}"


def run(cases: list[Case], twice: bool = True, report: Callable[[str], None] = print) -> dict[str, str]:
    """Each case's result: "ok", or the error's type and first line."""
    results = {}
    for case in cases:
        try:
            check(case, twice)
            results[case.name] = "ok"
        except Exception as error:  # noqa: BLE001  (a measurement: every failure is counted and shown)
            results[case.name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]
        report(f"{case.name}: {results[case.name]}")
    return results
