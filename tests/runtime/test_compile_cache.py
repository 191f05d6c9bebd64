"""The persistent compile cache: a second process compiles nothing; corrupt entries are rebuilt; the debug log
(TORCH_STABLEHLO_DEBUG=1) says whether a compile missed or hit the disk, and why it missed."""
import json
import os
import subprocess
import sys

import pytest

from torch_stablehlo.runtime.compile_cache import DIR_VARIABLE, CompileCache

# exports the same small model in a fresh process, runs it (line 7), prints this process's compile counters
SCRIPT = """
import json, torch
from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.runtime import pjrt
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh()).eval()
x = torch.randn(2, 6); torch.testing.assert_close(export_to_stablehlo(model, (x,))(x), model(x))
print(json.dumps(pjrt.STATS))
"""


def _run_fresh_process(cache_dir) -> tuple[dict, list[str]]:
    """The fresh process's compile counters and its debug log's compile lines."""
    env = dict(os.environ, **{DIR_VARIABLE: str(cache_dir), "TORCH_STABLEHLO_DEBUG": "1"})
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    compiles = [line for line in result.stderr.splitlines() if line.startswith("[torch-stablehlo] compile")]
    return json.loads(result.stdout.strip().splitlines()[-1]), compiles


def _entries(cache_dir):
    return [p for p in cache_dir.iterdir() if not p.name.startswith(".")]


@pytest.fixture(scope="module")
def first_entry(tmp_path_factory):
    """A fresh process with an empty cache compiles once and leaves one entry: its file, made once for the
    tests below, which each start from a copy; with the cache folder and the process's compile log."""
    cache_dir = tmp_path_factory.mktemp("compile_cache")
    stats, compiles = _run_fresh_process(cache_dir)
    assert stats == {"compiled": 1, "disk_hits": 0}
    (entry,) = _entries(cache_dir)
    return entry.name, entry.read_bytes(), cache_dir, compiles


def _cache_with(tmp_path, entry, blob: bytes):
    (tmp_path / entry).write_bytes(blob)
    return tmp_path


def test_the_log_says_why_the_first_process_missed(first_entry):
    *_, cache_dir, compiles = first_entry
    assert len(compiles) == 1 and "disk cache miss" in compiles[0] and ", written;" in compiles[0]
    assert compiles[0].endswith("from <string>:7 in <module>")  # the script's line that called the model
    stored = json.loads(next(cache_dir.glob(".*.parts.json")).read_text())
    cache = CompileCache(cache_dir)
    assert cache.explain_miss({**stored, "jaxlib version": "0.0.1"}) == \
        "the entry for this module differs in: jaxlib version"
    assert cache.explain_miss({**stored, "module": "0" * 64}).startswith("no entry for this module")


def test_second_process_compiles_nothing(tmp_path, first_entry):
    cache_dir = _cache_with(tmp_path, *first_entry[:2])
    assert len(_entries(cache_dir)) == 1
    stats, compiles = _run_fresh_process(cache_dir)
    assert stats == {"compiled": 0, "disk_hits": 1}
    assert len(compiles) == 1 and "first call; disk cache hit;" in compiles[0]


def test_a_corrupt_entry_is_rebuilt(tmp_path, first_entry):
    """A flipped byte, then (in the entry rebuilt for it) a cut-off file: each is refused and rebuilt, and the
    entry rebuilt last is a hit for the next process."""
    name, pristine, *_ = first_entry
    flipped = bytearray(pristine)
    flipped[len(flipped) // 2] ^= 0xFF
    cache_dir = _cache_with(tmp_path, name, bytes(flipped))
    assert _run_fresh_process(cache_dir)[0] == {"compiled": 1, "disk_hits": 0}
    rebuilt = (cache_dir / name).read_bytes()
    assert rebuilt != bytes(flipped)
    (cache_dir / name).write_bytes(rebuilt[:len(rebuilt) // 2])
    assert _run_fresh_process(cache_dir)[0] == {"compiled": 1, "disk_hits": 0}
    assert _run_fresh_process(cache_dir)[0] == {"compiled": 0, "disk_hits": 1}


def test_size_bound_evicts_least_recently_used(tmp_path):
    cache = CompileCache(tmp_path, max_bytes=2500)
    for index, age in enumerate((300, 100, 200)):  # entry 1 is the oldest
        path = tmp_path / f"entry{index}"
        path.write_bytes(b"x" * 1000)
        os.utime(path, (age, age))
    cache._evict()
    assert sorted(p.name for p in _entries(tmp_path)) == ["entry0", "entry2"]


class _Payload:
    """A stand-in client whose executables serialize to ``size`` bytes."""
    platform, platform_version = "cpu", "test"

    def __init__(self, size: int):
        self.size = size

    def serialize_executable(self, executable) -> bytes:
        return b"x" * self.size


def test_stores_stay_within_the_bound_without_walking_the_folder_each_time(tmp_path, monkeypatch):
    cache = CompileCache(tmp_path, max_bytes=64 * 1000)
    walks = []
    measure = cache._evict
    monkeypatch.setattr(cache, "_evict", lambda: (walks.append(1), measure()))
    for index in range(40):  # 10-byte entries: far below the bound, measured at the first write only
        cache.store({"module": str(index)}, _Payload(10), None)
    assert len(walks) == 1
    for index in range(40):  # 3,000-byte entries: the bound is reached, so the folder is measured and trimmed
        cache.store({"module": f"big{index}"}, _Payload(3000), None)
        assert sum(p.stat().st_size for p in _entries(tmp_path)) <= 64 * 1000
    assert len(_entries(tmp_path)) < 80


def test_one_cache_object_per_folder_in_a_process(monkeypatch, tmp_path):
    monkeypatch.setenv(DIR_VARIABLE, str(tmp_path))
    assert CompileCache.from_environment() is CompileCache.from_environment()


def test_off_disables_the_cache(monkeypatch):
    monkeypatch.setenv(DIR_VARIABLE, "off")
    assert CompileCache.from_environment() is None


def test_cache_key_is_stable_and_covers_the_module():
    from torch_stablehlo.runtime import pjrt
    cpu = pjrt.client("cpu")
    assert CompileCache.key("a" * 64, cpu) != CompileCache.key("b" * 64, cpu)
    assert CompileCache.key("a" * 64, cpu) == CompileCache.key("a" * 64, cpu)


def test_cache_key_covers_the_compile_options():
    from jaxlib import _jax

    from torch_stablehlo.runtime import pjrt
    cpu = pjrt.client("cpu")
    default = CompileCache.key("a" * 64, cpu, pjrt.compile_options())  # with pjrt.XLA_OPTIONS
    assert CompileCache.key("a" * 64, cpu, _jax.CompileOptions()) == CompileCache.key("a" * 64, cpu)  # None: XLA's
    assert CompileCache.key("a" * 64, cpu) != default
    tuned = _jax.CompileOptions()
    tuned.env_option_overrides = [("xla_cpu_enable_fast_math", True), ("xla_backend_optimization_level", 1)]
    assert CompileCache.key("a" * 64, cpu, tuned) != default
    reordered = _jax.CompileOptions()
    reordered.env_option_overrides = [("xla_backend_optimization_level", 1), ("xla_cpu_enable_fast_math", True)]
    assert CompileCache.key("a" * 64, cpu, reordered) == CompileCache.key("a" * 64, cpu, tuned)
