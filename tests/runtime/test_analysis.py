"""Compile and execution analysis (TORCH_STABLEHLO_DEBUG=1): a call with shapes already compiled logs no
compile, a new shape logs one with its cause, a second process logs a disk-cache hit (or the key part that
differed), and the summary warns about a recompile storm."""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.export import Dim

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.runtime import analysis
from torch_stablehlo.runtime.compile_cache import CompileCache

SCRIPT = """
import torch
from torch_stablehlo.exporter import export_to_stablehlo
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh()).eval()
export_to_stablehlo(model, (torch.randn(3, 8),))(torch.randn(3, 8))
"""


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


def _run(tmp_path, **environment) -> str:
    env = {**os.environ, "TORCH_STABLEHLO_DEBUG": "1", "TORCH_STABLEHLO_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(Path(__file__).parents[2]), **environment}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    return [line for line in result.stderr.splitlines() if line.startswith("[torch-stablehlo] compile")]


def test_a_second_process_hits_the_disk_cache(tmp_path):
    first = _run(tmp_path)
    assert len(first) == 1 and "disk cache miss" in first[0] and ", written;" in first[0]
    assert first[0].endswith("from <string>:6 in <module>")  # the script's line that called the model
    second = _run(tmp_path)
    assert len(second) == 1 and "first call; disk cache hit;" in second[0]
    stored = json.loads(next((tmp_path / "cache").glob(".*.parts.json")).read_text())
    cache = CompileCache(tmp_path / "cache")
    assert cache.explain_miss({**stored, "jaxlib version": "0.0.1"}) == \
        "the entry for this module differs in: jaxlib version"
    assert cache.explain_miss({**stored, "module": "0" * 64}).startswith("no entry for this module")
