"""Calls and sharding edges: keyword calls as eager takes them, a sparse input is an InputError, a one-device mesh
runs, a wrong spec type is a ShardingError, and a dynamic dim split over a mesh axis that does not divide the
call's size is a DimensionError before anything runs (sizes it divides run correctly, also from a bundle)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.export import Dim

from torch_stablehlo.exporter import InputError, ShardingError, export_to_stablehlo, load_artifact
from torch_stablehlo.exporter.errors import DimensionError

ROOT = Path(__file__).parents[2]
TOLERANCE = dict(rtol=1e-5, atol=1e-5)  # f32 matmuls of 8 terms


class Gather(torch.nn.Module):
    def forward(self, x, idx, *, bias):
        return x[idx] * 2 + bias


def test_positional_parameters_may_be_named_as_eager_takes_them(tmp_path):
    x, idx, bias = torch.randn(5, 3), torch.tensor([0, 2, 4]), torch.randn(3)
    model = Gather()
    artifact = export_to_stablehlo(model, (x, idx), {"bias": bias})
    loaded = load_artifact(artifact.save(tmp_path / "gather"))
    for art in (artifact, loaded):
        torch.testing.assert_close(art(x=x, idx=idx, bias=bias), model(x=x, idx=idx, bias=bias))
        torch.testing.assert_close(art(x, idx=idx, bias=bias), model(x, idx=idx, bias=bias))
        with pytest.raises(InputError, match=r"expected 2 positional input\(s\), got 1"):
            art(x, bias=bias)  # idx given neither way
        with pytest.raises(InputError, match=r"unexpected \['scale'\]"):
            art(x, idx, bias=bias, scale=2)


def test_a_sparse_input_is_an_input_error():
    model = torch.nn.Linear(8, 4).eval()
    artifact = export_to_stablehlo(model, (torch.randn(3, 8),))
    with pytest.raises(InputError, match="input 'input': expected a dense tensor, got a sparse_coo one"):
        artifact(torch.randn(3, 8).to_sparse())


@pytest.mark.parametrize("spec", [("data", 1), 0, "data"])
def test_a_spec_of_the_wrong_type_is_a_sharding_error(spec):
    with pytest.raises(ShardingError, match=r"shardings\['input'\]: .*sharding spec"):
        export_to_stablehlo(torch.nn.Linear(8, 4), (torch.randn(4, 8),), mesh={"data": 2}, shardings={"input": spec})


def test_a_one_device_mesh_runs(tmp_path):
    model, x = torch.nn.Linear(8, 4).eval(), torch.randn(4, 8)
    artifact = export_to_stablehlo(model, (x,), mesh={"data": 1}, shardings={"input": ("data", None)})
    torch.testing.assert_close(artifact(x), model(x), **TOLERANCE)
    torch.testing.assert_close(load_artifact(artifact.save(tmp_path / "one"))(x), model(x), **TOLERANCE)


def _split_batch():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).eval()
    artifact = export_to_stablehlo(model, (torch.randn(4, 8),), dynamic_shapes=({0: Dim("b", min=2, max=16)},),
                                   mesh={"data": 2}, shardings={"input": ("data", None)})
    return model, artifact


def test_a_split_dynamic_dim_the_axis_does_not_divide_is_refused_before_running(tmp_path):
    _, artifact = _split_batch()
    for art in (artifact, load_artifact(artifact.save(tmp_path / "split"))):
        with pytest.raises(DimensionError, match=r"input 'input' dim 0 is 3, but it is split over the mesh axes "
                                                 r"'data' \(2 devices\): give a multiple of 2"):
            art(torch.randn(3, 8))  # refused before compiling: this process has one device


SPLIT_RUNS = """
import sys
import torch
from torch_stablehlo.exporter import load_artifact
from tests.security.test_calls import TOLERANCE, _split_batch
model, artifact = _split_batch()
loaded = load_artifact(artifact.save(sys.argv[1]))
for batch in (2, 4, 6, 16):
    x = torch.randn(batch, 8)
    torch.testing.assert_close(artifact(x), model(x), **TOLERANCE)
    torch.testing.assert_close(loaded(x), model(x), **TOLERANCE)
print("ok")
"""


def test_a_split_dynamic_dim_runs_at_sizes_the_axis_divides(tmp_path):
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"}
    done = subprocess.run([sys.executable, "-c", SPLIT_RUNS, str(tmp_path / "split")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
