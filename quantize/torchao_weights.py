"""torchao's quantized weights (``quantize_(model, config)``): tensor subclass parameters.

``plain_quantized_weights`` gives a copy of a model whose weight-only int8 weights (``Int8WeightOnlyConfig``,
per channel or per tensor) are the int8 data, scale and zero point as plain parameters, dequantized in the forward
with ``quantized_decomposed.dequantize_per_channel`` (per-tensor: ``dequantize_per_tensor.tensor``): the static
scheme the rest of ``quantize`` converts to ``!quant.uniform`` types. Other torchao weights (dynamic int8
activations, group-wise ``IntxUnpackedToInt8Tensor``, block-wise int8) are left to torch.export, which traces
their ``linear`` into plain ops on the subclass's inner tensors (``export.access_subclass_inner_tensor``; torchao's
``choose_qparams_affine``/``quantize_affine``/``dequantize_affine``, ``aten._int_mm``); ``unwrapped_weights``
makes each inner tensor a weight of its own, as it does for any ExportedProgram holding such weights.
"""
from __future__ import annotations

import copy
import dataclasses

import torch
from torch.export import ExportedProgram
from torch.nn.utils import parametrize

from ..exported_program import WeightRewrite, is_weight, weight_values
from .schemes import qd

INNER_TENSOR = torch.ops.export.access_subclass_inner_tensor.default


class _Dequantize(torch.nn.Module):
    """Parametrization: int8 data, scale and zero point -> the float weight."""

    def __init__(self, axis: int | None, qmin: int, qmax: int, dtype: torch.dtype):
        super().__init__()
        self.axis, self.qmin, self.qmax, self.dtype = axis, qmin, qmax, dtype

    def forward(self, qdata, scale, zero_point):
        if self.axis is None:
            return qd.dequantize_per_tensor.tensor(qdata, scale, zero_point, self.qmin, self.qmax, torch.int8,
                                                   out_dtype=self.dtype)
        return qd.dequantize_per_channel(qdata, scale, zero_point, self.axis, self.qmin, self.qmax, torch.int8,
                                         out_dtype=self.dtype)

    def right_inverse(self, weight):
        return [weight.qdata, weight.scale.reshape(-1), weight.zero_point.reshape(-1).to(torch.int64)]


def _is_subclass(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and type(tensor) not in (torch.Tensor, torch.nn.Parameter) \
        and hasattr(tensor, "__tensor_flatten__")


def _converted(weight) -> bool:
    """Whether ``plain_quantized_weights`` converts ``weight``: weight-only int8, per tensor or per channel."""
    if type(weight).__name__ != "Int8Tensor" or getattr(weight, "act_quant_kwargs", None) is not None:
        return False
    varying = [b for size, b in zip(weight.qdata.shape, weight.block_size) if b != size]
    return varying in ([], [1])


def _parametrization(weight) -> _Dequantize:
    shape, block = list(weight.qdata.shape), list(weight.block_size)
    axis = next((d for d, (size, b) in enumerate(zip(shape, block)) if b != size), None)
    qmin, qmax = (-64, 63) if weight.reduce_range else (-128, 127)
    return _Dequantize(axis, qmin, qmax, weight.dtype)


def plain_quantized_weights(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` itself when it has no tensor-subclass parameters, else a copy with them made plain."""
    names = [name for name, p in model.named_parameters(remove_duplicate=False)
             if _is_subclass(p) and _converted(p)]
    if not names:
        return model
    model = copy.deepcopy(model)
    for name in names:
        owner_name, _, attribute = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        parametrize.register_parametrization(owner, attribute, _parametrization(getattr(owner, attribute)),
                                             unsafe=True)
    return model


def unwrapped_weights(program: ExportedProgram) -> ExportedProgram:
    """``program`` itself when no weight is a tensor subclass, else a copy where each inner tensor the graph reads
    (``export.access_subclass_inner_tensor(weight, name)``) is a weight of its own, ``<weight>.<name>`` (a lifted
    constant). Where the graph's ops take a subclass weight whole, the program traced through the subclass
    (``_flattened_subclasses``)."""
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    targets = {node.name: spec.target for node, spec in zip(placeholders, program.graph_signature.input_specs)
               if is_weight(spec)}
    values = weight_values(program, targets.values())
    wrapped = {name for name, target in targets.items() if _is_subclass(values[target])}
    if not wrapped:
        return program
    if any(user.target != INNER_TENSOR for node in placeholders if node.name in wrapped for user in node.users):
        return _flattened_subclasses(program, {targets[name]: type(values[targets[name]]) for name in wrapped})
    rewrite = WeightRewrite(program)
    for placeholder in [n for n in rewrite.graph.nodes if n.op == "placeholder" and n.name in wrapped]:
        target = targets[placeholder.name]
        for user in list(placeholder.users):
            inner = user.args[1]
            unwrapped = rewrite.add_constant(f"{placeholder.name}_{inner}", f"{target}.{inner}",
                                             getattr(values[target], inner))
            unwrapped.meta = dict(user.meta)
            user.replace_all_uses_with(unwrapped)
            rewrite.graph.erase_node(user)
        rewrite.drop(placeholder)
    return rewrite.program()


def _flattened_subclasses(program: ExportedProgram, subclasses: dict[str, type]) -> ExportedProgram:
    """``program`` with its tensor-subclass weights, which its ops take whole (the subclass's own dispatch runs
    them), made plain: ``run_decompositions`` traces through the subclass (``__tensor_flatten__``), each inner
    tensor a weight of its own. Raises NotImplementedError naming the subclass where the program then returns
    subclass tensors (the outputs would be its inner tensors, not what ``ep.module()`` returns) or the subclass
    does not flatten."""
    names = ", ".join(f"'{target}' ({cls.__module__}.{cls.__name__})" for target, cls in subclasses.items())
    try:
        flattened = _without_preserved_calls(program).run_decompositions({})
    except Exception as error:  # noqa: BLE001  (any failure to trace through it is the subclass's to name)
        raise NotImplementedError(f"tensor-subclass weight(s) {names} cannot be made plain "
                                  f"({type(error).__name__}: {error}); give plain tensors") from error
    user_outputs = [s for s in flattened.graph_signature.output_specs if s.kind.name == "USER_OUTPUT"]
    if len(user_outputs) != flattened.call_spec.out_spec.num_leaves:
        raise NotImplementedError(
            f"tensor-subclass weight(s) {names} make the program return tensors of their subclass, which a "
            "StableHLO function cannot return; return plain tensors (e.g. a subclass method that makes one)")
    return flattened


def _without_preserved_calls(program: ExportedProgram) -> ExportedProgram:
    """A shallow copy of ``program`` whose submodules keep no call signature (``preserve_module_call_signature``,
    which ``run_decompositions`` cannot keep where a submodule takes a subclass weight it flattens): they serve
    ``unflatten`` only, which a conversion never does; ``program`` is left as it is."""
    if all(entry.signature is None for entry in program.module_call_graph if entry.fqn):
        return program
    copied = copy.copy(program)
    copied._module_call_graph = [entry if not entry.fqn else dataclasses.replace(entry, signature=None)
                                 for entry in program.module_call_graph]
    return copied
