"""Writing an output folder atomically: build it in a hidden sibling, then rename it into place."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


@contextlib.contextmanager
def staged_folder(path: str | os.PathLike, marker: str, kind: str):
    """Yield an empty staging folder; when the block succeeds it becomes ``path``.

    A failure (or an interrupt) removes the staging folder, so ``path`` is never
    half-written. An existing folder at ``path`` is replaced only if it holds
    ``marker`` (i.e. it is a ``kind`` folder written earlier); anything else there
    is an error, raised before anything is written.
    """
    path = Path(path)
    if path.exists() and not (path / marker).is_file():
        raise FileExistsError(f"{path} exists and is not {kind}; choose a new path or remove it")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield staging
        _make_readable(staging)
        if path.exists():
            retired = staging.with_name(staging.name + ".old")
            os.replace(path, retired)
            try:
                os.replace(staging, path)
            except BaseException:
                os.replace(retired, path)  # put the previous folder back
                raise
            shutil.rmtree(retired)
        else:
            os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _make_readable(folder: Path) -> None:
    """mkdtemp and safetensors create owner-only entries; artifacts are meant to be shared."""
    for root, dirs, files in os.walk(folder):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
