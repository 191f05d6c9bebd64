"""A bundle run on ``.npz`` files: tensor inputs by signature name in, outputs by signature name out."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from torch_stablehlo.stablehlo_ir.dtypes import to_numpy, to_torch

from torch_stablehlo.exporter.formats.artifact import load_artifact


def run_npz(bundle: str | os.PathLike, inputs: str | os.PathLike, output: str | os.PathLike) -> dict[str, np.ndarray]:
    """Load ``bundle``, run it on the arrays in ``inputs`` and write its outputs to ``output``; returns them."""
    artifact = load_artifact(bundle)
    with np.load(inputs) as stored:
        arrays = {key: stored[key] for key in stored.files}
    names = [slot.tensor.name for slot in artifact.signature.user_inputs if slot.tensor is not None]
    missing, unexpected = [n for n in names if n not in arrays], sorted(set(arrays) - set(names))
    if missing or unexpected:
        raise ValueError(f"{inputs}: the bundle takes inputs {names}"
                         + (f"; missing {missing}" if missing else "")
                         + (f"; unexpected {unexpected}" if unexpected else ""))
    outputs = artifact.run_flat([to_torch(arrays[name]) for name in names])
    named = {slot.tensor.name: to_numpy(torch.as_tensor(value))  # a Python scalar as a 0-d array; constants left out
             for slot, value in zip(artifact.signature.user_outputs, outputs) if slot.tensor is not None}
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    np.savez(output, **named)
    return named
