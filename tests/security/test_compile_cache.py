"""A compile cache that cannot be poisoned by a swap: entries are bound to their key, a folder others can write
to is refused (unless shared on purpose), failed writes leave no temporary file and eviction counts the ones
killed writers left; compiled executables in memory are bounded."""
import errno
import os
import tempfile
import warnings

import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.runtime import compile_cache, pjrt
from torch_stablehlo.runtime.compile_cache import DIR_VARIABLE, SHARED_VARIABLE, CompileCache

from .bundles import small_artifact
from ..support import FunctionModule


def _compiled(fn):
    artifact = export_to_stablehlo(FunctionModule(fn), (torch.randn(5),))
    text = artifact.stablehlo_text
    executable = pjrt.Executable(text)
    parts = CompileCache.key_parts(pjrt.fingerprint(text), executable.client, pjrt.compile_options())
    return parts, executable


def test_an_entry_copied_over_another_keys_name_is_not_a_hit(tmp_path):
    cache = CompileCache(tmp_path)
    (sin_parts, sin), (cos_parts, cos) = _compiled(torch.sin), _compiled(torch.cos)
    cache.store(sin_parts, sin.client, sin.loaded)
    cache.store(cos_parts, cos.client, cos.loaded)
    sin_key, cos_key = compile_cache.digest(sin_parts), compile_cache.digest(cos_parts)
    assert cache.load(cos_key, cos.client, cos.devices) is not None
    (tmp_path / cos_key).write_bytes((tmp_path / sin_key).read_bytes())  # the sin entry under cos's name
    assert cache.load(cos_key, cos.client, cos.devices) is None, "a mismatch is a miss (then a compile)"
    assert not (tmp_path / cos_key).exists() and cache.load(sin_key, sin.client, sin.devices) is not None


@pytest.fixture
def cache_env(monkeypatch):
    """Set the cache folder (and SHARED) for one test; the once-per-folder verdict is forgotten after it."""
    compile_cache._usable.cache_clear()
    monkeypatch.delenv(SHARED_VARIABLE, raising=False)
    yield lambda folder: monkeypatch.setenv(DIR_VARIABLE, str(folder))
    compile_cache._usable.cache_clear()


def test_a_folder_others_can_write_to_is_refused_with_one_warning(tmp_path, cache_env, monkeypatch):
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, 0o777)
    cache_env(folder)
    with pytest.warns(UserWarning, match="group or others can write to it.*TORCH_STABLEHLO_CACHE_SHARED=1") as caught:
        assert CompileCache.from_environment() is None
        assert CompileCache.from_environment() is None
    assert len(caught) == 1
    x = torch.randn(4, 8)  # compilation goes on without it
    model = torch.nn.Linear(8, 3).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(export_to_stablehlo(model, (x,))(x), model(x), rtol=1e-5, atol=1e-5)  # f32, 8 terms
    assert list(folder.iterdir()) == []
    monkeypatch.setenv(SHARED_VARIABLE, "1")
    assert CompileCache.from_environment().directory == folder, "shared on purpose"


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_owned_by_another_user_is_refused(tmp_path, cache_env):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    os.chown(folder, 65534, 65534)
    cache_env(folder)
    with pytest.warns(UserWarning, match="owned by another user"):
        assert CompileCache.from_environment() is None


def test_a_missing_folder_is_made_for_the_user_alone(tmp_path, cache_env):
    cache_env(tmp_path / "new" / "executables")
    assert CompileCache.from_environment().directory == tmp_path / "new" / "executables"
    assert (tmp_path / "new" / "executables").stat().st_mode & 0o077 == 0


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    cache = CompileCache(tmp_path)
    parts, executable = _compiled(torch.tanh)

    class FullDisk:
        def __init__(self, handle):
            self.handle, self.name = handle, handle.name

        def __enter__(self):
            return self

        def __exit__(self, *error):
            self.handle.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    real = tempfile.NamedTemporaryFile
    monkeypatch.setattr(compile_cache.tempfile, "NamedTemporaryFile", lambda **kw: FullDisk(real(**kw)))
    with pytest.raises(OSError, match="No space left"):
        cache.store(parts, executable.client, executable.loaded)
    assert list(tmp_path.iterdir()) == []


def test_eviction_counts_temporary_files_killed_writers_left(tmp_path):
    cache = CompileCache(tmp_path, max_bytes=10_000)
    left = tmp_path / ".tmp-killed"
    left.write_bytes(bytes(50_000))
    os.utime(left, (1, 1))  # long ago
    parts, executable = _compiled(torch.exp)
    cache.store(parts, executable.client, executable.loaded)
    assert not left.exists()


def test_executables_in_memory_are_bounded(monkeypatch):
    model, artifact = small_artifact()
    monkeypatch.setattr(pjrt._COMPILED, "maxsize", 4)
    artifact._executables.maxsize = 3
    for batch in range(2, 10):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(artifact(x), model(x), rtol=1e-5, atol=1e-5)  # f32 matmul of 8 terms
        assert len(artifact._executables) <= 3 and len(pjrt._COMPILED) <= 4
    assert list(artifact._executables) == [((b, 8),) for b in (7, 8, 9)]  # by the inputs' shapes
