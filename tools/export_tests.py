"""The measurement against PyTorch's own export tests: every ExportedProgram that a torch.export test file creates
(``test/export/test_export.py`` of the PyTorch repository, given by path: nothing is downloaded) is converted with
``export_to_stablehlo`` and compared with ``ep.module()`` on its example inputs (``tools/conformance.py``: the
same outputs and written inputs, the program unchanged by converting it twice).

``torch.export.export`` and ``torch.export._trace._export`` are wrapped before the test file is imported, so that
the file's own names for them are the wrapped ones; each outermost call that returns a program is measured right
there, while the test's custom ops, configuration patches and process groups are still in place. The test's own
pass or fail does not matter here. Each program ends in one ``STATUS``:

- ``ok``: converts, matches (where ``ep.module()`` itself raises on the example inputs, a check the program makes
  failing: the artifact raises too); ``wrong``: converts, runs, and differs from ``ep.module()`` (or returns where
  it raises); ``changed``: converting changed the program; ``refused``: conversion raised (its error is the
  cause); ``run_error``: the converted program raised when run;
- ``unmeasurable``, not counted: the program has no example inputs, or fake ones of symbolic shapes (fake or meta
  tensors of static shapes are given values drawn at random).

    python -m torch_stablehlo.tools.export_tests PATH/test_export.py [-k SUBSTRING] [--json FILE]

A measurement outside the suite (it takes minutes): the figures go into the issue and the README.
"""
from __future__ import annotations

import argparse
import collections
import copy
import importlib.util
import json
import re
import sys
import unittest
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.export._trace
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.export.dynamic_shapes import _IntWrapper

from torch_stablehlo.exporter import UnsupportedOpsError

from . import conformance

STATUS = ("ok", "wrong", "changed", "refused", "run_error", "unmeasurable")
COUNTED = STATUS[:-1]


@dataclass(frozen=True)
class Program:
    """One program a test created, and what became of it."""
    test: str
    status: str
    cause: str = ""


def _cause(error: BaseException) -> str:
    """An error's type and first line, numbers masked so that like causes group together."""
    line = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if isinstance(error, UnsupportedOpsError):  # the ops it names are the cause
        line = "no lowering: " + ", ".join(sorted(error.unsupported))
    line = re.sub(r" at [^,]*, \S+\.py:\d+:", ":", line)  # where in the test file: not part of the cause
    return re.sub(r"\d+", "N", f"{type(error).__name__}: {line}")[:160]


def _valueless(value) -> bool:
    return isinstance(value, torch.Tensor) and (isinstance(value, FakeTensor) or value.is_meta)


def _drawn(value):
    """A real CPU tensor of a fake or meta tensor's (static) shape and dtype, drawn at random (a parameter stays
    one); None where its shape is symbolic."""
    if not all(isinstance(size, int) for size in value.shape):
        return None
    real = torch.randn(tuple(value.shape)).to(value.dtype) if value.dtype.is_floating_point else \
        torch.randint(0, 4, tuple(value.shape)).to(value.dtype)
    return torch.nn.Parameter(real, value.requires_grad) if isinstance(value, torch.nn.Parameter) else real


def _with_values(ep: torch.export.ExportedProgram, inputs):
    """``(ep, inputs)``; where some of their tensors are fake or meta (a test exported under FakeTensorMode), a
    shallow copy of ``ep`` and the inputs with those drawn at random (``_drawn``): conversion and ``ep.module()``
    read only their shapes and dtypes, so values drawn are as good as any. None where a shape is symbolic."""
    tensors = [*pytree.tree_leaves(inputs), *ep.state_dict.values(), *ep.constants.values()]
    if not any(_valueless(t) for t in tensors):
        return ep, inputs
    drawn = {id(t): _drawn(t) for t in tensors if _valueless(t)}
    if any(value is None for value in drawn.values()):
        return None
    copied = copy.copy(ep)
    copied._state_dict = {name: drawn.get(id(value), value) for name, value in ep.state_dict.items()}
    copied._constants = {name: drawn.get(id(value), value) for name, value in ep.constants.items()}
    return copied, pytree.tree_map(lambda value: drawn.get(id(value), value), inputs)


def measure(ep: torch.export.ExportedProgram, test: str) -> Program:
    """Convert ``ep`` and compare it with ``ep.module()`` on its example inputs (values drawn where they are
    fake: ``_with_values``)."""
    with unset_fake_temporarily(), torch.device("cpu"):  # a test may export inside a fake mode
        measured = _with_values(ep, ep.example_inputs) if ep.example_inputs is not None else None
        if measured is None:
            return Program(test, "unmeasurable", "no example inputs, or fake ones of symbolic shapes")
        return _measured(*measured, test)


