"""Compile and execution analysis (TORCH_STABLEHLO_DEBUG=1): a call with shapes already compiled logs no
compile, a new shape logs one with its cause, and the summary warns about a recompile storm (a second process's
disk-cache hit, and the key part that made a miss: tests/runtime/test_compile_cache.py)."""
import io

import pytest
import torch
from torch.export import Dim

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.runtime import analysis

@pytest.fixture
def log(monkeypatch, tmp_path):
    """The analysis on, printing to a buffer, with a cache of this test's own."""
    monkeypatch.setenv("TORCH_STABLEHLO_CACHE_DIR", str(tmp_path / "cache"))
    stream = io.StringIO()
    monkeypatch.setattr(analysis, "ANALYSIS", analysis.Analysis(True, stream))
    monkeypatch.setattr("torch_stablehlo.runtime.pjrt.ANALYSIS", analysis.ANALYSIS)
    return stream


def test_same_shapes_compile_once_new_shapes_say_why(log):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.GELU()).eval()
    artifact = export_to_stablehlo(model, (torch.randn(2, 8),), dynamic_shapes=({0: Dim("batch", max=64)},))
    artifact(torch.randn(2, 8))
    first = log.getvalue().splitlines()
    module = first[0].split()[2]
    assert [line.split(":")[0] for line in first] == [f"[torch-stablehlo] compile {module} [4x8,4,2x8]",
                                                      f"[torch-stablehlo] execute {module} [4x8,4,2x8]"]
    assert "first call; disk cache miss (no entry for this module" in first[0]
    assert ", written; 3 inputs, 1 outputs, " in first[0] and f"from {__file__}:" in first[0]
    artifact(torch.randn(2, 8))
    second = log.getvalue().splitlines()[len(first):]
    assert len(second) == 1 and " execute " in second[0], "the same shapes compile nothing"
    artifact(torch.randn(5, 8))
    third = log.getvalue().splitlines()[len(first) + 1:]
    assert "[4x8,4,5x8]: new shape signature (compiled before for 4x8,4,2x8)" in third[0]


def test_recompile_storm_in_the_summary(log):
    model = torch.nn.Linear(4, 4).eval()
    artifact = export_to_stablehlo(model, (torch.randn(2, 4),), dynamic_shapes=({0: Dim("batch", max=64)},))
    for batch in range(2, 2 + analysis.STORM_SIGNATURES + 1):
        artifact(torch.randn(batch, 4))
    summary = analysis.ANALYSIS.summary()
    assert summary[0].endswith(f"compiled {analysis.STORM_SIGNATURES + 1} time(s), executed "
                               f"{analysis.STORM_SIGNATURES + 1} time(s)")
    assert "a recompile storm" in summary[1]


