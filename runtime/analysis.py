"""Compile and execution analysis: why each compile happened, what it cost, and where it came from.

With ``TORCH_STABLEHLO_DEBUG=1`` in the environment (or after ``enable()``), every compile prints one line on
stderr: the module's fingerprint and shape signature, the cause (first call, new shape signature), the disk
cache's answer (hit; or miss and why: the key part that differed from an entry for the same module), the
numbers of inputs, outputs and StableHLO ops, the compile time, and the user's frame that caused it. Every
execution prints its shape signature and time. At exit a summary counts compiles per module and warns when
one module was compiled for more than ``STORM_SIGNATURES`` shape signatures (a recompile storm: a dynamic
artifact serves every legal size, but each distinct shape is compiled once; pad or bucket inputs to a few sizes).
"""
from __future__ import annotations

import atexit
import os
import re
import sys
import traceback
from collections import defaultdict
from dataclasses import dataclass

from jaxlib.mlir import ir

from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.op_counts import count_ops
from torch_stablehlo.stablehlo_ir.refine import main_function

from . import settings

STORM_SIGNATURES = 4
PREFIX = "[torch-stablehlo]"
_OUR_PACKAGES = tuple(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + name + os.sep
                      for name in ("exporter", "runtime", "stablehlo_ir", "aten_lowerings", "quantize"))


@dataclass
class CompileRecord:
    module: str          # fingerprint of the module text (the first 12 hex digits)
    shapes: str          # the shape signature compiled for ("static" for a static module)
    cause: str
    disk: str            # "hit", "miss (...), written", "off"
    inputs: int
    outputs: int
    ops: int
    seconds: float
    frame: str           # file:line in function, of the user's code that caused it

    def __str__(self) -> str:
        return (f"{PREFIX} compile {self.module} [{self.shapes}]: {self.cause}; disk cache {self.disk}; "
                f"{self.inputs} inputs, {self.outputs} outputs, {self.ops} ops, {self.seconds:.2f} s; "
                f"from {self.frame}")


class Analysis:
    """The compiles and executions of this process (recorded only while enabled)."""

    def __init__(self, enabled: bool, stream=None):
        self.enabled = enabled
        self.stream = stream
        self.compiles: list[CompileRecord] = []
        self.executions: dict[str, int] = defaultdict(int)
        self._signatures: dict[str, list[str]] = defaultdict(list)

    def cause(self, module: str, shapes: str) -> str:
        """Why ``module`` is compiled for ``shapes`` now (asked before the compile)."""
        seen = self._signatures[module]
        if not seen:
            return "first call"
        return f"new shape signature (compiled before for {', '.join(seen[-3:])})"

    def compiled(self, mlir_text: str, module: str, shapes: str, cause: str, disk: str, seconds: float) -> None:
        self._signatures[module].append(shapes)
        inputs, outputs = _arity(mlir_text)
        record = CompileRecord(module, shapes, cause, disk, inputs, outputs, count_ops(mlir_text), seconds,
                               user_frame())
        self.compiles.append(record)
        self._print(str(record))

    def executed(self, module: str, shapes: str, seconds: float) -> None:
        self.executions[module] += 1
        self._print(f"{PREFIX} execute {module} [{shapes}]: {seconds * 1e3:.2f} ms")

    def summary(self) -> list[str]:
        lines = []
        for module, signatures in self._signatures.items():
            lines.append(f"{PREFIX} summary: {module} compiled {len(signatures)} time(s), "
                         f"executed {self.executions[module]} time(s)")
            if len(signatures) > STORM_SIGNATURES:
                lines.append(f"{PREFIX} warning: {module} was compiled for {len(signatures)} shape signatures "
                             f"({', '.join(signatures[:6])}{', ...' if len(signatures) > 6 else ''}): a recompile "
                             "storm; each distinct input shape is compiled once, so pad or bucket the inputs to "
                             "a few sizes")
        return lines

    def _print(self, line: str) -> None:
        print(line, file=self.stream or sys.stderr, flush=True)


ANALYSIS = Analysis(settings.DEBUG.value())


def enable(on: bool = True, stream=None) -> Analysis:
    """Turn the analysis on (or off) for this process, printing to ``stream`` (default stderr)."""
    ANALYSIS.enabled, ANALYSIS.stream = on, stream
    return ANALYSIS


def input_output_aliases(loaded) -> dict[int, int]:
    """A compiled executable's donated parameters, from its optimized HLO's ``input_output_alias``: parameter ->
    the result that reuses its buffer (``@main``'s ``tf.aliasing_output`` arguments, the state)."""
    header = loaded.hlo_modules()[0].to_string().split("\n", 1)[0]
    return {int(parameter): int(result) for result, parameter in _ALIAS.findall(header)}


_ALIAS = re.compile(r"\{(\d+)\}: \((\d+), \{\}, (?:may|must)-alias\)")


def user_frame() -> str:
    """The innermost frame of the caller's code: outside this toolkit's packages and installed libraries."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_OUR_PACKAGES) and "site-packages" not in path and not frame.filename.startswith("<frozen"):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "no frame outside the toolkit"


def _arity(mlir_text: str) -> tuple[int, int]:
    with make_context():
        module = ir.Module.parse(mlir_text)
        function_type = ir.FunctionType(ir.TypeAttr(main_function(module).attributes["function_type"]).value)
        return len(function_type.inputs), len(function_type.results)


def _summarise_at_exit() -> None:
    if ANALYSIS.enabled:
        for line in ANALYSIS.summary():
            ANALYSIS._print(line)


atexit.register(_summarise_at_exit)
