"""The one schema of a bundle's manifest: every field's type, checked before any field is used.

A signature's records (``InputSlot``, ``OutputSlot``, ``Signature``) are described once, field by field
(``SlotField``): the writer (``signature_json``), the reader (``signature_from_json``) and the check
(``SIGNATURE``) all read that description.

A manifest is data from whoever wrote the bundle. ``check_manifest`` walks it against ``MANIFEST`` and raises
``BundleError`` naming the first field that does not fit (``signature.inputs[2].tensor.shape[0]``) and what was
expected there, so no malformed field reaches the code that reads it as a raw ``KeyError`` or ``TypeError``.
File names are checked here too: each is a plain name inside the bundle folder (see ``plain_file_name``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

from torch_stablehlo.exported_program import HELD_KINDS
from torch_stablehlo.stablehlo_ir.platforms import PLATFORMS
from torch_stablehlo.stablehlo_ir.shardy import normalize_spec
from torch_stablehlo.stablehlo_ir.specs import DTYPES_BY_NAME, TensorSpec

from ..conversion.dim_grammar import DimSyntaxError, parse
from ..conversion.signature import (INPUT_SLOT_KINDS, OUTPUT_SLOT_KINDS, RNG_SEED, SCALAR_NAMES, InputSlot,
                                    OutputSlot, Signature)
from ..errors import BundleError


class SchemaError(ValueError):
    """One field does not fit the schema: ``field`` names it, the message says what was expected."""

    def __init__(self, field: str, message: str):
        super().__init__(f"manifest field {field or '(top level)'}: {message}")


def described(value) -> str:
    """A value of a manifest as an error message shows it: its type and the start of its repr."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


@dataclass(frozen=True)
class Check:
    """A leaf check: ``test(value)`` is true for a value that fits; ``expected`` says what fits."""
    expected: str
    test: Callable

    def __call__(self, value, field: str) -> None:
        try:
            fits = self.test(value)
        except (TypeError, ValueError):
            fits = False
        if not fits:
            raise SchemaError(field, f"expected {self.expected}, got {described(value)}")


@dataclass(frozen=True)
class Record:
    """A JSON object with these keys (``optional``: may be absent); other keys are ignored."""
    fields: dict
    optional: frozenset = frozenset()

    def __call__(self, value, field: str) -> None:
        if not isinstance(value, dict):
            raise SchemaError(field, f"expected an object with {', '.join(self.fields)}, got {described(value)}")
        for key, check in self.fields.items():
            if key in value:
                check(value[key], f"{field}.{key}" if field else key)
            elif key not in self.optional:
                raise SchemaError(f"{field}.{key}" if field else key, "missing")


@dataclass(frozen=True)
class ListOf:
    item: Callable
    length: int | None = None

    def __call__(self, value, field: str) -> None:
        if not isinstance(value, list) or (self.length is not None and len(value) != self.length):
            size = f" of {self.length}" if self.length is not None else ""
            raise SchemaError(field, f"expected a list{size}, got {described(value)}")
        for index, item in enumerate(value):
            self.item(item, f"{field}[{index}]")


@dataclass(frozen=True)
class MapOf:
    """A JSON object of any keys passing ``key``, each value passing ``item``."""
    item: Callable
    key: Callable = None

    def __call__(self, value, field: str) -> None:
        if not isinstance(value, dict):
            raise SchemaError(field, f"expected an object, got {described(value)}")
        for key, item in value.items():
            if self.key is not None:
                self.key(key, f"{field} key")
            self.item(item, f"{field}[{key!r}]")


def nullable(check: Callable) -> Callable:
    def nullable_check(value, field: str) -> None:
        if value is not None:
            check(value, field)
    return nullable_check


class OversizedInteger:
    """An integer of a manifest too long to be one of its sizes or counts (read as this, never as an ``int``:
    Python refuses to convert more than 4300 digits, with a ValueError the loader would not expect)."""

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def bounded_int(text: str):
    """``json.loads``'s ``parse_int``: an integer, or an ``OversizedInteger`` past 40 digits (every field of a
    manifest that is an integer is below 2**63)."""
    return int(text) if len(text) <= 40 else OversizedInteger(len(text.lstrip("-")))


def plain_file_name(name: str) -> bool:
    """A name a bundle may give one of its files: no folder part, not ``.``/``..``, no NUL, no leading dot."""
    return isinstance(name, str) and bool(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,254}", name))


