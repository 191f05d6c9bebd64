"""The pipeline's re-trace (``decomposition.retraced``, which patches only the composite ops that can matter) gives
the graphs torch's ``run_decompositions`` gives: the same ops, in the same order, for programs that decompose ops of
every kind (composite ones, ones with a Python decomposition, ones whose decomposition calls ops we lower, ops kept
because we lower them, in-place writes to a user input). Guards the private torch functions it calls."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_stablehlo.exporter.conversion import decomposition
from torch_stablehlo.exporter.conversion.pipeline import prepared_program
from tests.support import FunctionModule, assert_matches_eager


def _attention_with_cdist(q, k):
    scores = F.scaled_dot_product_attention(q, k, k)  # kept: we lower it
    return scores + torch.cdist(q, k).mean(-1, keepdim=True)  # cdist decomposed


def _norms_and_pads(x):
    y = F.group_norm(x, 2) + F.pad(x, (1, 1, 1, 1), mode="reflect")[..., 1:-1, 1:-1]
    return F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False), torch.pdist(x[0, 0])


def _batch_norm_on_user_stats(x, mean, var):  # writes its user inputs: re-traced with an empty table
    return torch.ops.aten.native_batch_norm(x, None, None, mean, var, True, 0.5, 1e-5)[0]


def _embedding_bag_and_logdet(weight, idx, square):
    bags = F.embedding_bag(idx, weight, torch.tensor([0, 2]), mode="max")
    return bags, torch.logdet(square @ square.mT + torch.eye(3))


PROGRAMS = {
    "attention_with_cdist": (_attention_with_cdist, lambda: (torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8))),
    "norms_and_pads": (_norms_and_pads, lambda: (torch.randn(1, 4, 5, 6),)),
    "batch_norm_on_user_stats": (_batch_norm_on_user_stats, lambda: (torch.randn(4, 3, 5), torch.zeros(3),
                                                                     torch.ones(3))),
    "embedding_bag_and_logdet": (_embedding_bag_and_logdet, lambda: (torch.randn(10, 4), torch.tensor([1, 2, 4, 5]),
                                                                     torch.randn(3, 3))),
}


def _ops(program) -> list[str]:
    return [str(node.target) for module in program.graph_module.modules() if isinstance(module, torch.fx.GraphModule)
            for node in module.graph.nodes if node.op == "call_function"]


@pytest.mark.parametrize("name", PROGRAMS)
def test_retrace_gives_run_decompositions_graph(name, monkeypatch):
    fn, make_args = PROGRAMS[name]
    torch.manual_seed(0)
    args = make_args()
    ours, _ = prepared_program(FunctionModule(fn), args)
    calls = []
    monkeypatch.setattr(decomposition, "retraced", lambda program, table: calls.append(table) or
                        program.run_decompositions(table))
    torch_s, _ = prepared_program(FunctionModule(fn), args)
    assert calls, "the program needs no re-trace: it checks nothing"
    assert _ops(ours) == _ops(torch_s)
    monkeypatch.undo()
    assert_matches_eager(fn, *[a.clone() for a in args], atol=1e-5, rtol=1e-5)  # (pdist, logdet: float32 sums)
