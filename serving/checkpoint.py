"""What ``torch-stablehlo serve PATH`` serves: an engine bundle, or a transformers checkpoint folder exported
on first use into a cached engine bundle and reused after.

The cache entry is named after the checkpoint's content (config, generation config, weights: their bytes,
not their dates), the export settings (slots, cache length) and the versions of what exports (this package,
torch, jaxlib), so a changed checkpoint or setting exports anew and an unchanged one never does. Entries live
in ``$TORCH_STABLEHLO_ENGINE_DIR`` or ``~/.cache/torch-stablehlo/engines``; ``art.save`` writes each one
atomically, so two servers starting at once cannot leave a half-written bundle.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM

from torch_stablehlo import exporter
from torch_stablehlo.exporter.formats.engine_artifact import ENGINE_FORMAT_VERSION, is_engine_bundle
from torch_stablehlo.exporter.formats.versions import producer_versions
from torch_stablehlo.runtime import settings

DEFAULT_CACHE_LEN = 2048
MODEL_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json")
"""The checkpoint's files that make the engine (tokenizer files do not)."""
_CHUNK = 1 << 22


@dataclass(frozen=True)
class EngineSettings:
    """``exporter.export_engine``'s settings; ``max_cache_len`` None: the model's longest (at most 2048)."""
    slots: int = 8
    max_cache_len: int | None = None


def is_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def cache_dir() -> Path:
    return settings.ENGINE_DIR.value()


def cache_key(checkpoint: Path, settings: EngineSettings) -> str:
    """A digest of the checkpoint's model files (names and bytes), the settings, the exporting versions and the
    engine bundle's format version (a bundle cached in an older format is exported again, not refused)."""
    digest = hashlib.sha256(json.dumps({"settings": asdict(settings), "engine_format": ENGINE_FORMAT_VERSION,
                                        **producer_versions()},
                                       sort_keys=True).encode())
    for file in sorted({file for pattern in MODEL_FILES for file in checkpoint.glob(pattern)}):
        digest.update(f"\0{file.name}\0".encode())
        with file.open("rb") as stream:
            while chunk := stream.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def cache_len(checkpoint: Path, settings: EngineSettings) -> int:
    if settings.max_cache_len is not None:
        return settings.max_cache_len
    longest = getattr(AutoConfig.from_pretrained(checkpoint), "max_position_embeddings", None)
    return min(DEFAULT_CACHE_LEN, longest or DEFAULT_CACHE_LEN)


def engine_bundle(checkpoint: Path, settings: EngineSettings, folder: Path | None = None) -> Path:
    """The cached engine bundle of ``checkpoint`` under ``settings``, exported now if there is none."""
    settings = EngineSettings(settings.slots, cache_len(checkpoint, settings))
    target = (folder or cache_dir()) / f"{checkpoint.resolve().name}-{cache_key(checkpoint, settings)[:20]}"
    if is_engine_bundle(target):
        print(f"engine bundle: {target} (cached)", file=sys.stderr, flush=True)
        return target
    print(f"exporting {checkpoint} into an engine bundle ({settings.slots} slots, cache of "
          f"{settings.max_cache_len} tokens) at {target}; later starts reuse it", file=sys.stderr, flush=True)
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    artifact = exporter.export_engine(model, slots=settings.slots, max_cache_len=settings.max_cache_len)
    return artifact.save(target)
