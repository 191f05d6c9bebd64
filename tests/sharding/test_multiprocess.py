"""The same sharded bundle across 2 processes on this machine (``jax.distributed``, 4 CPU devices each,
gloo collectives, localhost only): each process reads only the weight shards its devices hold, and both
return what one process computes."""
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.golden.sharded_decoder import SHARDINGS, decoder_example

MESH = {"model": 4, "data": 2}  # process 0 has devices 0-3: model shards 0 and 1 of each split weight


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _held_bytes(artifact) -> int:
    """The weight bytes one process's devices hold: half of each weight split over ``model``."""
    return sum(t.numel() * t.element_size() // (2 if slot.sharding and ("model",) in slot.sharding else 1)
               for slot, t in ((s, artifact.weights[s.target]) for s in artifact.signature.weights))


def test_two_processes_match_one(tmp_path):
    model, (input_ids,) = decoder_example()
    artifact = export_to_stablehlo(model, (input_ids,), mesh=MESH, shardings=SHARDINGS)
    bundle = artifact.save(tmp_path / "bundle")
    np.save(tmp_path / "input_ids.npy", input_ids.numpy())
    expected = export_to_stablehlo(model, (input_ids,))(input_ids)
    port = _free_port()
    env = dict(os.environ, TORCH_STABLEHLO_CACHE_DIR="off")
    workers = [subprocess.Popen([sys.executable, "-m", "tests.sharding.multiprocess_worker", str(bundle), str(port),
                                 str(i), str(tmp_path / "input_ids.npy"), str(tmp_path / f"out{i}.npz")],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(2)]
    try:
        errors = [worker.communicate(timeout=240)[1] for worker in workers]
    except subprocess.TimeoutExpired:
        for worker in workers:
            worker.kill()
        pytest.fail("a worker hung; their stderr:\n" + "\n".join(w.communicate()[1].decode()[-2000:] for w in workers))
    for i, worker in enumerate(workers):
        assert worker.returncode == 0, errors[i].decode()[-3000:]
        result = np.load(tmp_path / f"out{i}.npz")
        assert (int(result["devices"]), int(result["global_devices"])) == (4, 8)
        torch.testing.assert_close(torch.from_numpy(result["output"]), expected, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(torch.from_numpy(result["output"]), model(input_ids), atol=2e-5, rtol=2e-5)
        assert int(result["read_bytes"]) == _held_bytes(artifact) < sum(t.nbytes for t in artifact.weights.values())
