"""No crash from bytes: a bundle's module is read first in a child process unless the caller vouches for it
(``trusted=True``) or this process wrote or checked the same bytes; crafted bytes that crash jaxlib's reader
are a BundleError, in the caller's process that survives. Crash-prone cases run in a subprocess of their own."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_stablehlo.exporter import BundleError, load_artifact
from torch_stablehlo.exporter.formats import bundle
from torch_stablehlo.runtime import settings
from torch_stablehlo.stablehlo_ir import bytecode_check

from .bundles import rewrite_file, with_string_count

ROOT = Path(__file__).parents[2]

CRAFTED = """
import sys
import torch
from torch_stablehlo import BundleError, export_to_stablehlo, load_artifact
from torch_stablehlo.stablehlo_ir.bytecode_check import read_in_child
from tests.security.bundles import rewrite_file
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
path = export_to_stablehlo(model.eval(), (torch.randn(2, 8),)).save(sys.argv[1])
data = (path / "module.mlirbc").read_bytes()
start = next(s for s in range(137, len(data)) if "crashed" in (read_in_child(data[:s] + data[s + 9:], 2 ** 30, 60) or ""))
rewrite_file(path, "module.mlirbc", data[:start] + data[start + 9:])  # 9 bytes deleted; size and sha256 updated
try:
    load_artifact(path)
except BundleError as error:
    print(error)
"""


def test_bytecode_that_crashes_the_reader_is_a_bundle_error_and_the_caller_survives(tmp_path):
    done = subprocess.run([sys.executable, "-c", CRAFTED, str(tmp_path / "crafted")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "module.mlirbc is not a readable StableHLO portable artifact: it crashed the StableHLO reader (SIGSEGV" \
        in done.stdout
    inspected = subprocess.run([sys.executable, "-m", "torch_stablehlo", "inspect", str(tmp_path / "crafted")],
                               cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert inspected.returncode not in (0, -11) and "crashed the StableHLO reader" in inspected.stderr, \
        inspected.stderr[-2000:]


def _no_child(monkeypatch):
    def refuse(*args):
        raise AssertionError("the module was read in a child process")
    monkeypatch.setattr(bundle, "read_in_child", refuse)


def test_a_bundle_this_process_saved_loads_without_a_child(small, tmp_path, monkeypatch):
    path = small[1].save(tmp_path / "mine")
    _no_child(monkeypatch)
    x = torch.randn(3, 8)
    torch.testing.assert_close(load_artifact(path)(x), small[0](x), rtol=1e-5, atol=1e-5)  # f32 matmul of 8 terms


def test_bytes_from_elsewhere_are_read_in_a_child_once_unless_trusted(small, tmp_path, monkeypatch):
    path = small[1].save(tmp_path / "theirs", target_version="current")
    data = (path / "module.mlirbc").read_bytes()
    foreign = data + b""  # the same module, as if from elsewhere: forget this process wrote it
    monkeypatch.setattr(bundle, "_READABLE", set())
    calls = []
    monkeypatch.setattr(bundle, "read_in_child", lambda d, *limits: calls.append(d) or None)
    load_artifact(path, trusted=True)
    assert calls == []
    load_artifact(path)
    load_artifact(path)
    assert calls == [foreign], "read in a child once, then known by its sha256"


def test_unreadable_bytes_are_a_bundle_error_with_the_readers_message(small, tmp_path):
    path = small[1].save(tmp_path / "garbage")
    rewrite_file(path, "module.mlirbc", b"ML\xefR" + bytes(range(200)))
    with pytest.raises(BundleError, match="module.mlirbc is not a readable StableHLO portable artifact: .+"):
        load_artifact(path)


PEAK = """
import resource, subprocess, sys
done = subprocess.run([sys.executable, "-I", "-m", sys.argv[1], sys.argv[2]], stdin=sys.stdin, capture_output=True)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""
"""Runs the checking child and prints its exit status and peak memory (kB): from a small Python process of its own,
as Linux counts in a child's peak what the process it was forked from held."""


def test_bytecode_that_claims_a_huge_table_is_refused_within_the_childs_memory_limit(small, tmp_path):
    """A module whose string table claims 2**27 entries took the child 2.2 GB before it was refused; under its
    address-space limit the child fails at once, and its peak stays far below that (a plain module's child peaks
    at about 140 MB: Python, jaxlib and the MLIR context)."""
    path = small[1].save(tmp_path / "huge")
    crafted = with_string_count((path / "module.mlirbc").read_bytes(), 2 ** 27)
    done = subprocess.run([sys.executable, "-I", "-c", PEAK, bytecode_check.__name__, str(256 * 1024 ** 2)],
                          input=crafted, capture_output=True, text=False, timeout=300)
    status, peak_kb = map(int, done.stdout.split())
    assert status != 0 and peak_kb / 1024 < 600, f"the checking child exited {status}, peaked at {peak_kb / 1024} MB"
    rewrite_file(path, "module.mlirbc", crafted)  # through load_artifact, with the default limit: a BundleError
    with pytest.raises(BundleError, match=r"module\.mlirbc is not a readable StableHLO portable artifact: reading it "
                                          r"needs more than the \d+ bytes of memory the check allows"):
        load_artifact(path)


def test_a_check_that_takes_too_long_is_a_bundle_error(small, tmp_path, monkeypatch):
    path = small[1].save(tmp_path / "slow")
    monkeypatch.setattr(bundle, "_READABLE", set())
    monkeypatch.setenv(settings.CHECK_SECONDS.variable, "0.01")
    with pytest.raises(BundleError, match=r"reading it took over 0\.01 s \(in a separate process\)"):
        load_artifact(path)
