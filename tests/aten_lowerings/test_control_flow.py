"""Control flow (torch.cond, while_loop, scan, map): each program exported once, with static and with dynamic
dims, then compared with eager on inputs that take different branches and trip counts (zero included), through
the artifact, a bundle round trip, ``to_jax()``, the TF SavedModel and the command line; and the errors."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf
import pytest
import torch
from torch import nn
from torch._higher_order_ops.map import map as map_rows
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop
from torch.export import Dim

from torch_stablehlo.exporter import LoweringError, UnsupportedOpsError, export_to_stablehlo, load_artifact
from torch_stablehlo.tools.cli import main as cli


class Gate(nn.Module):
    """A data-dependent predicate; branches with different ops that use a parameter and a buffer, return two
    tensors, and one of which holds a nested cond."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("shift", torch.linspace(-1, 1, 4))

    def forward(self, x):
        def positive(x):
            inner = torch.cond(x.mean() > 0.5, lambda y: y * 2, lambda y: y.sin(), (x,))
            return self.linear(x) + self.shift, inner

        def negative(x):
            return x.cos() - self.shift, self.linear(x).relu()

        return torch.cond(x.sum() > 0, positive, negative, (x,))


class SizeGate(nn.Module):
    """A predicate on a symbolic size."""

    def forward(self, x):
        return torch.cond(x.shape[0] > 4, lambda x: x * 2, lambda x: x.exp() - 1, (x,))


class Counted(nn.Module):
    """``n`` steps (an input: zero or more) carrying an int64 counter, floats, an int32 sum and bool flags;
    the body uses a parameter."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4) * 0.5)

    def forward(self, x, n):
        def condition(i, x, total, flags):
            return i < n

        def body(i, x, total, flags):
            positive = x > 0
            return i + 1, torch.tanh(x @ self.weight), total + positive.sum(dtype=torch.int32), flags ^ positive

        start = (torch.zeros((), dtype=torch.int64), x, torch.zeros((), dtype=torch.int32),
                 torch.zeros_like(x, dtype=torch.bool))
        return while_loop(condition, body, start)


def _halve_until_small(x):
    """A data-dependent trip count: halve ``x`` while any element exceeds 1 (zero times if none does)."""
    return while_loop(lambda x: x.abs().max() > 1, lambda x: (x / 2,), (x,))[0]


class Nested(nn.Module):
    """Loops in a loop, a cond in a loop and a loop in a cond."""

    def forward(self, x, n):
        def body(i, x):
            y = _halve_until_small(x * 3)
            return i + 1, torch.cond(y.sum() > 0, lambda y: y - 0.5, lambda y: y + 1.5, (y,))

        _, looped = while_loop(lambda i, x: i < n, body, (torch.zeros((), dtype=torch.int64), x))
        return torch.cond(looped.sum() > 0, _halve_until_small, lambda x: x.clone(), (looped * 4,))


class RNN(nn.Module):
    """torch's scan over two sequences with two carries and two stacked outputs, the step using parameters."""

    def __init__(self, reverse=False):
        super().__init__()
        self.reverse = reverse
        self.cell = nn.Linear(8, 8)
        self.input = nn.Linear(3, 8)

    def forward(self, h, xs, gates):
        def step(carry, inputs):
            h, peak = carry
            x, gate = inputs
            h = torch.tanh(self.cell(h) + self.input(x)) * gate.unsqueeze(-1)
            return (h, torch.maximum(peak, h.amax(-1))), (h.clone(), h.sum(-1))

        return scan(step, (h, h.amax(-1)), (xs, gates), reverse=self.reverse)


