"""``torch-stablehlo serve ...`` as a process of a test (standard library only: the Ray driver imports it too):
started, waited for until it prints ``serving MODEL on URL``, stopped with SIGINT (killed if it lingers)."""
from __future__ import annotations

import contextlib
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Iterator

SERVING = re.compile(r"^serving .* on (?P<url>http://\S+)")


class ServerDidNotStart(RuntimeError):
    pass


@contextlib.contextmanager
def serve_process(arguments: list[str], env: dict, startup_seconds: float) -> Iterator[str]:
    """Yields the URL the server printed; its output (stdout and stderr) is in the error if it does not start."""
    process = subprocess.Popen([sys.executable, "-m", "torch_stablehlo", "serve", *arguments], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log: list[str] = []
    urls: queue.Queue = queue.Queue()

    def read():
        for line in process.stdout:
            log.append(line)
            if found := SERVING.match(line):
                urls.put(found["url"])

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + startup_seconds
    try:
        while True:
            try:
                url = urls.get(timeout=1)
                break
            except queue.Empty:
                if process.poll() is not None or time.monotonic() > deadline:
                    time.sleep(0.5)  # the rest of its output
                    raise ServerDidNotStart(f"`serve {' '.join(arguments)}` did not start (exit status "
                                            f"{process.poll()}):\n{''.join(log)[-6000:]}") from None
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
