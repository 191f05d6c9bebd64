"""``load_artifact``: any bundle this toolkit writes, read back as its artifact (an engine's or a program's)."""
from __future__ import annotations

import os

from . import artifact
from .engine_artifact import EngineArtifact, is_engine_bundle, load_engine


def load_artifact(path: str | os.PathLike, *, platform: str = "cpu", **options) -> artifact.StableHLOArtifact | EngineArtifact:
    """An engine bundle (``export_engine(...).save``) as an ``EngineArtifact``; any other bundle as
    ``formats.artifact.load_artifact`` reads it, with its ``options`` (weights, local_shards, trusted)."""
    if is_engine_bundle(path):
        if options:
            raise ValueError(f"an engine bundle takes no {', '.join(sorted(options))}: its weights are in it")
        return load_engine(path, platform)
    return artifact.load_artifact(path, platform=platform, **options)
