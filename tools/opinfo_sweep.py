"""The OpInfo sweep: torch's own ``op_db`` sample inputs, exported, converted, run on PJRT, compared with eager.

Each OpInfo entry is swept in the dtypes it supports among ``DTYPES``, up to ``MAX_SAMPLES`` samples each.
All samples of one entry are called from one module, so an entry costs one export and one compile; if that
batch fails to export, convert or run, it is halved until every status belongs to one sample.

A sample ends in one of these states (``STATUS``), written one letter per sample in the report:

- counted: ``passed``; ``failed`` (ran, numbers differ from eager beyond ``torch.testing.assert_close``'s
  default tolerance for the dtype, and for float16/bfloat16/float32 also further from the float64 result than
  eager is; see ``_Sample.compare``); ``errored`` (our conversion or the run raised). The ``empty*``
  entries (``UNINITIALIZED``) compare shapes and dtypes only;
- not counted, with the reason kept: ``not_exportable`` (``torch.export`` itself refused the sample),
  ``random`` (eager gives different results for different seeds, or the converted program draws random
  numbers: there is nothing to compare bitwise; random ops are tested statistically instead), ``eager_error`` (eager torch raised).

With ``dynamic=True`` dim 0 of every tensor input is exported as ``Dim.DYNAMIC``; a sample torch.export
cannot export that way (it specialised the dim) is ``not_exportable``.
"""
from __future__ import annotations

import random
import re
import warnings
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
import torch.utils._pytree as pytree

