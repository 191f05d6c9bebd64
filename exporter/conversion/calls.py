"""A call of a program against its ``Signature``: the caller's inputs checked (structure, specialised values,
dtypes, shapes, symbolic dims, splits over the mesh) and flattened into ``@main``'s tensor inputs, and ``@main``'s
results read back into the model's outputs. The signature states the convention; this module holds a call to it."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch._export.non_strict_utils import _enable_graph_inputs_of_type_nn_module

from torch_stablehlo.stablehlo_ir.dtypes import uncarried
from torch_stablehlo.stablehlo_ir.specs import TensorSpec

from ..errors import DimensionError, InputError
from . import symbolic_dims
from .signature import Signature


def check_dims(signature: Signature, tensors: list) -> dict[str, int]:
    """Bind the symbolic dims from the tensor inputs (``@main`` order) and check each against its range and
    the other dims it must equal; raises DimensionError. Returns symbol -> size."""
    slots = [s for s in signature.user_inputs if s.tensor is not None]
    sizes = symbolic_dims.check_dims([s.tensor for s in slots], tensors, signature.dims) if signature.is_dynamic else {}
    for slot, value in zip(slots, tensors):
        if slot.scalar:  # an int input: in its symbol's range, and equal to the dims that have that symbol
            number = int(value.item())
            symbolic_dims.check_range(slot.value, number, signature.dims, f"input '{slot.name}' is {number}, outside "
                                      f"the allowed range {{}} of its symbol {slot.value}")
            if sizes.setdefault(slot.value, number) != number:
                raise DimensionError(f"input '{slot.name}' is {number}, but it must equal the size "
                                     f"{slot.value} = {sizes[slot.value]} of a tensor input's dim")
    _check_splits(signature, tensors)
    return sizes


def _check_splits(signature: Signature, tensors: list) -> None:
    """Raise DimensionError if an input dim split over mesh axes is not a multiple of their device count (a
    symbolic dim can be any size in its range; XLA would pad the last shard and return wrong rows)."""
    slots = [s for s in signature.user_inputs if s.tensor is not None]
    for slot, value in zip(slots, tensors):
        for dim, axes in enumerate(slot.sharding or ()):
            parts = math.prod(signature.mesh[axis] for axis in axes)
            if value.shape[dim] % parts:
                raise DimensionError(
                    f"input '{slot.name}' dim {dim} is {value.shape[dim]}, but it is split over the mesh axes "
                    f"{', '.join(map(repr, axes))} ({parts} devices): give a multiple of {parts}, or export "
                    f"without splitting dim {dim}")


def tensor_inputs(signature: Signature, args: tuple, kwargs: dict) -> list:
    """The tensor leaves of ``(args, kwargs)`` in ``@main`` order, after checking the structure
    and that every non-tensor input has the value export specialised it to."""
    in_spec = signature.in_tree
    expected_positional = in_spec.child(0).num_children
    args, kwargs = _positional_by_name(signature, tuple(args), kwargs, expected_positional)
    if len(args) != expected_positional:
        raise InputError(f"expected {expected_positional} positional input(s), got {len(args)} "
                         f"(inputs: {', '.join(s.name for s in signature.user_inputs)})")
    expected_keys = list(in_spec.child(1).context) if in_spec.num_children == 2 else []
    kwargs = _with_defaults(signature, args, kwargs, expected_keys)
    unknown = sorted(set(kwargs) - set(expected_keys))
    missing = [k for k in expected_keys if k not in kwargs]
    if unknown or missing:
        raise InputError(f"keyword inputs: expected {expected_keys}"
                         + (f"; unexpected {unknown}" if unknown else "")
                         + (f"; missing {missing}" if missing else ""))
    inputs = _sizes_as_tuples((tuple(args), {k: kwargs[k] for k in expected_keys}))
    flat, spec = pytree.tree_flatten(inputs)
    if spec != in_spec and any(isinstance(leaf, torch.nn.Module) for leaf in flat):
        with _enable_graph_inputs_of_type_nn_module(inputs):  # as export and ep.module() flatten a module input:
            flat, spec = pytree.tree_flatten(inputs)           # its parameters and buffers, while registered
    if spec != in_spec:
        raise InputError(f"inputs do not have the structure the model was exported with.\n"
                         f"  expected: {in_spec}\n  got:      {spec}")
    for slot, value in zip(signature.user_inputs, flat):
        if slot.tensor is None and value != slot.value:
            raise InputError(f"input '{slot.name}' was specialised to {slot.value!r} at export; got {value!r}")
        if slot.scalar and (isinstance(value, bool) or not isinstance(value, (int, torch.SymInt))):
            raise InputError(f"input '{slot.name}': expected a Python int (its symbol {slot.value} in "
                             f"{signature.dims.get(slot.value)}), got {type(value).__name__}")
    return [torch.tensor(int(value)) if slot.scalar else value
            for slot, value in zip(signature.user_inputs, flat) if slot.tensor is not None]


def _with_defaults(signature: Signature, args: tuple, kwargs: dict, expected_keys: list) -> dict:
    """``kwargs`` with each left-out keyword input that has a default (``InputSlot.ones_like``) filled in: ones
    like the input it names (a torch tensor for a torch tensor, else a numpy array)."""
    given = {**dict(zip(signature.arg_names, args)), **kwargs}
    defaults = {}
    for slot in signature.user_inputs:
        source = given.get(slot.ones_like)
        if slot.ones_like is not None and slot.name in expected_keys and slot.name not in kwargs \
                and source is not None:
            defaults[slot.name] = torch.ones_like(source) if isinstance(source, torch.Tensor) else \
                np.ones(np.shape(source), np.asarray(source).dtype)
    return {**kwargs, **defaults}


def _positional_by_name(signature: Signature, args: tuple, kwargs: dict, count: int) -> tuple[tuple, dict]:
    """``(args, kwargs)`` with the positional parameters a call names (``art(x=x, idx=idx)``, as eager takes
    them) moved to ``args``, when every one after those given by position is named."""
    named = signature.arg_names[len(args):count]
    if len(args) >= count or len(named) != count - len(args) or not all(name in kwargs for name in named):
        return args, kwargs
    return (*args, *(kwargs[name] for name in named)), {k: v for k, v in kwargs.items() if k not in named}


def output_values(signature: Signature, results: list) -> list:
    """``@main``'s results, one per ``main_outputs`` slot, in the slot's dtype (``stablehlo_ir.dtypes.CARRIED``);
    each output with a data-dependent dim sliced to the size ``@main`` returned for it (after the outputs).
    A result given as None (the state, which stays on the device) stays None."""
    count = len(signature.main_outputs)
    sizes = {name: int(size.item()) for name, size in zip(signature.sizes, results[count:])}
    values = []
    for slot, value in zip(signature.main_outputs, results[:count]):
        if value is not None and not slot.scalar:
            value = uncarried(value, slot.tensor.torch_dtype)
            for dim, size in enumerate(slot.tensor.shape):
                if size not in sizes:
                    continue
                low, high = signature.dims.get(size, [0, None])  # the program's checks, within the padded size
                low, high = max(low or 0, 0), value.shape[dim] if high is None else min(high, value.shape[dim])
                if not low <= sizes[size] <= high:
                    raise DimensionError(
                        f"output '{slot.tensor.name}' has the data-dependent size {size} = {sizes[size]} along dim "
                        f"{dim}, outside [{low}, {high}], the range it was exported with (torch._check): the inputs "
                        "break a check the program makes")
                value = value.narrow(dim, 0, sizes[size])
        values.append(value)
    return values


def unflatten_outputs(signature: Signature, user_outputs: list):
    """The model's output structure around the flat user outputs."""
    return pytree.tree_unflatten(list(user_outputs), signature.out_tree)