def _dim_text(text) -> bool:
    try:
        parse(text)
    except DimSyntaxError:
        return False
    return True


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 63


TEXT = Check("a string", lambda v: isinstance(v, str))
COUNT = Check("an integer in [0, 2**63)", _count)
SCALAR = Check("a number, string, boolean or null", lambda v: v is None or isinstance(v, (int, float, str, bool)))
DTYPE = Check(f"a dtype name ({', '.join(sorted(DTYPES_BY_NAME))})", lambda v: v in DTYPES_BY_NAME)
DIM = Check("a size in [0, 2**63) or a symbolic dim (names, integers, + - * // %, parentheses)",
            lambda v: _count(v) or _dim_text(v))
FILE_NAME = Check("a plain file name inside the bundle (letters, digits, _ . + = -; no folder, no leading dot)",
                  plain_file_name)
TENSOR = Record({"name": TEXT, "dtype": DTYPE, "shape": ListOf(DIM)})
SHARDING = nullable(ListOf(ListOf(TEXT)))
MESH = nullable(MapOf(Check("a positive axis size", lambda v: _count(v) and v > 0)))
PLATFORM_LIST = Check(f"a list of distinct platform names, each one of {PLATFORMS}",
                      lambda v: isinstance(v, list) and len(set(v)) == len(v) and all(p in PLATFORMS for p in v))


def _same(value):
    return value


@dataclass(frozen=True)
class SlotField:
    """One field of a signature record as the manifest holds it: its ``check``; ``write`` and ``read`` between
    the record's value and JSON; ``absent`` (where not ``REQUIRED``): the value a manifest may leave it out for
    (a bundle made before the field was), which the writer then leaves out too where ``omitted``."""
    check: Callable
    write: Callable = _same
    read: Callable = _same
    absent: object = None
    omitted: bool = False


REQUIRED = object()
TENSOR_FIELD = SlotField(nullable(TENSOR), lambda t: t.to_json() if t is not None else None,
                         lambda d: TensorSpec.from_json(d) if d else None, REQUIRED)
INPUT_FIELDS = {
    "name": SlotField(TEXT, absent=REQUIRED),
    "kind": SlotField(Check(f"one of {sorted(INPUT_SLOT_KINDS)}", lambda v: v in INPUT_SLOT_KINDS), absent=REQUIRED),
    "target": SlotField(nullable(TEXT), absent=REQUIRED),
    "value": SlotField(SCALAR, absent=REQUIRED),
    "tensor": TENSOR_FIELD,
    "sharding": SlotField(SHARDING, lambda s: [list(axes) for axes in s] if s is not None else None,
                          lambda s: normalize_spec(s) if s is not None else None),
    "scalar": SlotField(nullable(Check("int", lambda v: v == "int"))),
    "ones_like": SlotField(TEXT, omitted=True),
}
OUTPUT_FIELDS = {
    "kind": SlotField(Check(f"one of {sorted(OUTPUT_SLOT_KINDS)}", lambda v: v in OUTPUT_SLOT_KINDS),
                      absent=REQUIRED),
    "target": SlotField(nullable(TEXT), absent=REQUIRED),
    "tensor": TENSOR_FIELD,
    "scalar": SlotField(nullable(Check(f"one of {sorted(SCALAR_NAMES)}", lambda v: v in SCALAR_NAMES))),
    "value": SlotField(SCALAR),
}


def _records(kind: type, fields: dict) -> SlotField:
    """A list of ``kind`` records (``InputSlot`` or ``OutputSlot``) of ``fields``, as a field of the signature."""
    return SlotField(ListOf(_record(fields)), lambda slots: [_written(fields, s) for s in slots],
                     lambda items: [_read(kind, fields, item) for item in items], REQUIRED)


def _record(fields: dict) -> Record:
    return Record({name: f.check for name, f in fields.items()},
                  optional=frozenset(name for name, f in fields.items() if f.absent is not REQUIRED))


def _written(fields: dict, record) -> dict:
    values = {name: f.write(getattr(record, name)) for name, f in fields.items()}
    return {name: value for name, value in values.items() if not (fields[name].omitted and value is None)}


def _read(kind: type, fields: dict, data: dict):
    return kind(**{name: f.read(data[name] if name in data or f.absent is REQUIRED else f.absent)
                   for name, f in fields.items()})


