"""The engine as Ray Serve replicas: ``torch-stablehlo serve PATH --ray --replicas N``.

Each replica (``EngineReplica``, a Ray Serve deployment) loads the engine bundle once, starts its own
``Engine`` and serves the same OpenAI app as ``launch.serve_local`` (``openai_api.build_app``); Ray Serve's
HTTP proxy routes each request to one replica. The bundle is exported (or found in the cache) once, by the
driver, before any replica starts; replicas on other machines read the same path, so it must be on a shared
filesystem or copied to the same path on every node.

Spanning machines: start Ray on the head (``ray start --head``) and on each other node
(``ray start --address HEAD:6379``), then run ``serve`` on the head with ``--ray-address auto``; Ray places
the replicas on the nodes' CPUs (``--replica-cpus`` each). Without ``--ray-address`` a local Ray instance is
started and stopped with the server.
"""
from __future__ import annotations

import signal
import sys
import threading
from contextlib import ExitStack

import ray
from ray import serve
from transformers import AutoTokenizer

from torch_stablehlo import serving
from torch_stablehlo.exporter import load_artifact

from .launch import Served
from .openai_api import build_app

APP_NAME = "torch-stablehlo"


@serve.deployment
@serve.ingress()
class EngineReplica:
    """One replica: the bundle loaded once, an Engine over it, the OpenAI app in front."""

    def __init__(self, served: Served, max_queue: int, chat_max_tokens: int):
        self._served, self._chat_max_tokens = served, chat_max_tokens
        self._stack = ExitStack()
        self._engine = self._stack.enter_context(serving.Engine(load_artifact(served.bundle), max_queue=max_queue))
        self._tokenizer = AutoTokenizer.from_pretrained(served.tokenizer)

    def __serve_build_asgi_app__(self):
        return build_app(self._engine, self._tokenizer, self._served.model_name,
                         chat_max_tokens=self._chat_max_tokens)

    def __del__(self):
        self._stack.close()


def _start_ray(address: str | None, tries: int = 3) -> None:
    """``ray.init``; starting a local instance is tried again, since Ray gives a new raylet a fixed 30 s to
    register with its GCS, which a loaded machine can miss."""
    for attempt in range(1, tries + 1):
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
            return
        except Exception as error:  # noqa: BLE001  (Ray raises a bare Exception for the timeout)
            ray.shutdown()
            if address is not None or attempt == tries:
                raise
            print(f"Ray did not start ({error}); trying again", file=sys.stderr, flush=True)


def serve_on_ray(served: Served, *, replicas: int, replica_cpus: float, host: str, port: int, max_queue: int,
                 chat_max_tokens: int, ray_address: str | None) -> None:
    """Start ``replicas`` EngineReplicas behind Ray Serve's proxy on ``host:port``; serve until SIGINT/SIGTERM."""
    _start_ray(ray_address)
    try:
        serve.start(http_options={"host": host, "port": port})
        deployment = EngineReplica.options(num_replicas=replicas, ray_actor_options={"num_cpus": replica_cpus})
        serve.run(deployment.bind(served, max_queue, chat_max_tokens), name=APP_NAME, route_prefix="/")
        print(f"serving {served.model_name} on http://{host}:{port} ({replicas} Ray Serve replicas)", flush=True)
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        while not stop.wait(1.0):
            pass
        serve.shutdown()
    finally:
        ray.shutdown()


