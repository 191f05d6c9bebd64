"""Run inside a network namespace of its own (test_ray_serve.py starts it under ``unshare -n`` with only
loopback up): start ``torch-stablehlo serve CHECKPOINT --ray --replicas 2`` on 127.0.0.1, send the job's prompts
concurrently with the ``openai`` client, ask /health often enough to see both replicas, stop the server and
write what it answered as JSON.

    python -m tests.serving.ray_driver JOB.json RESULT.json       # from the repository's root
"""
from __future__ import annotations

import http.client
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai

from .serve_process import serve_process

PORT = 8000
STARTUP_SECONDS = 480


def main(job_path: str, result_path: str) -> int:
    job = json.loads(open(job_path).read())
    env = {**os.environ, "TORCH_STABLEHLO_ENGINE_DIR": job["engine_dir"]}
    arguments = [job["checkpoint"], "--ray", "--replicas", "2", "--slots", "8", "--max-cache-len",
                 str(job["max_cache_len"]), "--host", "127.0.0.1", "--port", str(PORT)]
    result: dict = {}
    started = time.monotonic()
    try:
        with serve_process(arguments, env, STARTUP_SECONDS) as url:
            result["startup_seconds"] = time.monotonic() - started
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
            with ThreadPoolExecutor(len(job["prompts"])) as pool:
                result["texts"] = list(pool.map(
                    lambda prompt: client.completions.create(model=job["model"], prompt=prompt,
                                                             max_tokens=job["max_tokens"]).choices[0].text,
                    job["prompts"]))
            result["replicas"] = sorted({_health()["process"] for _ in range(40)})
    except Exception as error:  # noqa: BLE001  (reported to the test, which runs outside the namespace)
        result["error"] = f"{type(error).__name__}: {error}"
    with open(result_path, "w") as stream:
        json.dump(result, stream)
    return 0


def _health() -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    try:
        connection.request("GET", "/health")
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
