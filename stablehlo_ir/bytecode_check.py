"""Reading StableHLO bytecode from elsewhere without risking the caller's process.

jaxlib's bytecode reader can crash the process (SIGSEGV) on crafted bytes, so ``read_in_child`` first reads them
in a short-lived child process (``python -I -m torch_stablehlo.stablehlo_ir.bytecode_check``: isolated, no
current folder on its path), which deserializes the module and prints it; only bytes that came through there
are read in-process. The child costs a Python start and the MLIR context, about half a second.
"""
from __future__ import annotations

import signal
import subprocess
import sys

from jaxlib.mlir.dialects import stablehlo

from .mlir_context import make_context

TIMEOUT_SECONDS = 300


def read_in_child(data: bytes) -> str | None:
    """None if jaxlib reads ``data`` as a portable artifact in a child process; else what went wrong there."""
    try:
        done = subprocess.run([sys.executable, "-I", "-m", __name__], input=data, capture_output=True,
                              timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return f"reading it took over {TIMEOUT_SECONDS} s"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        return f"it crashed the StableHLO reader ({signal.Signals(-done.returncode).name}, in a separate process)"
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"the reader exited with status {done.returncode}"


def _read_stdin() -> int:
    with make_context() as context:
        try:
            stablehlo.deserialize_portable_artifact(context, sys.stdin.buffer.read()).operation.get_asm()
        except Exception as error:  # noqa: BLE001  (MLIR raises plain errors: the parent reports the message)
            print(" ".join(str(error).split()), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(_read_stdin())
