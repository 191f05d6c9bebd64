"""The conformance runner: a torch.export program is converted and must behave as ``ep.module()`` does on its
example inputs (and extra inputs, where a case gives them): the same outputs, the same writes to the inputs it
mutates; and converting it twice must leave it as it was (``tools/conformance.py``, the one check).

Programs come from ExportDB (``torch._export.db.examples``, shipped in the torch wheel: the programs torch.export's
authors document) and from ``examples.py`` (our own, written after torch.export's public documentation).
``python -m tests.conformance`` prints each program's result and the counts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch._export.db.case import SupportLevel
from torch._export.db.examples import all_examples

from torch_stablehlo.tools import conformance


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


def check(case: Case, twice: bool = True) -> None:
    """Raise AssertionError (or the conversion's own error) unless the case converts and matches
    ``ep.module()`` on its example and extra inputs; with ``twice``, also unless two conversions leave the
    program unchanged."""
    conformance.check(case.export(), [(case.args, case.kwargs), *[(extra, {}) for extra in case.extra_args]], twice)


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
