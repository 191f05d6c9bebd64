"""Every 8-device check, in one process that starts its CPU client with 8 devices (run by test_spmd.py):
``python -m tests.sharding.spmd_checks REPORT.json``. Each check compares the sharded artifact with eager
and with the single-device artifact, through the artifact's call, a bundle round trip and ``to_jax()``
(the ``Exported`` serialized and read back too), and records the partitioning proof: per-device argument
bytes of the compiled program against the whole arguments', and the collectives in its optimized HLO."""
from __future__ import annotations

import json
import re
import sys
import tempfile
import traceback

import jax
import numpy as np
import torch
from jax import export as jax_export
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from torch_stablehlo.exporter import export_to_stablehlo, load_artifact, mark_sharding
from torch_stablehlo.golden.sharded_decoder import SHARDINGS, decoder_example

TOLERANCE = dict(atol=2e-5, rtol=2e-5)
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


class MLP(torch.nn.Module):
    def __init__(self, width: int = 32, hidden: int = 64, mark: tuple | None = None):
        super().__init__()
        self.up, self.down, self.mark = torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, width), mark

    def forward(self, x):
        h = torch.nn.functional.gelu(self.up(x))
        return self.down(mark_sharding(h, self.mark) if self.mark else h)


def _example(**kwargs):
    torch.manual_seed(0)
    return MLP(**kwargs).eval(), (torch.randn(8, 32),)


def check(model, args, *, mesh, shardings=None, dynamic_shapes=None, calls=None) -> dict:
    """The sharded artifact against eager and the single-device artifact, by every path; its figures."""
    expected = [model(*a) for a in calls or [args]]
    single = export_to_stablehlo(model, args, dynamic_shapes=dynamic_shapes)
    art = export_to_stablehlo(model, args, mesh=mesh, shardings=shardings, dynamic_shapes=dynamic_shapes)
    with tempfile.TemporaryDirectory() as folder:
        loaded = load_artifact(art.save(f"{folder}/bundle"))
        jax_model = art.to_jax()
        restored = jax_export.deserialize(jax_model.exported.serialize())
        for call_args, want in zip(calls or [args], expected):
            torch.testing.assert_close(art(*call_args), want, **TOLERANCE)
            torch.testing.assert_close(art(*call_args), single(*call_args), **TOLERANCE)
            torch.testing.assert_close(loaded(*call_args), want, **TOLERANCE)
            torch.testing.assert_close(torch.from_numpy(np.array(jax_model(*[a.numpy() for a in call_args]))),
                                       want, **TOLERANCE)
            with jax.enable_x64(True):  # int64 token ids stay int64
                placed = jax.device_put(tuple(a.numpy() for a in call_args), jax_model._input_layouts(call_args, {})[0])
                (out,) = jax.jit(restored.call)(*jax_model.weights, *placed)
            torch.testing.assert_close(torch.from_numpy(np.array(out)), want, **TOLERANCE)
    return _proof(art, jax_model, [*art.weights.values(), *call_args])


def _proof(art, jax_model, arguments) -> dict:
    """Per-device argument bytes of the compiled program (its last shape) against the whole arguments' and the
    shards of its layouts; the shard shape of each weight as placed; the collectives in the optimized HLO."""
    executable = art._executables[max(art._executables)]
    hlo = executable.loaded.hlo_modules()[0].to_string()
    sizes = [(a.shape, a.element_size()) for a in arguments]
    full = sum(int(np.prod(shape)) * size for shape, size in sizes)
    shard = sum(int(np.prod(layout.shard_shape(tuple(shape)))) * size
                for (shape, size), layout in zip(sizes, executable.layouts))
    placed = {name: list(array.addressable_shards[0].data.shape) for name, array in art._device_weights.items()}
    hlo_sharding = {s.name: str(h) for s, h in zip(art.signature.main_inputs, jax_model.exported.in_shardings_hlo)}
    return {"device_argument_bytes": executable.loaded.get_compiled_memory_stats().argument_size_in_bytes,
            "full_argument_bytes": full, "shard_argument_bytes": shard, "weight_shard_shapes": placed,
            "weight_shapes": {s.name: list(s.tensor.shape) for s in art.signature.weights},
            "shardings": {s.name: s.sharding for s in art.signature.main_inputs if s.sharding},
            "collectives": sorted({c for c in COLLECTIVES if re.search(rf"\b{c}(-start)?\(", hlo)}),
            "nr_devices": jax_model.exported.nr_devices, "in_shardings_hlo": hlo_sharding}


def data_parallel() -> dict:
    model, args = _example()
    return check(model, args, mesh={"data": 8}, shardings={"x": ("data", None)})


def tensor_parallel_mlp() -> dict:
    model, args = _example()
    return check(model, args, mesh={"model": 8}, shardings={"up": ColwiseParallel(), "down": RowwiseParallel()})


def decoder() -> dict:
    model, args = decoder_example()
    return check(model, args, mesh={"data": 2, "model": 4}, shardings=SHARDINGS)


def marked() -> dict:
    model, args = _example(mark=("data", "model"))
    return check(model, args, mesh={"data": 2, "model": 4})


def dynamic_batch() -> dict:
    model, args = _example()
    batch = torch.export.Dim("batch", min=2, max=64)
    calls = [(torch.randn(n, 32),) for n in (8, 16)]
    return check(model, args, mesh={"data": 2, "model": 4}, dynamic_shapes=({0: batch},), calls=calls,
                 shardings={"x": ("data", None), "up.weight": ("model", None), "down.weight": (None, "model")})


CHECKS = [data_parallel, tensor_parallel_mlp, decoder, marked, dynamic_batch]


def main(report_path: str) -> None:
    report = {}
    for run in CHECKS:
        try:
            report[run.__name__] = {"ok": True, **run()}
        except Exception:  # noqa: BLE001  (each check reports its own failure)
            report[run.__name__] = {"ok": False, "error": traceback.format_exc()}
    with open(report_path, "w") as handle:
        json.dump(report, handle, indent=1)


if __name__ == "__main__":
    jax.config.update("jax_num_cpu_devices", 8)  # before the CPU client starts (importing this module does not)
    main(sys.argv[1])