SIGNATURE_FIELDS = {
    "inputs": _records(InputSlot, INPUT_FIELDS),
    "outputs": _records(OutputSlot, OUTPUT_FIELDS),
    "in_spec": SlotField(TEXT, absent=REQUIRED),
    "out_spec": SlotField(TEXT, absent=REQUIRED),
    "dims": SlotField(MapOf(ListOf(nullable(COUNT), length=2), key=DIM), absent=REQUIRED),
    "sizes": SlotField(ListOf(TEXT), list, list, ()),
    "mesh": SlotField(MESH),
    "arg_names": SlotField(ListOf(TEXT), list, list, ()),
    "platforms": SlotField(PLATFORM_LIST, list, list, ()),
}
SIGNATURE = _record(SIGNATURE_FIELDS)


def signature_json(signature: Signature) -> dict:
    """The manifest's form of ``signature`` (``SIGNATURE_FIELDS``)."""
    return _written(SIGNATURE_FIELDS, signature)


def signature_from_json(data: dict) -> Signature:
    """The signature a manifest holds (checked against ``SIGNATURE`` first: see ``check_manifest``)."""
    return _read(Signature, SIGNATURE_FIELDS, data)
WEIGHT = Record({"file": nullable(FILE_NAME), "dtype": DTYPE, "shape": ListOf(COUNT), "bytes": COUNT})
FILE = Record({"bytes": COUNT, "sha256": Check("64 hex digits", lambda v: bool(re.fullmatch(r"[0-9a-f]{64}", v)))})
MANIFEST = Record({"format": TEXT, "format_version": COUNT, "stablehlo_version": TEXT, "signature": SIGNATURE,
                   "mesh": MESH, "weights": MapOf(WEIGHT), "weight_aliases": MapOf(TEXT),
                   "files": MapOf(FILE, key=FILE_NAME)}, optional=frozenset({"mesh"}))
