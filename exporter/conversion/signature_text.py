"""A calling convention as text for a terminal (``str(signature)``, what ``torch-stablehlo inspect`` prints): the
mesh and platforms, the user inputs and symbolic dims, the weights (the sharded ones named), the state, the outputs.
Every line goes through ``printable``: a loaded bundle's names and values cannot move the cursor or hide a line."""
from __future__ import annotations

from typing import TYPE_CHECKING

from torch_stablehlo.exported_program import INPUT_UPDATE
from torch_stablehlo.stablehlo_ir.shardy import num_devices, spec_text

from ..terminal import printable

if TYPE_CHECKING:
    from .signature import InputSlot, Signature


def signature_text(signature: Signature) -> str:
    lines = [f"mesh: {signature.mesh} ({num_devices(signature.mesh)} devices)"] if signature.mesh else []
    if signature.takes_platform_index:
        lines.append(f"platforms: {', '.join(signature.platforms)} (@main takes the platform index first)")
    lines.append("inputs:")
    lines += [f"  {s.tensor.name}: {s.scalar} {s.value}" if s.scalar else
              f"  {s.tensor.name}: {s.tensor.dtype}{list(s.tensor.shape)}{_sharding_note(s)}"
              for s in signature.user_inputs if s.tensor]
    lines += [f"  {name} in [{low}, {'inf' if high is None else high}]" for name, (low, high) in signature.dims.items()]
    weights = signature.weights
    sharded = [s for s in weights if s.sharding is not None]
    lines.append(f"weights: {len(weights)} tensors" + (
        f" ({len(sharded)} sharded; the others as XLA's propagation decides)" if signature.mesh else ""))
    lines += [f"  {s.name}: {s.tensor.dtype}{list(s.tensor.shape)}{_sharding_note(s)}" for s in sharded]
    if signature.state:
        lines.append(f"state: {len(signature.state)} tensors, carried from call to call")
        lines += [f"  {s.name}: {s.tensor.dtype}{list(s.tensor.shape)}" for s in signature.state]
    lines.append("outputs:")
    lines += [f"  {s.tensor.name}: {s.scalar or s.tensor.dtype}{'' if s.scalar else list(s.tensor.shape)}"
              if s.tensor else f"  constant: {s.value!r}" for s in signature.user_outputs]
    lines += [f"  updates input {s.target}" for s in signature.outputs if s.kind == INPUT_UPDATE]
    return "\n".join(printable(line) for line in lines)  # names and values may come from a bundle


def _sharding_note(slot: InputSlot) -> str:
    return f"  sharded {spec_text(slot.sharding)}" if slot.sharding is not None else ""