def _measured(ep: torch.export.ExportedProgram, inputs, test: str) -> Program:
    # ints a test wrapped to mark them dynamic (ShapesCollection) are plain ints to a caller
    args, kwargs = pytree.tree_map_only(_IntWrapper, lambda wrapped: wrapped.val, copy.deepcopy(inputs))
    try:
        artifact = conformance.convert_read_only(ep)
    except conformance.ProgramChanged as error:
        return Program(test, "changed", _cause(error))
    except Exception as error:  # noqa: BLE001  (a measurement: every refusal is counted with its cause)
        return Program(test, "refused", _cause(error))
    try:
        conformance.run_against_module(ep, artifact, [(args, kwargs)])
    except conformance.ModuleFails as error:  # the artifact must refuse these inputs too
        return _refusing_alike(artifact, args, kwargs, test, error)
    except conformance.OutputsDiffer as error:
        return Program(test, "wrong", _cause(error))
    except Exception as error:  # noqa: BLE001
        return Program(test, "run_error", _cause(error))
    return Program(test, "ok")


def _refusing_alike(artifact, args, kwargs, test: str, module_error: conformance.ModuleFails) -> Program:
    """Where ``ep.module()`` raises on the example inputs (a check the program makes fails): ok where the
    artifact raises too, wrong where it returns."""
    try:
        artifact(*args, **kwargs)
    except Exception:  # noqa: BLE001  (any refusal matches: the reference's error is torch's own)
        return Program(test, "ok")
    return Program(test, "wrong", f"the artifact returned where {_cause(module_error)}")


class _Recorder:
    """Wraps the export entry points; measures each program an outermost call returns."""

    def __init__(self):
        self.programs: list[Program] = []
        self.test = "<import>"
        self._depth = 0

    def wrap(self, export):
        def measured_export(*args, **kwargs):
            self._depth += 1
            try:
                ep = export(*args, **kwargs)
            finally:
                self._depth -= 1
            if self._depth == 0 and isinstance(ep, torch.export.ExportedProgram):
                program = measure(ep, self.test)
                self.programs.append(program)
                print(f"{program.test}: {program.status} {program.cause}", flush=True)
            return ep
        return measured_export


def _tests(suite):
    for item in suite:
        yield from (_tests(item) if isinstance(item, unittest.TestSuite) else [item])


def run_file(path: Path, only: str | None = None) -> tuple[list[Program], int]:
    """Import the test file with the export entry points wrapped, run its tests; the programs measured and the
    number of tests run."""
    recorder = _Recorder()
    torch.export.export = recorder.wrap(torch.export.export)
    torch.export._trace._export = recorder.wrap(torch.export._trace._export)
    sys.path.insert(0, str(path.parent))  # the file's sibling modules
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    tests = [t for t in _tests(unittest.defaultTestLoader.loadTestsFromModule(module)) if only is None or only in t.id()]
    for test in tests:
        recorder.test = test.id().rsplit(".", 1)[-1]
        test.run(unittest.TestResult())
    return recorder.programs, len(tests)


def summary(programs: list[Program]) -> str:
    """The counts by status, and the causes of each status but ``ok``, most frequent first."""
    counts = collections.Counter(p.status for p in programs)
    counted = sum(counts[s] for s in COUNTED)
    lines = [f"{len(programs)} programs, {counted} counted: "
             + ", ".join(f"{s} {counts[s]}" for s in STATUS)
             + (f"; ok {100 * counts['ok'] / counted:.1f}% of counted" if counted else "")]
    for status in STATUS[1:]:
        causes = collections.Counter(p.cause for p in programs if p.status == status)
        if causes:
            lines.append(f"== {status}")
            lines += [f"{n:4d}  {cause}" for cause, n in causes.most_common()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a torch.export test file, e.g. test/export/test_export.py")
    parser.add_argument("-k", dest="only", help="run only the tests whose id contains this")
    parser.add_argument("--json", type=Path, help="write every program's result here")
    options = parser.parse_args(argv)
    programs, tests = run_file(options.path, options.only)
    print(f"\n{tests} tests run")
    print(summary(programs))
    if options.json:
        options.json.write_text(json.dumps([asdict(p) for p in programs], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
