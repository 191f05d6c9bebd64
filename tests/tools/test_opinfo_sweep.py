"""The committed coverage report (docs/coverage.json) is true: each OpInfo entry swept now gives the
statuses the report records, the lowering column matches the registry, and the headline figures hold.

A sample the report records as failed that passes now only means the report is out of date (regenerate
it with ``make coverage``); every other difference fails.

Which passes are swept: re-sweeping all ~700 op_db entries (static and dynamic passes) takes most of an hour
of CPU, so ``make test`` checks a fixed sample of passes, ``tools.coverage.sweep_sample(report)``, computed from
the committed report (and, for families, the module registering each lowering): no randomness, the same sample on
every run until the report changes. It holds

a greedy cover, cheapest first per new target, of: every core ATen overload in every dtype in which a
  counted static sample exercised it (the report's per-op columns; static passes reach these), every core
  overload the dynamic pass exercised (dynamic passes), and every op family (``aten_lowerings`` module) whose
  lowerings the sweep reaches (either). The report stores the overloads each entry's counted samples
  exercised per pass (``aten_ops``, after our decompositions), which is what the cover is computed from. A
  pass's cost is one export and compile plus its samples, plus the extra compiles a sample that does not pass
  causes (the sweep splits its batch): the recorded failures are left to the full sweep unless the cover needs
  them (a failure that turns into a pass only means the report is out of date; what ``make test`` guards is
  the passing lowerings).

Each sampled pass is swept exactly as in the full sweep (every sample; the dynamic pass in the dtype the report
chose for it) and compared with the report by the same rule. Why that is enough: a lowering is a function of the
overload and the dtype, so a regression in a core op's lowering in any dtype the sweep exercises shows in at
least one sampled pass; every lowering module is entered.
What only the full sweep sees: non-core overloads with a rule of their own (special functions, linalg
variants, ...) that only left-out entries reach (their unit tests under tests/aten_lowerings still run),
and left-out passes' other sample shapes. ``test_sample_covers_the_report`` checks the claims above against the
report. The full sweep stays available: ``pytest --full-sweep`` (or ``TORCH_STABLEHLO_FULL_SWEEP=1``) checks
both passes of every entry, ``make coverage`` regenerates the report."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree

from torch_stablehlo.aten_lowerings.registry import lowering_for, op_name
from torch_stablehlo.tools.coverage import (PASSES, SIZE_QUERIES, core_aten_ops, dynamic_dtypes, letters,
                                            sample_targets, sweep_pass, sweep_sample)
from torch_stablehlo.tools.opinfo_sweep import COUNTED, STATUS, opinfos, sample_inputs
from torch_stablehlo.quantize import quantized_lowerings

from ..conftest import sampled

REPORT = json.loads((Path(__file__).parents[2] / "docs" / "coverage.json").read_text())
PASSED, FAILED = STATUS["passed"], STATUS["failed"]
UNCOUNTED = {STATUS[s] for s in STATUS if s not in COUNTED}  # e.g. lstsq: eager is sometimes nondeterministic


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ == "test_sweep_matches_report":
        sampled(metafunc, "name, which", lambda: [(name, p) for name in sorted(opinfos()) for p in PASSES],
                sweep_sample(REPORT), ids=lambda value: value)


def test_report_rows_match_the_registry():
    rows = {row["op"]: row for row in REPORT["ops"]}
    assert sorted(rows) == sorted(op_name(op) for op in core_aten_ops())
    quantized = quantized_lowerings()
    for op in core_aten_ops():
        row = rows[op_name(op)]
        assert row["lowering"] == (lowering_for(op) is not None), f"{row['op']}: report disagrees with the registry"
        assert row["quantized"] == (row["op"] in quantized), f"{row['op']}: quantized column disagrees"


def test_headline_figures():
    summary = REPORT["summary"]
    assert summary["lowered"] == summary["core_ops"], "every core ATen overload has a lowering"
    # The target is 98% of the eligible samples (issue 3); the floors sit just under the committed figures
    # (98.9% static, 97.8% dynamic) so that a regenerated report cannot quietly lose ground.
    assert summary["opinfo_static"]["pass_rate"] >= 0.988
    assert summary["opinfo_dynamic"]["pass_rate"] >= 0.977
    assert sorted(REPORT["opinfo"]) == sorted(opinfos()), "the report sweeps every op_db entry"


def test_sample_covers_the_report():
    """The sample reaches every core op x dtype of the report's per-op columns, every core op of its dynamic
    column (size queries aside: unit tests check them) and every op family."""
    sample = sweep_sample(REPORT)
    assert sample == sorted(set(sample)) and {name for name, _ in sample} <= set(REPORT["opinfo"])
    assert {p for _, p in sample} == set(PASSES)
    reaches = sample_targets(REPORT)
    reached = set().union(*(reaches[name] for name in sample))
    assert reached == set().union(*reaches.values())
    # the per-entry ``aten_ops`` the cover is computed from agree with the per-op columns of the report
    columns = {("static", row["op"], dtype) for row in REPORT["ops"] if not row["op"].startswith(SIZE_QUERIES)
               for dtype, counts in row["opinfo"].items() if sum(counts)}
    columns |= {("dynamic", row["op"]) for row in REPORT["ops"]
                if sum(row["dynamic"]) and not row["op"].startswith(SIZE_QUERIES)}
    assert columns == {target for target in reached if target[0] != "family"}


@pytest.mark.parametrize("name, dtype", [("addmm", torch.float32), ("nn.functional.dropout", torch.float32),
                                         ("randint_like", torch.int64), ("index_put", torch.bfloat16)])
def test_samples_are_torchs_own(name, dtype):
    """``sample_inputs`` gives what ``OpInfo.sample_inputs`` gives (same values, the same seeding before each
    sample), for entries whose generators draw random tensors, return a list or yield lazily."""
    info = opinfos()[name]
    for grad in (False, True):
        torch.manual_seed(7)
        theirs = list(info.sample_inputs("cpu", dtype, requires_grad=grad and dtype.is_floating_point))
        torch.manual_seed(7)
        ours = list(sample_inputs(info, dtype, requires_grad=grad and dtype.is_floating_point))
        assert len(ours) == len(theirs) > 0
        for mine, torchs in zip(ours, theirs):
            flat_mine, flat_torchs = (pytree.tree_leaves([s.input, s.args, s.kwargs]) for s in (mine, torchs))
            assert len(flat_mine) == len(flat_torchs)
            for a, b in zip(flat_mine, flat_torchs):
                if isinstance(a, torch.Tensor):
                    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
                    assert a.requires_grad == b.requires_grad
                else:
                    assert a == b or (a != a and b != b)


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch):
    """Sweep modules are compiled once and thrown away: keep them out of the persistent cache."""
    monkeypatch.setenv("TORCH_STABLEHLO_CACHE_DIR", "off")


def test_sweep_matches_report(name, which):
    recorded = REPORT["opinfo"][name][which]
    # the dynamic pass runs in the dtype the report's static pass chose for it (the first with a passing sample)
    results = sweep_pass(name, which, list(recorded) if which == "dynamic" else None)
    now = letters(results)
    assert sorted(now) == sorted(recorded), f"{name} ({which}): dtypes swept differ from the report"
    if which == "static":  # and the static pass still chooses the dtype the report's dynamic pass ran in
        assert dynamic_dtypes(results) == list(REPORT["opinfo"][name]["dynamic"]), f"{name}: dynamic pass's dtype"
    for dtype in now:
        mismatched = [(i, was, got) for i, (was, got) in enumerate(zip(recorded[dtype], now[dtype]))
                      if was != got and not (was == FAILED and got == PASSED) and not {was, got} <= UNCOUNTED]
        reasons = [results[dtype][i].reason for i, _, _ in mismatched]
        assert len(now[dtype]) == len(recorded[dtype]) and not mismatched, (
            f"{name} ({which}, {dtype}): report says {recorded[dtype]}, sweep gives {now[dtype]}: {reasons}")
