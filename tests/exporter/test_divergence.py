"""find_divergence: a wrong lowering planted in the registry is found and named (op, node, source line), a
difference inherited from an input is not blamed on its consumer, and the clean registry finds nothing on
every golden model."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from jaxlib.mlir.dialects import stablehlo

from torch_stablehlo.aten_lowerings.constants import full_like
from torch_stablehlo.aten_lowerings.registry import LOWERINGS, lowering_for
from torch_stablehlo.exporter import export_to_stablehlo, find_divergence
from torch_stablehlo.golden import zoo
from torch_stablehlo.golden.quantized_zoo import pt2e_quantize

from ..conftest import sampled

aten = torch.ops.aten
THIS_FILE = Path(__file__)


def line_of(text: str) -> str:
    """``file:line`` of the line of this file holding ``text`` (the model code that calls the planted op)."""
    lines = THIS_FILE.read_text().splitlines()
    return f"{THIS_FILE}:{next(i for i, line in enumerate(lines, 1) if text in line and 'line_of' not in line)}"


def plant(monkeypatch, op, rule) -> None:
    """Lower ``op`` with ``rule`` for this test."""
    monkeypatch.setitem(LOWERINGS, op if op in LOWERINGS else op.overloadpacket, rule)


def doubled(op):
    """``op``'s own rule, its result doubled: wrong for any op but zero-valued ones."""
    rule = lowering_for(op)
    return lambda ctx, *args, **kwargs: stablehlo.add(rule(ctx, *args, **kwargs), rule(ctx, *args, **kwargs))


class ExpMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.exp(self.fc1(x) * 0.1)  # planted: exp
        return self.fc2(torch.tanh(h))  # planted: tanh


class Attention(torch.nn.Module):
    def __init__(self, width: int = 16, heads: int = 2):
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).reshape(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)  # planted: softmax
        return self.out((weights @ v).transpose(1, 2).reshape(batch, length, width))


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 4, 3)

    def forward(self, x):
        h = F.relu(self.conv1(x))  # planted: relu
        return F.max_pool2d(self.conv2(h), 2).mean(dim=(2, 3))


def test_planted_exp_in_an_mlp_is_named_with_its_node_and_line(monkeypatch):
    plant(monkeypatch, aten.exp.default, lowering_for(aten.log1p.default))
    report = find_divergence(ExpMLP().eval(), (torch.randn(4, 8),))
    assert report is not None
    assert (report.op, report.node, report.source) == ("aten.exp.default", "exp", line_of("planted: exp"))
    assert report.max_abs_err > 1e-3 and report.max_rel_err > 1e-3
    assert report.output == ("float32", [4, 16]) and report.inputs == [("mul", "float32", [4, 16])]
    assert (report.rtol, report.atol) == (1e-4, 1e-6)
    assert "aten.exp.default (node exp" in str(report) and line_of("planted: exp") in str(report)


def test_an_inherited_difference_is_blamed_on_the_first_op_only(monkeypatch):
    """exp is wrong; tanh, the two linears and everything after differ from eager only because of it."""
    plant(monkeypatch, aten.exp.default, lowering_for(aten.log1p.default))
    report = find_divergence(ExpMLP().eval(), (torch.randn(4, 8),))
    assert report.op == "aten.exp.default"
    assert report.inherited >= 2  # tanh and the last linear at least


def test_a_later_wrong_op_is_found_behind_correct_ones(monkeypatch):
    plant(monkeypatch, aten.tanh.default, lowering_for(aten.sigmoid.default))
    report = find_divergence(ExpMLP().eval(), (torch.randn(4, 8),))
    assert (report.op, report.source) == ("aten.tanh.default", line_of("planted: tanh"))


def test_softmax_lowered_as_log_softmax_in_an_attention_block(monkeypatch):
    plant(monkeypatch, aten.softmax.int, lowering_for(aten.log_softmax.int))
    report = find_divergence(Attention().eval(), (torch.randn(2, 5, 16),))
    assert (report.op, report.source) == ("aten.softmax.int", line_of("planted: softmax"))
    assert report.output == ("float32", [2, 2, 5, 5])


