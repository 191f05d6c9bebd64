"""Higher-order ops that wrap a nested graph: grad-mode and autocast regions, lowered inline."""
import pytest
import torch
from torch import nn
from torch._higher_order_ops.hints_wrap import hints_wrapper

from torch_stablehlo.exporter import export_to_stablehlo

from tests.support import assert_matches_eager


class NoGradRegion(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            inner = self.linear(x) * 2
            other = inner.sin()
        return inner + 1, other, x * 3


class AutocastRegion(nn.Module):
    def __init__(self, enabled):
        super().__init__()
        self.enabled = enabled
        self.linear = nn.Linear(4, 6)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.enabled):
            y = self.linear(x)
            z = torch.matmul(y, y.transpose(0, 1))
        return z + 1


class NestedRegions(nn.Module):
    def forward(self, x):
        with torch.autocast("cpu", enabled=False):
            with torch.no_grad():
                y = x.cos()
            y = y * x
        return y


@pytest.mark.parametrize("module", [NoGradRegion(), NestedRegions()], ids=["no_grad", "nested"])
def test_regions_lower_inline(module):
    assert_matches_eager(module, torch.randn(3, 4))


@pytest.mark.parametrize("enabled", [False, True])
def test_autocast_region(enabled):
    torch.manual_seed(0)
    # bf16 under autocast: an intermediate that rounds the other way near a tie moves `z + 1` by one
    # bf16 step at magnitude 1 (2**-7), beyond torch's default bf16 rtol when the sum is near 0.5
    atol, rtol = (2 ** -7, 1.6e-2) if enabled else (None, None)
    assert_matches_eager(AutocastRegion(enabled), torch.randn(3, 4), atol=atol, rtol=rtol)


@pytest.mark.parametrize("module, op", [
    (NoGradRegion(), torch.ops.higher_order.wrap_with_set_grad_enabled),
    (AutocastRegion(True), torch.ops.higher_order.wrap_with_autocast),
], ids=["no_grad", "autocast"])
def test_the_region_is_in_the_exported_graph(module, op):
    program = torch.export.export(module, (torch.randn(3, 4),))
    assert op in {node.target for node in program.graph.nodes if node.op == "call_function"}


class Hinted(torch.nn.Module):
    """``hints_wrapper`` bodies returning one tensor and a pair (torch's test_hints_wrapper)."""

    def forward(self, x, y):
        low, high = hints_wrapper(lambda a, b: (a - b, a + b), (x, y), {}, hints={"inner": 1})
        return hints_wrapper(lambda a, b: a * b + 1, (x, y), {}, hints={"outer": True}) + low * high


def test_hints_wrapper_bodies_inline():
    x, y = torch.randn(3), torch.randn(3)
    ep = torch.export.export(Hinted(), (x, y))
    torch.testing.assert_close(export_to_stablehlo(ep)(x, y), ep.module()(x, y))
