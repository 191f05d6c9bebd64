"""One of two processes running a sharded bundle under ``jax.distributed`` (4 CPU devices each, gloo
collectives): ``python -m tests.sharding.multiprocess_worker BUNDLE PORT PROCESS_ID INPUTS.npy OUT.npz``.
It loads only the weight shards its devices hold and writes the output and the bytes of weights it read."""
from __future__ import annotations

import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_num_cpu_devices", 4)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from torch_stablehlo.exporter import load_artifact
from torch_stablehlo.exporter.formats import bundle  # noqa: E402


def main(path: str, port: str, process_id: str, inputs: str, out: str) -> None:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=int(process_id), initialization_timeout=60)
    read = []
    original = bundle.SliceReader.__getitem__

    def counted(self, index):
        part = original(self, index)
        read.append(part.nbytes)
        return part

    bundle.SliceReader.__getitem__ = counted
    artifact = load_artifact(path, local_shards=True)
    output = artifact(torch.from_numpy(np.load(inputs)))
    np.savez(out, output=output.numpy(), read_bytes=sum(read), devices=len(jax.local_devices()),
             global_devices=jax.device_count())
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