def _sizes_as_tuples(value):
    """``value`` with each ``torch.Size`` in its lists, tuples and dicts a tuple, as torch.export flattens one."""
    if isinstance(value, torch.Size):
        return tuple(value)
    if type(value) in (list, tuple):
        return type(value)(_sizes_as_tuples(v) for v in value)
    if type(value) is dict:
        return {k: _sizes_as_tuples(v) for k, v in value.items()}
    return value


def validate_inputs(specs: Sequence[TensorSpec], values: Sequence) -> None:
    if len(values) != len(specs):
        names = ", ".join(s.name for s in specs)
        raise InputError(f"expected {len(specs)} tensor input(s) ({names}), got {len(values)}")
    for spec, value in zip(specs, values):
        if not isinstance(value, torch.Tensor):
            raise InputError(f"input '{spec.name}': expected a torch.Tensor of dtype {spec.dtype} "
                             f"and shape {_shape_text(spec.shape)}, got {type(value).__name__}")
        if value.layout != torch.strided:
            raise InputError(f"input '{spec.name}': expected a dense tensor, got a "
                             f"{str(value.layout).removeprefix('torch.')} one; pass it as tensor.to_dense()")
        if value.dtype != spec.torch_dtype:
            raise InputError(f"input '{spec.name}': expected dtype {spec.dtype}, got "
                             f"{str(value.dtype).removeprefix('torch.')}")
        if value.dim() != len(spec.shape) or any(
                isinstance(want, int) and want != got for want, got in zip(spec.shape, value.shape)):
            raise InputError(f"input '{spec.name}': expected shape {_shape_text(spec.shape)}, "
                             f"got {list(value.shape)}")


def _shape_text(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
