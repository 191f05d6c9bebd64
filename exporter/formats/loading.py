"""``load_artifact``: any bundle this toolkit writes, read back as its artifact (an engine's or a program's)."""
from __future__ import annotations

import os

from . import artifact
from .engine_artifact import EngineArtifact, is_engine_bundle, load_engine


def load_artifact(path: str | os.PathLike, *, platform: str = "cpu", weights=None, local_shards: bool = False,
                  trusted: bool = False) -> artifact.StableHLOArtifact | EngineArtifact:
    """An engine bundle (``export_engine(...).save``) as an ``EngineArtifact``; any other bundle as
    ``formats.artifact.load_artifact`` reads it, with ``weights``, ``local_shards`` and ``trusted`` as it takes
    them (an engine bundle holds its weights and runs on one device: it takes ``trusted`` alone)."""
    if is_engine_bundle(path):
        if weights is not None or local_shards:
            raise ValueError(f"{path} is an engine bundle: it holds its weights and runs on one device (load it "
                             "without weights= and local_shards=)")
        return load_engine(path, platform, trusted=trusted)
    return artifact.load_artifact(path, platform=platform, weights=weights, local_shards=local_shards,
                                  trusted=trusted)
