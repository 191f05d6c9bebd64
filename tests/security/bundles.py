"""Helpers for the trust-boundary tests: a small dynamic bundle, manifests and files edited as an adversary would
(sizes and checksums kept consistent, so only the check under test can catch the change), and a record of every
file Python opens (an audit hook on 'open' events)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
from pathlib import Path

import torch
from torch.export import Dim

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.formats.manifest_schema import plain_file_name

MANIFEST = "manifest.json"
_RECORDERS: list[list[str]] = []


def small_artifact():
    """nn.Linear(8, 4) with a symbolic batch in [2, 16], and its model."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).eval()
    artifact = export_to_stablehlo(model, (torch.randn(4, 8),),
                                   dynamic_shapes=({0: Dim("batch", min=2, max=16)},))
    return model, artifact


def loads_while_saving(versions: list, path: Path, outcome, loads: int, readers: int, pause: float) -> list[str]:
    """Save ``versions`` (artifacts) in turn to ``path`` from one thread, ``pause`` seconds apart (readers run
    between saves too: a save holds the interpreter most of its time), while ``readers`` threads take ``loads``
    outcomes in all, and more until two saves have ended (on a loaded machine one save can outlast the loads):
    ``outcome()`` (a load and what it computed, as a word), or the error it raised, as text."""
    done, outcomes, lock, saved = threading.Event(), [], threading.Lock(), [0]

    def save():
        turn = 0
        while not done.is_set():
            turn += 1
            versions[turn % 2].save(path)
            saved[0] = turn
            done.wait(pause)

    def read():
        while True:
            with lock:
                if len(outcomes) >= loads and saved[0] >= 2:
                    return
                outcomes.append(None)
                index = len(outcomes) - 1
            try:
                outcomes[index] = outcome()
            except Exception as error:  # noqa: BLE001  (every failure is a wrong outcome: the caller reports it)
                outcomes[index] = f"{type(error).__name__}: {error}"

    saver, reading = threading.Thread(target=save), [threading.Thread(target=read) for _ in range(readers)]
    saver.start()
    for reader in reading:
        reader.start()
    for reader in reading:
        reader.join()
    done.set()
    saver.join()
    return outcomes


def read_manifest(path: Path, manifest: str = MANIFEST) -> dict:
    return json.loads((path / manifest).read_text())


def write_manifest(path: Path, content: dict, manifest: str = MANIFEST) -> None:
    (path / manifest).write_text(json.dumps(content))


def edit_manifest(path: Path, change, manifest: str = MANIFEST) -> None:
    """Apply ``change(manifest)`` (it edits in place) and write the manifest (file ``manifest``) back."""
    content = read_manifest(path, manifest)
    change(content)
    write_manifest(path, content, manifest)


def rewrite_file(path: Path, name: str, data: bytes, manifest: str = MANIFEST) -> None:
    """Replace the bundle file ``name`` with ``data``, its size and sha256 updated in the manifest."""
    (path / name).write_bytes(data)
    edit_manifest(path, lambda m: m["files"].__setitem__(
        name, {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}), manifest)


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    """An MLIR bytecode varint at ``position`` (the first byte's trailing zeros count the bytes that follow): its
    value and the position after it."""
    if data[position] == 0:
        return int.from_bytes(data[position + 1:position + 9], "little"), position + 9
    length = (data[position] & -data[position]).bit_length()
    return int.from_bytes(data[position:position + length], "little") >> length, position + length


def _varint(value: int) -> bytes:
    for length in range(1, 9):
        if value < 1 << (7 * length):
            return ((value << length) | (1 << (length - 1))).to_bytes(length, "little")
    return b"\0" + value.to_bytes(8, "little")


def with_string_count(data: bytes, count: int) -> bytes:
    """MLIR bytecode whose string section claims ``count`` strings (its section length kept consistent): the
    reader sizes its tables by that count before it finds the strings missing."""
    position = data.index(b"\0", _read_varint(data, 4)[1]) + 1  # after the magic, the version and the producer
    while True:
        start, kind = position, data[position] & 0x7F
        length, body = _read_varint(data, position + 1)
        if kind == 0:  # the string section: its count first
            rest = _varint(count) + data[_read_varint(data, body)[1]:body + length]
            return data[:start] + bytes([data[start]]) + _varint(len(rest)) + rest + data[body + length:]
        position = body + length


def _record_opens(event: str, args: tuple) -> None:
    """A relative path is kept as it is: the loader opens a bundle's files by their plain names relative to the
    folder's descriptor (which the audit event does not give); ``outside`` judges it by its name."""
    if event == "open" and _RECORDERS and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        _RECORDERS[-1].append(path if not os.path.isabs(path) else os.path.realpath(path))


sys.addaudithook(_record_opens)


@contextlib.contextmanager
def opened_files():
    """Yields a list that collects the resolved path of every file Python opens inside the block."""
    opened: list[str] = []
    _RECORDERS.append(opened)
    try:
        yield opened
    finally:
        _RECORDERS.pop()


def outside(opened: list[str], folder: Path) -> list[str]:
    """The opened paths that are not inside ``folder`` (nor Python's own modules and libraries). A relative path
    counts as inside only where it is a plain name (opened relative to the folder's descriptor): ``../x`` or
    ``a/b`` is outside."""
    root = os.path.realpath(folder) + os.sep
    ignored = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    return [p for p in opened if not (plain_file_name(p) or (p + os.sep).startswith(root) or p.startswith(ignored)
                                      or p.startswith(("/proc/", "/sys/", "/dev/")))]
