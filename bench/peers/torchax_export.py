"""Run with the torchax side venv's Python (``../shared/peers/torchax_venv.sh``), never ours: exports a saved
``ExportedProgram`` with torchax and writes what our process needs to run torchax's StableHLO on its own
PJRT client: ``torchax.mlir`` (the StableHLO module of the ``jax.export``-ed function, whose ``@main`` takes the
state arguments then the inputs it uses) and ``torchax_weights.npz`` (the state arguments it uses, in order: ``w0``,
``w1``, ...; and ``inputs_kept``, the positions of the user inputs it uses: jax drops unused arguments).

    PEER_PYTHON bench/peers/torchax_export.py PROGRAM.pt2 OUT_DIR
"""
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torchax.export
from torch.fx.passes.shape_prop import _extract_tensor_metadata


def main(program_path: str, out: str) -> None:
    program = torch.export.load(program_path)
    for node in program.graph.nodes:  # torchax reads placeholder shapes from tensor_meta, which load leaves out
        if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor):
            node.meta.setdefault("tensor_meta", _extract_tensor_metadata(node.meta["val"]))
    start = time.perf_counter()
    weights, exported = torchax.export.exported_program_to_stablehlo(program)
    seconds = time.perf_counter() - start
    Path(out, "torchax.mlir").write_text(exported.mlir_module())
    kept = sorted(exported.module_kept_var_idx)
    used = [np.asarray(weights[i]) for i in kept if i < len(weights)]
    np.savez(Path(out, "torchax_weights.npz"), inputs_kept=np.array([i - len(weights) for i in kept if i >= len(weights)]),
             **{f"w{i}": w for i, w in enumerate(used)})
    print(f"torchax {torchax.__version__}: exported in {seconds:.2f} s, {len(weights)} state arguments")


if __name__ == "__main__":
    main(*sys.argv[1:])