NUMBER = Check("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
SHAPES = ListOf(ListOf(COUNT))
ENGINE_CONFIG = Record({
    "slots": COUNT, "max_cache_len": COUNT, "vocab_size": COUNT, "pad_token_id": COUNT, "eos_token_ids": ListOf(COUNT),
    "buckets": Check("a non-empty ascending list of positive integers",
                     lambda v: isinstance(v, list) and v and all(_count(b) and b > 0 for b in v) and v == sorted(set(v))),
    "cache_dtype": DTYPE, "layer_shapes": SHAPES, "carried_shapes": SHAPES, "steps_per_call": COUNT,
    "defaults": Record({"do_sample": nullable(Check("a boolean", lambda v: isinstance(v, bool))),
                        "temperature": nullable(NUMBER), "top_k": nullable(COUNT), "top_p": nullable(NUMBER)})})
ENGINE_MANIFEST = Record({"format": TEXT, "format_version": COUNT, "stablehlo_version": TEXT, "config": ENGINE_CONFIG,
                          "entry_points": MapOf(Record({"module": FILE_NAME, "signature": SIGNATURE})),
                          "weights": MapOf(WEIGHT), "weight_aliases": MapOf(TEXT),
                          "files": MapOf(FILE, key=FILE_NAME)})
"""An engine bundle's ``engine.json``: a program bundle's manifest with one signature and module per entry point."""


def check_manifest(manifest, where: str) -> None:
    """Raise BundleError (``where``: the manifest file) naming the first field that does not fit ``MANIFEST``, a size
    that does not fit its shape and dtype, or a reference that leads nowhere: an alias to no stored weight, a weight in a file the manifest does not list."""
    try:
        MANIFEST(manifest, "")
        _check_weight_sizes(manifest)
        _check_signature_sizes(manifest["signature"], "signature")
        _check_references(manifest)
    except SchemaError as error:
        raise BundleError(f"{where} is invalid: {error}") from None


def check_engine_manifest(manifest, where: str) -> None:
    """``check_manifest`` for an engine bundle's manifest (``ENGINE_MANIFEST``): each entry point's signature as a
    program's, its module a file the manifest lists."""
    try:
        ENGINE_MANIFEST(manifest, "")
        _check_weight_sizes(manifest)
        for name, entry in manifest["entry_points"].items():
            _check_signature_sizes(entry["signature"], f"entry_points[{name!r}].signature")
            if entry["module"] not in manifest["files"]:
                raise SchemaError(f"entry_points[{name!r}].module",
                                  f"expected a file listed in files, got {entry['module']!r}")
        _check_references(manifest)
    except SchemaError as error:
        raise BundleError(f"{where} is invalid: {error}") from None


def check_slots(manifest: dict, signature, where: str) -> None:
    """Raise BundleError unless the signature's slots fit together: each input the artifact holds (weights, state)
    names a weight of the same shape and dtype; a sharding splits dims of its tensor over distinct axes of the mesh;
    ``rng_seed`` is at most one 0-d int64, the last input; a scalar output is 0-d."""
    try:
        for index, slot in enumerate(signature.inputs):
            if slot.kind in HELD_KINDS:
                _check_held(manifest, slot, f"signature.inputs[{index}]")
            if slot.sharding is not None:
                _check_sharding(signature.mesh or {}, slot, f"signature.inputs[{index}].sharding")
            if slot.kind == RNG_SEED and (index != len(signature.inputs) - 1 or slot.tensor is None
                                            or (slot.tensor.dtype, slot.tensor.shape) != ("int64", ())):
                raise SchemaError(f"signature.inputs[{index}]", "an rng_seed input is the last, a 0-d int64")
        for index, slot in enumerate(signature.outputs):
            if slot.scalar and (slot.tensor is None or slot.tensor.shape != ()):
                raise SchemaError(f"signature.outputs[{index}].tensor", "a scalar output is a 0-d tensor")
    except SchemaError as error:
        raise BundleError(f"{where} is invalid: {error}") from None


def _check_sharding(mesh: dict, slot, field: str) -> None:
    axes = [axis for dim in slot.sharding for axis in dim]
    if slot.tensor is None or len(slot.sharding) > len(slot.tensor.shape) or not set(axes) <= set(mesh) \
            or len(set(axes)) != len(axes):
        raise SchemaError(field, f"expected at most one entry per dim, each naming distinct axes of the signature's "
                                 f"mesh {mesh}; got {slot.sharding}")


def _check_held(manifest: dict, slot, field: str) -> None:
    record = manifest["weights"].get(manifest["weight_aliases"].get(slot.target, slot.target))
    if record is None or slot.tensor is None:
        raise SchemaError(f"{field}.target", f"expected the name of a weight, got {slot.target!r}")
    if (record["dtype"], list(record["shape"])) != (slot.tensor.dtype, list(slot.tensor.shape)):
        raise SchemaError(field, f"weight {slot.target!r} is {record['dtype']}{record['shape']} in weights, "
                                 f"{slot.tensor.dtype}{list(slot.tensor.shape)} here")


def _nbytes(shape, dtype: str) -> int:
    """The bytes a tensor of ``shape`` (its static sizes) and ``dtype`` takes."""
    return math.prod(d for d in shape if isinstance(d, int)) * DTYPES_BY_NAME[dtype].itemsize


def _check_weight_sizes(manifest: dict) -> None:
    """Each weight's ``bytes`` is what its shape and dtype take."""
    for name, record in manifest["weights"].items():
        if _nbytes(record["shape"], record["dtype"]) != record["bytes"]:
            raise SchemaError(f"weights[{name!r}].bytes", f"expected {record['dtype']}{record['shape']}'s size in "
                                                          f"bytes, got {record['bytes']}")


def _check_signature_sizes(signature: dict, field: str) -> None:
    """No tensor of the ``signature`` has static sizes whose product (in bytes) reaches 2**63, so no tensor or
    placeholder made from them overflows."""
    for group in ("inputs", "outputs"):
        for index, slot in enumerate(signature[group]):
            tensor = slot["tensor"]
            if tensor is not None and _nbytes(tensor["shape"], tensor["dtype"]) >= 2 ** 63:
                raise SchemaError(f"{field}.{group}[{index}].tensor.shape", "expected static sizes whose product "
                                  f"in bytes is below 2**63, got {described(tensor['shape'])}")


def _check_references(manifest: dict) -> None:
    for name, target in manifest["weight_aliases"].items():
        if target not in manifest["weights"]:
            raise SchemaError(f"weight_aliases[{name!r}]", f"expected the name of a weight, got {target!r}")
    for name, record in manifest["weights"].items():
        if record["file"] is not None and record["file"] not in manifest["files"]:
            raise SchemaError(f"weights[{name!r}].file", f"expected a file listed in files, got {record['file']!r}")