def test_a_wrong_relu_in_a_conv_net(monkeypatch):
    plant(monkeypatch, aten.relu.default, lowering_for(aten.abs.default))
    report = find_divergence(ConvNet().eval(), (torch.randn(2, 3, 12, 12),))
    assert (report.op, report.source) == ("aten.relu.default", line_of("planted: relu"))


def test_dynamic_dims(monkeypatch):
    batch = torch.export.Dim("batch", min=2, max=32)
    program = torch.export.export(ExpMLP().eval(), (torch.randn(4, 8),), dynamic_shapes=({0: batch},))
    assert find_divergence(program, (torch.randn(7, 8),)) is None
    plant(monkeypatch, aten.tanh.default, lowering_for(aten.sigmoid.default))
    report = find_divergence(program, (torch.randn(7, 8),))
    assert (report.op, report.output) == ("aten.tanh.default", ("float32", [7, 16]))


def test_quantized_program_in_integer_steps(monkeypatch):
    model = pt2e_quantize(zoo.MLP().eval(), (torch.randn(4, 16),))
    x = torch.randn(4, 16)
    assert find_divergence(model, (x,)) is None  # quantize ops may differ by one step; none differs by more
    plant(monkeypatch, aten.layer_norm.default, doubled(aten.layer_norm.default))
    report = find_divergence(model, (x,))
    assert report.op == "aten.layer_norm.default" and report.source is not None


def test_tolerances_can_be_given(monkeypatch):
    """tanh off by 0.1%: beyond float32's default (1e-4 of the output's scale), within a tolerance of 1%."""
    rule = lowering_for(aten.tanh.default)

    def slightly_off(ctx, x):
        value = rule(ctx, x)
        return stablehlo.add(value, stablehlo.multiply(value, full_like(ctx, ctx.out_shape, 1e-3, torch.float32)))

    plant(monkeypatch, aten.tanh.default, slightly_off)
    model, x = ExpMLP().eval(), torch.randn(4, 8)
    report = find_divergence(model, (x,))
    assert report.op == "aten.tanh.default" and 5e-4 < report.max_rel_err < 2e-3
    assert find_divergence(model, (x,), rtol=1e-2) is None


# make test's fixed sample (dense, attention, int8, control flow); --full-sweep takes the whole zoo
CLEAN_SAMPLE = ["mlp", "gpt2_2layer", "mlp_int8", "cond_heads"]


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ == "test_clean_registry_finds_nothing_on_golden_models":
        sampled(metafunc, "name", zoo.ZOO, CLEAN_SAMPLE)


def test_clean_registry_finds_nothing_on_golden_models(name):
    built = zoo.ZOO[name].build()
    assert find_divergence(built.model, built.args, built.kwargs) is None


def test_the_artifact_still_agrees_where_the_bisect_finds_nothing():
    """The bisect's module is the artifact's plus extra results: the same outputs come first."""
    model, x = ExpMLP().eval(), torch.randn(4, 8)
    torch.testing.assert_close(export_to_stablehlo(model, (x,))(x), model(x))


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return torch.cond(h.sum() > 0, lambda t: torch.tanh(t), lambda t: torch.sigmoid(t), (h,))  # planted: cond


def test_a_wrong_op_inside_a_branch_is_blamed_on_its_cond(monkeypatch):
    """Nested graphs are compared where they return: the cond that holds the wrong tanh is named."""
    model, x = Branchy().eval(), torch.randn(4, 8)
    branch = "true" if model.fc(x).sum() > 0 else "false"
    plant(monkeypatch, aten.tanh.default if branch == "true" else aten.sigmoid.default,
          lowering_for(aten.exp.default))
    report = find_divergence(model, (x,))
    assert (report.op, report.source) == ("cond", line_of("planted: cond"))
