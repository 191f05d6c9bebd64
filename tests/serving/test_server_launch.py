"""What ``torch-stablehlo serve PATH`` serves, decided before any engine starts (serving/launch.py,
serving/checkpoint.py): the engine cache is keyed on the checkpoint's content and the export settings, a cached
bundle is reused without exporting, and a wrong PATH or option is refused with a message saying what is right."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.formats.engine_artifact import ENGINE_MANIFEST
from torch_stablehlo.serving import launch
from torch_stablehlo.serving.checkpoint import EngineSettings, cache_key
from torch_stablehlo.tools.cli import main

from .server_support import save_checkpoint, tiny_llama, train_tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tokenizer = train_tokenizer()
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-llama",
                           tiny_llama(len(tokenizer), tokenizer.eos_token_id), tokenizer)


@pytest.fixture(scope="module")
def some_bundle(tmp_path_factory):
    """A folder ``prepare`` takes for an engine bundle (it holds an ``engine.json``; ``prepare`` reads no file of it)."""
    folder = tmp_path_factory.mktemp("bundle") / "engine"
    folder.mkdir()
    (folder / ENGINE_MANIFEST).write_text("{}")
    return folder


def test_a_program_bundle_is_not_served_as_an_engine(tmp_path):
    path = export_to_stablehlo(torch.export.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),))).save(tmp_path / "b")
    with pytest.raises(ValueError, match=r"neither an engine bundle \(engine\.json\) nor a transformers checkpoint"):
        launch.prepare(path, tokenizer=path, model_name=None, slots=None, max_cache_len=None, cache_folder=None)


def test_cache_key_follows_content_and_settings(checkpoint, tmp_path):
    settings = EngineSettings(slots=8, max_cache_len=128)
    key = cache_key(checkpoint, settings)
    copy = shutil.copytree(checkpoint, tmp_path / "copy")
    os.utime(copy / "config.json", (0, 0))
    assert cache_key(copy, settings) == key  # the same bytes elsewhere, of another date
    assert cache_key(copy, EngineSettings(slots=4, max_cache_len=128)) != key
    assert cache_key(copy, EngineSettings(slots=8, max_cache_len=256)) != key
    (copy / "tokenizer_config.json").write_text("{}")  # the tokenizer does not make the engine
    assert cache_key(copy, settings) == key
    weights = next(copy.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert cache_key(copy, settings) != key


def test_a_cached_bundle_is_reused(checkpoint, some_bundle, tmp_path, capsys):
    settings = EngineSettings(slots=8, max_cache_len=128)
    cached = tmp_path / f"tiny-llama-{cache_key(checkpoint, settings)[:20]}"
    shutil.copytree(some_bundle, cached)
    served = launch.prepare(checkpoint, tokenizer=None, model_name=None, slots=8, max_cache_len=128,
                            cache_folder=tmp_path)
    assert served == launch.Served(cached, checkpoint, "tiny-llama")
    assert "(cached)" in capsys.readouterr().err


def test_what_serve_refuses(checkpoint, some_bundle, tmp_path):
    with pytest.raises(ValueError, match="neither an engine bundle .* nor a transformers checkpoint"):
        launch.prepare(tmp_path, tokenizer=None, model_name=None, slots=None, max_cache_len=None, cache_folder=None)
    with pytest.raises(ValueError, match="--tokenizer"):
        launch.prepare(some_bundle, tokenizer=None, model_name=None, slots=None, max_cache_len=None,
                       cache_folder=None)
    with pytest.raises(ValueError, match="--slots and --max-cache-len apply to a checkpoint"):
        launch.prepare(some_bundle, tokenizer=checkpoint, model_name=None, slots=8, max_cache_len=None,
                       cache_folder=None)
    assert launch.prepare(some_bundle, tokenizer=checkpoint, model_name="m", slots=None, max_cache_len=None,
                          cache_folder=None) == launch.Served(some_bundle, checkpoint, "m")


@pytest.mark.parametrize("arguments, message", [
    (["--replicas", "2"], "--replicas and --ray-address go with --ray"),
    (["--slots", "0"], "--slots must be at least 1, got 0"),
])
def test_cli_refuses_bad_options(checkpoint, capsys, arguments, message):
    assert main(["serve", str(checkpoint), *arguments]) == 1
    assert message in capsys.readouterr().err