from torch_stablehlo.exporter import UnsupportedOpsError, export_to_stablehlo

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool)
MAX_SAMPLES = 4
STATUS = {"passed": "P", "failed": "F", "errored": "E", "not_exportable": "X", "random": "R", "eager_error": "G"}
COUNTED = ("passed", "failed", "errored")
SAMPLE_SEED = 1234
"""The seed ``torch.testing``'s ``set_rng_seed`` gives every generator before each sample (its ``SEED``)."""
UNINITIALIZED = {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided"}
"""Entries whose values are undefined (uninitialised memory in eager): only shapes and dtypes are compared."""

_ATEN_IN_LOCATION = re.compile(r"aten\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+")


@dataclass
class SampleResult:
    status: str
    reason: str = ""
    aten_ops: frozenset = field(default_factory=frozenset)  # overloads the sample exercised


@lru_cache(maxsize=1)
def opinfos() -> dict:
    """op_db by full name (``name`` or ``name.variant``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return {full_name(info): info for info in op_db}


def full_name(info) -> str:
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def sweep_op(name: str, *, dynamic: bool = False, dtypes: list[str] | None = None) -> dict[str, list[SampleResult]]:
    """Results of one OpInfo entry, by dtype name (those of ``dtypes``, default ``DTYPES``, that the entry
    supports), one per sample in sample order."""
    info = opinfos()[name]
    supported = info.supported_dtypes("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = {dtype_name(dtype): _samples(info, dtype) for dtype in DTYPES
                   if dtype in supported and (dtypes is None or dtype_name(dtype) in dtypes)}
        _settle([s for group in samples.values() for s in group if s.result is None], dynamic)
    return {dtype: [sample.result for sample in group] for dtype, group in samples.items()}


def _samples(info, dtype: torch.dtype) -> list:
    _seed(0)
    try:
        return [_Sample(info, sample, dtype) for _, sample in zip(range(MAX_SAMPLES), sample_inputs(info, dtype))]
    except Exception as error:  # torch's own sample generator; nothing of ours ran
        return [_Settled(SampleResult("eager_error", f"sample_inputs raised: {_first_line(error)}"))]


def sample_inputs(info, dtype: torch.dtype, requires_grad: bool = False):
    """The samples ``info.sample_inputs("cpu", dtype, requires_grad)`` gives, drawn the same way (every
    generator seeded with ``SAMPLE_SEED`` before each sample), without its cost outside a
    ``unittest.TestCase``: it walks the caller's stack with ``inspect.stack()`` (source lines of every frame,
    each frame's module looked up among all loaded modules) to find a test method there is none of, and each
    ``torch.manual_seed`` formats the stack for CUDA's lazy seeding; under pytest that was about a second of
    CPU per entry."""
    samples = iter(info.sample_inputs_func(info, "cpu", dtype, requires_grad))
    while True:
        _seed(SAMPLE_SEED)
        try:
            yield next(samples)
        except StopIteration:
            return


def _seed(seed: int) -> None:
    """``torch.testing``'s ``set_rng_seed``, the CPU generators only."""
    torch.random.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _settle(samples: list, dynamic: bool) -> None:
    """Run ``samples`` as one module; if that fails before the comparison, split the batch until every failure
    belongs to one sample (one compile in the common case, a few more per sample that fails). An op without
    lowering fails every sample of a dtype alike and is not split further."""
    if not samples:
        return
    results = _run(samples, dynamic)
    if isinstance(results, _Failed):
        for part in _parts(samples, results.suspects):
            _settle(part, dynamic)
        return
    for sample in samples:
        sample.result = results[sample]


@dataclass
class _Failed:
    """A batch failed before the comparison; ``suspects`` are the samples the error names (maybe none)."""
    suspects: list


def _parts(samples: list, suspects: list) -> list[list]:
    """How to split a failed batch: the samples its error names, each alone, and the rest together (torch.export
    names the inputs whose dynamic dim it specialised); else by dtype; else in halves."""
    if suspects and len(suspects) < len(samples):
        return [[s] for s in suspects] + [[s for s in samples if s not in suspects]]
    dtypes = list(dict.fromkeys(sample.dtype for sample in samples))
    if len(dtypes) > 1:
        return [[s for s in samples if s.dtype == d] for d in dtypes]
    middle = len(samples) // 2
    return [samples[:middle], samples[middle:]]


_NAMED_INPUT = re.compile(r"\['tensors'\]\[(\d+)\]")


def _named_samples(error: Exception, samples: list) -> list:
    """The samples owning the batch inputs ``error`` names (``L['tensors'][3]``, ``inputs['tensors'][3]``)."""
    owners = [sample for sample in samples for _ in sample.tensors]
    named = {int(index) for index in _NAMED_INPUT.findall(str(error))}
    return list(dict.fromkeys(owners[i] for i in sorted(named) if i < len(owners)))


class _Settled:
    """A sample whose result is known before anything runs (its generator raised)."""

    def __init__(self, result: SampleResult):
        self.result = result


class _Sample:
    """One OpInfo sample: its tensors become module inputs, everything else is baked into the call."""

    def __init__(self, info, sample, dtype: torch.dtype):
        self.info = info
        self.dtype = dtype
        leaves, self.spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
        self.leaves = leaves
        self.tensor_positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self.tensors = [leaves[i] for i in self.tensor_positions]
        self.result = None
        self.expected = self._eager()

    def call(self, *tensors):
        leaves = list(self.leaves)
        for position, tensor in zip(self.tensor_positions, tensors):
            leaves[position] = tensor
        first, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.info.op(first, *args, **kwargs)

    def _eager(self):
        try:
            outputs = [self._seeded_call(seed) for seed in (0, 1)]
        except Exception as error:
            self.result = SampleResult("eager_error", _first_line(error))
            return None
        try:
            if self.info.name not in UNINITIALIZED:  # garbage differs between calls without being random
                torch.testing.assert_close(outputs[0], outputs[1], equal_nan=True, rtol=0, atol=0)
        except Exception:
            self.result = SampleResult("random", "eager results differ between seeds")
        return outputs[0]

    def compare(self, actual, ops: frozenset) -> SampleResult:
        """assert_close with the dtype's default tolerance; for floats, failing that, the rule of torch's own
        reference tests: no further from the float64 result than eager torch is, plus that tolerance (torch's
        low-precision kernels compute in float32 and round once, a chain of ops rounds at each step; float32
        sums such as addbmm's land on either side of the tolerance depending on which CPU kernels eager took,
        so the float64 result is the judge that holds on any CPU)."""
        try:
            if self.info.name in UNINITIALIZED:
                _assert_same_metadata(actual, self.expected)
            else:
                torch.testing.assert_close(actual, self.expected, equal_nan=True)
        except Exception as error:
            if not self._as_close_as_eager(actual):
                return SampleResult("failed", _reason(error), ops)
        return SampleResult("passed", "", ops)

    def _as_close_as_eager(self, actual) -> bool:
        expected = pytree.tree_leaves(self.expected)
        if self.dtype not in (torch.float16, torch.bfloat16, torch.float32) or not all(
                isinstance(t, torch.Tensor) and t.is_floating_point() for t in expected):
            return False
        with torch.no_grad():
            reference = self.call(*[t.double() if t.is_floating_point() else t for t in self.tensors])
        for got, eager, exact in zip(pytree.tree_leaves(actual), expected, pytree.tree_leaves(reference)):
            rtol, atol = torch.testing._comparison.default_tolerances(eager)
            exact = exact.double()
            allowed = (eager.double() - exact).abs() + atol + rtol * exact.abs()
            error = (got.double() - exact).abs()
            if got.shape != eager.shape or not bool(((error <= allowed) | (error.isnan() & exact.isnan())).all()):
                return False
        return True

    def _seeded_call(self, seed: int):
        torch.random.default_generator.manual_seed(seed)
        with torch.no_grad():
            return self.call(*[t.clone() for t in self.tensors])


class _Batch(torch.nn.Module):
    def __init__(self, samples: list[_Sample]):
        super().__init__()
        self.samples = samples

    def forward(self, *tensors):
        outputs, start = [], 0
        for sample in self.samples:
            count = len(sample.tensors)
            outputs.append(sample.call(*tensors[start:start + count]))
            start += count
        return tuple(outputs)


def _run(samples: list[_Sample], dynamic: bool) -> dict | _Failed:
    """Export, convert, run and compare ``samples`` in one module. A failure before comparison is the
    whole batch's: ``_Failed`` for a batch (which is then split), the sample's result for one."""
    tensors = [t.clone() for sample in samples for t in sample.tensors]
    alone = len(samples) == 1
    try:
        program = torch.export.export(_Batch(samples), tuple(tensors),
                                      dynamic_shapes=_batch_dims(tensors) if dynamic else None)
    except Exception as error:
        return _Failed(_named_samples(error, samples)) if not alone else {
            samples[0]: SampleResult("not_exportable", _first_line(error))}
    exported_ops = frozenset(str(n.target) for n in program.graph.nodes
                             if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload))
    try:
        artifact = export_to_stablehlo(program)
        actual = artifact(*tensors)
    except UnsupportedOpsError as error:  # names the op and its source line: the same for every sample of a dtype
        if len({sample.dtype for sample in samples}) > 1:
            return _Failed([])
        return {sample: SampleResult("errored", _reason(error), exported_ops) for sample in samples}
    except Exception as error:
        return _Failed([]) if not alone else {samples[0]: SampleResult("errored", _reason(error), exported_ops)}
    lowered_ops = exported_ops | frozenset(_ATEN_IN_LOCATION.findall(artifact.stablehlo_text))
    if artifact.signature.takes_rng_seed:  # op_db re-seeds eager on every call, so the seed check cannot tell
        return {sample: SampleResult("random", "draws random numbers (tested statistically instead)", lowered_ops)
                for sample in samples}
    return {sample: sample.compare(got, lowered_ops) for sample, got in zip(samples, actual)}


def _assert_same_metadata(actual, expected) -> None:
    for got, want in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected), strict=True):
        if (got.shape, got.dtype) != (want.shape, want.dtype):
            raise AssertionError(f"got {got.dtype} {tuple(got.shape)}, eager gives {want.dtype} {tuple(want.shape)}")


def _batch_dims(tensors: list[torch.Tensor]) -> tuple:
    """``dynamic_shapes`` for ``_Batch.forward(*tensors)``: the varargs are one tuple."""
    return (tuple({0: torch.export.Dim.DYNAMIC} if t.dim() > 0 else None for t in tensors),)


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _reason(error: Exception) -> str:
    """The error's type and its informative lines (assert_close puts the mismatch summary on lines 2-4)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {' '.join(lines[:4])}"[:400]