class Rows(nn.Module):
    """torch's map over rows, with a parameter and an extra input."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, xs, bias):
        return map_rows(lambda x, bias: self.linear(x).sin() + bias, xs, bias)


def _n(count):
    return torch.tensor(count, dtype=torch.int64)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@dataclass
class Case:
    model: nn.Module
    inputs: list[tuple]                 # of the export example's sizes (the first is that example)
    dims: dict = field(default_factory=dict)   # input position -> {dim: Dim}, for the dynamic export

    def dynamic_shapes(self):
        return tuple(self.dims.get(i) for i in range(len(self.inputs[0])))


BATCH = Dim("batch", min=2, max=16)
STEPS = Dim("steps", min=2, max=16)
X = _randn(5, 4)
CASES = {
    "cond": Case(Gate(), [(X,), (-X.abs(),), (X.abs() + 1,)], {0: {0: BATCH}}),
    "cond_on_size": Case(SizeGate(), [(_randn(6, 4),), (_randn(6, 4, seed=1),)], {0: {0: BATCH}}),
    "while_counted": Case(Counted(), [(X, _n(3)), (X, _n(0)), (-X, _n(1)), (X * 2, _n(7))], {0: {0: BATCH}}),
    "while_nested": Case(Nested(), [(X, _n(2)), (X, _n(0)), (-X * 5, _n(3))], {0: {0: BATCH}}),
    "scan": Case(RNN(), [(_randn(2, 8), _randn(6, 2, 3), _randn(6, 2))], {1: {0: STEPS}, 2: {0: STEPS}}),
    "scan_reverse": Case(RNN(reverse=True), [(_randn(2, 8), _randn(6, 2, 3), _randn(6, 2))],
                         {0: {0: BATCH}, 1: {0: STEPS, 1: BATCH}, 2: {0: STEPS, 1: BATCH}}),
    "map": Case(Rows(), [(_randn(6, 4), _randn(4))], {0: {0: BATCH}}),
}
# inputs of other sizes, for the dynamic exports (a static one fixes x.shape[0] > 4, keeping one branch)
RESIZED = {
    "cond": [(_randn(9, 4),), (-_randn(3, 4).abs(),)],
    "cond_on_size": [(_randn(4, 4),), (_randn(2, 4),), (_randn(5, 4),)],
    "while_counted": [(_randn(11, 4), _n(4)), (_randn(2, 4), _n(0))],
    "while_nested": [(_randn(8, 4), _n(2))],
    "scan": [(_randn(2, 8), _randn(3, 2, 3), _randn(3, 2))],
    "scan_reverse": [(_randn(5, 8), _randn(9, 5, 3), _randn(9, 5)), (_randn(2, 8), _randn(2, 2, 3), _randn(2, 2))],
    "map": [(_randn(13, 4), _randn(4))],
}
for _case in CASES.values():
    _case.model.eval()


@pytest.fixture(scope="module", params=[(name, dynamic) for name in CASES for dynamic in (False, True)],
                ids=lambda p: f"{p[0]}-{'dynamic' if p[1] else 'static'}")
def exported(request):
    """(artifact, case, every input set to compare on), one export per case and kind of dims."""
    name, dynamic = request.param
    case = CASES[name]
    torch._dynamo.reset()  # else what dynamo cached of an earlier export of torch's scan can specialise a dim
    program = torch.export.export(case.model, case.inputs[0],
                                  dynamic_shapes=case.dynamic_shapes() if dynamic else None)
    return export_to_stablehlo(program), case, case.inputs + (RESIZED[name] if dynamic else [])


def _eager(case, inputs):
    with torch.no_grad():
        return case.model(*inputs)


def _assert_matches(actual, expected):
    actual = [torch.as_tensor(np.asarray(a)) for a in torch.utils._pytree.tree_leaves(actual)]
    torch.testing.assert_close(actual, list(torch.utils._pytree.tree_leaves(expected)))


def test_artifact_matches_eager(exported):
    artifact, case, inputs = exported
    for args in inputs:
        _assert_matches(artifact(*args), _eager(case, args))


def test_bundle_round_trip(exported, tmp_path):
    artifact, case, inputs = exported
    loaded = load_artifact(artifact.save(tmp_path / "bundle"))
    for args in inputs:
        _assert_matches(loaded(*args), _eager(case, args))


def test_to_jax(exported):
    artifact, case, inputs = exported
    model = artifact.to_jax()
    for args in inputs:
        _assert_matches(model(*[a.numpy() for a in args]), _eager(case, args))


def test_tf_saved_model(exported, tmp_path):
    artifact, case, inputs = exported
    serving = tf.saved_model.load(str(artifact.save_tf_saved_model(tmp_path / "tf"))).signatures["serving_default"]
    names = [slot.tensor.name for slot in artifact.signature.user_inputs]
    for args in inputs:
        outputs = serving(**{name: tf.constant(a.numpy()) for name, a in zip(names, args)})
        _assert_matches([outputs[slot.tensor.name].numpy() for slot in artifact.signature.user_outputs],
                        _eager(case, args))


def test_the_ops_lower_to_stablehlo_control_flow(exported):
    artifact, case, _ = exported
    text = artifact.stablehlo_text
    if isinstance(case.model, SizeGate) and not artifact.signature.is_dynamic:
        return  # torch.export kept the one branch that the static size takes
    expected = {Gate: "stablehlo.if", SizeGate: "stablehlo.if", Counted: "stablehlo.while", Nested: "stablehlo.while",
                RNN: "stablehlo.while", Rows: "stablehlo.while"}[type(case.model)]
    assert expected in text
    if isinstance(case.model, RNN):  # one loop, not one copy of the step per row
        assert text.count("stablehlo.while") == 1 and text.count("stablehlo.tanh") == 1


def gate_example():
    """A ``torch-stablehlo export`` factory."""
    return CASES["cond"].model, CASES["cond"].inputs[0]


def test_command_line_export_and_run(tmp_path):
    bundle, inputs = tmp_path / "bundle", tmp_path / "inputs.npz"
    assert cli(["export", f"{__name__}:gate_example", "--bundle", str(bundle), "--dynamic", "x:0=batch[2,16]"]) == 0
    for args in RESIZED["cond"]:
        np.savez(inputs, x=args[0].numpy())
        assert cli(["run", str(bundle), "--inputs", str(inputs), "--output", str(tmp_path / "out.npz")]) == 0
        with np.load(tmp_path / "out.npz") as out:
            _assert_matches([out[name] for name in out.files], _eager(CASES["cond"], args))


# -- errors: raised at conversion, naming the op and the model's line --------------------------------------

class DifferentShapes(nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x[:2] * 1, lambda x: x[:3] * 2, (x,))  # the line named


class Printing(nn.Module):
    def forward(self, x):
        torch._higher_order_ops.print("x is {x}", x=x)  # the line named
        return x + 1


def _line_of(model: nn.Module, text: str) -> str:
    lines, first = inspect.getsourcelines(type(model).forward)
    return f"{__file__}:{first + next(i for i, line in enumerate(lines) if text in line)}"


def test_branches_of_different_shapes_raise_naming_the_op_and_line():
    model = DifferentShapes()
    with pytest.raises(LoweringError, match="cond") as error:
        export_to_stablehlo(model, (torch.randn(5, 4),))
    assert "different shapes" in str(error.value) and _line_of(model, "the line named") in str(error.value)


def test_a_higher_order_op_without_a_lowering_raises_naming_it_and_its_line():
    model = Printing()
    with pytest.raises(UnsupportedOpsError, match="print") as error:
        export_to_stablehlo(model, (torch.randn(2, 3),))
    assert _line_of(model, "the line named") in str(error.value)
