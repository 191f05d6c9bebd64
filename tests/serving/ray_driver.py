"""Run inside a network namespace of its own (test_ray_serve.py starts it under ``unshare -n`` with only
loopback up): start ``torch-stablehlo serve CHECKPOINT --ray --replicas 2`` on 127.0.0.1, send the job's prompts
concurrently with the ``openai`` client, ask /health often enough to see both replicas, stop the server and
write what it answered as JSON.

    python tests/serving/ray_driver.py JOB.json RESULT.json
"""
from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai

PORT = 8000
STARTUP_SECONDS = 400


def main(job_path: str, result_path: str) -> int:
    job = json.loads(open(job_path).read())
    env = {**os.environ, "TORCH_STABLEHLO_ENGINE_DIR": job["engine_dir"]}
    command = [sys.executable, "-m", "torch_stablehlo", "serve", job["checkpoint"], "--ray", "--replicas", "2",
               "--slots", "8", "--max-cache-len", str(job["max_cache_len"]), "--host", "127.0.0.1",
               "--port", str(PORT)]
    started = time.monotonic()
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    log: list[str] = []
    ready = threading.Event()

    def read():
        for line in server.stdout:
            log.append(line)
            if line.startswith("serving "):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    result = {"log": log}
    try:
        while not ready.wait(1):
            if server.poll() is not None or time.monotonic() - started > STARTUP_SECONDS:
                result["error"] = "the server did not start"
                return _write(result_path, result)
        result["startup_seconds"] = time.monotonic() - started
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="unused", max_retries=0,
                               timeout=120)
        with ThreadPoolExecutor(len(job["prompts"])) as pool:
            result["texts"] = list(pool.map(
                lambda prompt: client.completions.create(model=job["model"], prompt=prompt,
                                                         max_tokens=job["max_tokens"]).choices[0].text,
                job["prompts"]))
        result["replicas"] = sorted({_health()["process"] for _ in range(40)})
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    return _write(result_path, result)


def _health() -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    try:
        connection.request("GET", "/health")
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def _write(path: str, result: dict) -> int:
    with open(path, "w") as stream:
        json.dump({**result, "log": "".join(result["log"])[-6000:]}, stream)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
