"""Running the OpenAI app over an engine bundle in this process, with uvicorn.

``prepare`` turns ``serve``'s PATH into (bundle, tokenizer folder, model name); ``serve_local`` loads the
bundle, starts the ``Engine`` (its scheduler thread) and serves until interrupted. A port of 0 takes a free
one; either way the line ``serving MODEL on http://HOST:PORT`` is printed once the socket is bound.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from transformers import AutoTokenizer

from torch_stablehlo import serving
from torch_stablehlo.exporter import load_artifact
from torch_stablehlo.exporter.formats.engine_artifact import is_engine_bundle

from .checkpoint import EngineSettings, engine_bundle, is_checkpoint
from .openai_api import build_app


@dataclass(frozen=True)
class Served:
    """What a server serves: an engine bundle, the tokenizer's folder, the model's name in the API."""
    bundle: Path
    tokenizer: Path
    model_name: str


def prepare(path: Path, *, tokenizer: Path | None, model_name: str | None, slots: int | None,
            max_cache_len: int | None, cache_folder: Path | None) -> Served:
    """A bundle PATH is served as it is (``tokenizer`` required); a checkpoint PATH through its cached bundle."""
    if is_engine_bundle(path):
        if tokenizer is None:
            raise ValueError(f"{path} is an engine bundle: name its tokenizer's folder with --tokenizer")
        if slots is not None or max_cache_len is not None:
            raise ValueError(f"{path} is an engine bundle, exported with its own slots and cache length: "
                             "--slots and --max-cache-len apply to a checkpoint folder")
        return Served(path, tokenizer, model_name or path.resolve().name)
    if not is_checkpoint(path):
        raise ValueError(f"{path} is neither an engine bundle (engine.json) nor a transformers checkpoint "
                         "folder (config.json and *.safetensors)")
    bundle = engine_bundle(path, EngineSettings(slots or EngineSettings.slots, max_cache_len), cache_folder)
    return Served(bundle, tokenizer or path, model_name or path.resolve().name)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def run_app(app, sock: socket.socket, *, log_level: str = "info") -> None:
    """Serve ``app`` on the bound ``sock`` until interrupted (SIGINT/SIGTERM end it gracefully)."""
    uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5)).run(sockets=[sock])


def serve_local(served: Served, *, host: str, port: int, max_queue: int, chat_max_tokens: int) -> None:
    artifact = load_artifact(served.bundle)
    tokenizer = AutoTokenizer.from_pretrained(served.tokenizer)
    with serving.Engine(artifact, max_queue=max_queue) as engine:
        app = build_app(engine, tokenizer, served.model_name, chat_max_tokens=chat_max_tokens)
        sock = bind(host, port)
        print(f"serving {served.model_name} on http://{host}:{sock.getsockname()[1]} ({engine.slots} slots)",
              flush=True)
        run_app(app, sock)
