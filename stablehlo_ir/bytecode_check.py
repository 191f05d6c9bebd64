"""Reading StableHLO bytecode from elsewhere without risking the caller's process.

jaxlib's bytecode reader can crash the process (SIGSEGV) on crafted bytes, or allocate what a count in them says
(a 1 KB file whose string table claims 2**27 entries takes gigabytes before it is refused), so ``read_in_child``
first reads them in a short-lived child process (``python -I -m torch_stablehlo.stablehlo_ir.bytecode_check``:
isolated, no current folder on its path), which deserializes the module and prints it; only bytes that came
through there are read in-process. The child runs under a time limit and an address-space limit
(``RLIMIT_AS``: what it maps once Python, jaxlib and the MLIR context are loaded, plus the memory given), so
hostile bytes cost at most that. The child costs a Python start and the MLIR context, about half a second.
"""
from __future__ import annotations

import re
import resource
import signal
import subprocess
import sys

from jaxlib.mlir.dialects import stablehlo

from .mlir_context import make_context

_OUT_OF_MEMORY = re.compile(r"out of memory|bad_alloc|MemoryError|Cannot allocate memory", re.I)


SIZE_FACTOR = 16
"""A module is given at least this many times its size in memory, whatever the bound asked (a large legitimate
module needs memory in proportion to its bytes; a small hostile one gets no more than the bound)."""


def read_in_child(data: bytes, memory_bytes: int, seconds: float) -> str | None:
    """None if jaxlib reads ``data`` as a portable artifact in a child process given ``memory_bytes`` (or
    ``SIZE_FACTOR`` times the module's size, if more) beyond what it maps at start-up, and ``seconds`` to finish;
    else what went wrong there."""
    memory_bytes = max(memory_bytes, SIZE_FACTOR * len(data))
    try:
        done = subprocess.run([sys.executable, "-I", "-m", __name__, str(memory_bytes)], input=data,
                              capture_output=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return f"reading it took over {seconds:g} s (in a separate process)"
    if done.returncode == 0:
        return None
    stderr = done.stderr.decode(errors="replace")
    if _OUT_OF_MEMORY.search(stderr):
        return f"reading it needs more than the {memory_bytes} bytes of memory the check allows (in a separate process)"
    if done.returncode < 0:
        return f"it crashed the StableHLO reader ({signal.Signals(-done.returncode).name}, in a separate process)"
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else f"the reader exited with status {done.returncode}"


def mapped_bytes() -> int | None:
    """The address space this process maps now (Linux's ``VmSize``); None where the system does not say."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return None


def _read_stdin(memory_bytes: int) -> int:
    data = sys.stdin.buffer.read()
    with make_context() as context:
        mapped = mapped_bytes()
        if mapped is not None:  # elsewhere (no /proc) the time limit alone bounds the child
            resource.setrlimit(resource.RLIMIT_AS, (mapped + memory_bytes, mapped + memory_bytes))
        try:
            stablehlo.deserialize_portable_artifact(context, data).operation.get_asm()
        except MemoryError:
            print("MemoryError", file=sys.stderr)
            return 1
        except Exception as error:  # noqa: BLE001  (MLIR raises plain errors: the parent reports the message)
            print(" ".join(str(error).split()), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(_read_stdin(int(sys.argv[1])))
