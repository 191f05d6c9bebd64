"""The committed coverage report (docs/coverage.json) is true: each OpInfo entry swept now gives the
statuses the report records, the lowering column matches the registry, and the headline figures hold.

A sample the report records as failed that passes now only means the report is out of date (regenerate
it with ``torch-stablehlo coverage``); every other difference fails."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from aten_lowerings.registry import lowering_for, op_name
from tools.coverage import core_aten_ops, letters, sweep_entry
from tools.opinfo_sweep import COUNTED, STATUS, opinfos
from quantize import quantized_lowerings

REPORT = json.loads((Path(__file__).parents[2] / "docs" / "coverage.json").read_text())
PASSED, FAILED = STATUS["passed"], STATUS["failed"]
UNCOUNTED = {STATUS[s] for s in STATUS if s not in COUNTED}  # e.g. lstsq: eager is sometimes nondeterministic


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


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch):
    """Sweep modules are compiled once and thrown away: keep them out of the persistent cache."""
    monkeypatch.setenv("TORCH_STABLEHLO_CACHE_DIR", "off")


@pytest.mark.parametrize("name", sorted(opinfos()))
def test_sweep_matches_report(name):
    recorded = REPORT["opinfo"][name]
    swept = sweep_entry(name)
    for which, results in swept.items():
        now, then = letters(results), recorded[which]
        assert sorted(now) == sorted(then), f"{name} ({which}): dtypes swept differ from the report"
        for dtype in now:
            mismatched = [(i, was, got) for i, (was, got) in enumerate(zip(then[dtype], now[dtype]))
                          if was != got and not (was == FAILED and got == PASSED) and not {was, got} <= UNCOUNTED]
            reasons = [results[dtype][i].reason for i, _, _ in mismatched]
            assert len(now[dtype]) == len(then[dtype]) and not mismatched, (
                f"{name} ({which}, {dtype}): report says {then[dtype]}, sweep gives {now[dtype]}: {reasons}")
