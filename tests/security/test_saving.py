"""Saving is safe: a folder is replaced only if this toolkit wrote it and it holds nothing else; the swap never
leaves the path empty (and a kill between the fallback's two renames leaves a copy load_artifact puts back);
files get the user's umask."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_stablehlo.exporter import BundleError, load_artifact
from torch_stablehlo.exporter.formats import snapshot
from torch_stablehlo.exporter.formats.bundle import load_manifest

ROOT = Path(__file__).parents[2]


def test_a_folder_with_a_manifest_and_other_files_is_not_replaced(small, saved):
    (saved / "src").mkdir()
    (saved / "src" / "important.py").write_text("mine")
    before = sorted(p.name for p in saved.iterdir())
    with pytest.raises(FileExistsError, match=r"also holds files this toolkit did not write there \(src/important.py\)"):
        small[1].save(saved)
    assert (saved / "src" / "important.py").read_text() == "mine" and sorted(p.name for p in saved.iterdir()) == before
    assert load_artifact(saved)  # the bundle itself untouched too


def test_a_manifest_this_toolkit_did_not_write_does_not_make_a_folder_replaceable(small, tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"name": "my web app"}))
    with pytest.raises(FileExistsError, match="is not an artifact folder nor an empty folder"):
        small[1].save(folder)
    assert json.loads((folder / "manifest.json").read_text()) == {"name": "my web app"}


def test_a_link_at_the_path_is_not_replaced(small, saved, tmp_path):
    os.symlink(saved, tmp_path / "link")
    with pytest.raises(FileExistsError, match="it is a link"):
        small[1].save(tmp_path / "link")
    assert os.path.islink(tmp_path / "link") and load_artifact(saved)


def test_a_bundle_of_ours_is_replaced_and_leaves_no_sibling(small, saved):
    small[1].save(saved, include_text=False)
    assert not (saved / "module.mlir").exists() and sorted(p.name for p in saved.parent.iterdir()) == ["bundle"]


def test_save_tf_saved_model_replaces_only_its_own_saved_models(small, tmp_path):
    pytest.importorskip("tensorflow")
    artifact = small[1]
    path = artifact.save_tf_saved_model(tmp_path / "served")
    assert artifact.save_tf_saved_model(path) == path  # its own: replaced
    (path / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"also holds files this toolkit did not write there \(notes.txt\)"):
        artifact.save_tf_saved_model(path)
    assert (path / "notes.txt").read_text() == "keep me"
    other = tmp_path / "theirs"
    other.mkdir()
    (other / "saved_model.pb").write_bytes(b"someone else's")
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not a SavedModel folder nor an empty folder"):
        artifact.save_tf_saved_model(other)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt", "saved_model.pb"]


KILLED_SAVE = """
import os, signal, sys
from torch_stablehlo.exporter.formats import folders
from tests.security.bundles import small_artifact
where, path = sys.argv[1], sys.argv[2]
if where == "between renames":  # the fallback for systems without an atomic exchange
    folders._exchange = lambda first, second: False
    real_replace, calls = os.replace, []
    def replace(source, target):
        calls.append(source)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(source, target)
    folders.os.replace = replace
else:  # "after the exchange", before the retired copy is removed
    folders.shutil.rmtree = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
small_artifact()[1].save(path, include_text=False)
"""


@pytest.mark.parametrize("where", ["between renames", "after the exchange"])
def test_a_save_killed_during_the_swap_leaves_a_loadable_bundle(small, saved, where):
    done = subprocess.run([sys.executable, "-c", KILLED_SAVE, where, str(saved)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == -9, done.stderr[-2000:]
    if where == "between renames":
        assert not saved.exists()
        with pytest.warns(UserWarning, match="previous copy was put back"):
            loaded = load_artifact(saved)
        assert (saved / "module.mlir").exists(), "the previous bundle (saved with its text) is back"
    else:
        loaded = load_artifact(saved)
        assert not (saved / "module.mlir").exists(), "the new bundle (saved without text) is in place"
    x = torch.randn(3, 8)
    torch.testing.assert_close(loaded(x), small[0](x), rtol=1e-5, atol=1e-5)  # f32 matmul of 8 terms
    small[1].save(saved)  # the next save cleans up whatever the killed one left
    assert sorted(p.name for p in saved.parent.iterdir()) == ["bundle"] and load_manifest(saved)


@pytest.mark.parametrize("umask, file_mode, folder_mode", [(0o077, 0o600, 0o700), (0o022, 0o644, 0o755)])
def test_saved_files_get_the_users_umask(small, tmp_path, umask, file_mode, folder_mode):
    previous = os.umask(umask)
    try:
        path = small[1].save(tmp_path / "bundle")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == folder_mode
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.iterdir()} == \
        {name: file_mode for name in ("manifest.json", "module.mlir", "module.mlirbc", "weights.safetensors")}


def test_a_save_that_swaps_the_folder_during_a_load_does_not_make_it_look_corrupt(small, saved, monkeypatch):
    """The loader read the old manifest, then a save swapped the new folder in (and removed the old one): the
    old folder's files are gone. The load notices the folder changed and reads the new one."""
    real, swapped = snapshot.FolderSnapshot.open, []

    def save_midway(folder, name):
        if name != "manifest.json" and not swapped:
            swapped.append(small[1].save(saved, target_version="current", include_text=False))
        return real(folder, name)

    monkeypatch.setattr(snapshot.FolderSnapshot, "open", save_midway)
    loaded = load_artifact(saved)
    assert swapped and not (saved / "module.mlir").exists()
    x = torch.randn(3, 8)
    torch.testing.assert_close(loaded(x), small[0](x), rtol=1e-5, atol=1e-5)  # f32 matmul of 8 terms


def test_a_corrupt_bundle_is_still_an_error_when_nothing_swapped_it(saved):
    (saved / "module.mlir").write_text("changed")
    with pytest.raises(BundleError, match="module.mlir is truncated"):
        load_artifact(saved)
