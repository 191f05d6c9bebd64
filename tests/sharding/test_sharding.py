"""Mesh and shardings at export, on one device: the annotations in the module, the signature, bundles and
``inspect``; the tensor-parallel plan; every mistake raised before anything compiles, naming what is wrong."""
import json

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from torch_stablehlo.exporter import ShardingError, export_to_stablehlo, load_artifact, mark_sharding, tensor_parallel_shardings
from torch_stablehlo.tools.inspection import bundle_report, format_report
from torch_stablehlo.golden.sharded_decoder import SHARDINGS, decoder_example
from torch_stablehlo.runtime import pjrt
from torch_stablehlo.runtime.spmd import MeshError
from tests.sharding.spmd_checks import MLP

MESH = {"data": 2, "model": 4}


@pytest.fixture(scope="module")
def decoder():
    model, args = decoder_example()
    return model, args, export_to_stablehlo(model, args, mesh=MESH, shardings=SHARDINGS)


def test_module_carries_shardy_mesh_and_argument_shardings(decoder):
    text = decoder[2].stablehlo_text
    assert 'sdy.mesh @mesh = <["data"=2, "model"=4]>' in text and "mhlo.num_partitions = 8" in text
    assert '{sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>} loc("input_ids")' in text
    assert '{sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {}]>} loc("layers.0.self_attn.q_proj.weight")' in text
    assert '{sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>} loc("layers.1.mlp.down_proj.weight")' in text


def test_signature_shows_and_keeps_mesh_and_shardings(decoder, tmp_path):
    signature = decoder[2].signature
    text = str(signature)
    assert "mesh: {'data': 2, 'model': 4} (8 devices)" in text
    assert "input_ids: int64[4, 8]  sharded ('data', None)" in text
    assert "layers.0.self_attn.o_proj.weight: float32[64, 64]  sharded (None, 'model')" in text
    path = decoder[2].save(tmp_path / "bundle")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["mesh"] == MESH
    loaded = load_artifact(path)
    assert loaded.signature.mesh == MESH and loaded.signature.main_shardings == signature.main_shardings
    report = format_report(bundle_report(path))
    assert "mesh: {'data': 2, 'model': 4} (8 devices)" in report and "sharded ('model', None)" in report


def test_running_needs_the_mesh_devices_and_says_how_before_compiling(decoder):
    compiled = dict(pjrt.STATS)
    with pytest.raises(MeshError, match=r"needs 8 devices; the 'cpu' client has 1 .*device_count=8"):
        decoder[2](*decoder[1])
    assert pjrt.STATS == compiled


def test_tensor_parallel_plan_translates_to_weight_specs():
    specs = tensor_parallel_shardings({"*.up": ColwiseParallel(), "*.down": RowwiseParallel()}, axis="tp")
    assert dict(specs) == {"*.up.weight": ("tp", None), "*.up.bias": ("tp",), "*.down.weight": (None, "tp")}
    with pytest.raises(ShardingError, match="SequenceParallel"):
        tensor_parallel_shardings({"norm": SequenceParallel()})


def test_plan_given_as_shardings_uses_the_model_axis():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    art = export_to_stablehlo(model, (torch.randn(2, 8),), mesh=MESH,
                              shardings={"0": ColwiseParallel(), "2": RowwiseParallel()})  # "0.bias": absent
    specs = {s.name: s.sharding for s in art.signature.weights}
    assert specs == {"0.weight": (("model",), ()), "2.weight": ((), ("model",)), "2.bias": None}


def test_exported_program_takes_shardings_too():
    program = torch.export.export(MLP(), (torch.randn(8, 32),))
    art = export_to_stablehlo(program, mesh={"model": 4}, shardings={"up.weight": ("model",)})
    assert art.signature.main_shardings == [(("model",), ()), None, None, None, None]
    with pytest.raises(NotImplementedError, match="XlaCallModule runs it on one device"):
        art.save_tf_saved_model("unused")


def test_mark_sharding_is_dropped_on_one_device_and_kept_over_a_mesh():
    model, x = MLP(mark=("data", "model")).eval(), torch.randn(8, 32)
    torch.testing.assert_close(mark_sharding(x, ("data", None)), x)
    single = export_to_stablehlo(model, (x,))
    assert "sdy" not in single.stablehlo_text
    torch.testing.assert_close(single(x), model(x))
    sharded = export_to_stablehlo(model, (x,), mesh=MESH)
    assert 'sdy.sharding_constraint %' in sharded.stablehlo_text and '<@mesh, [{"data"}, {"model"}]>' in sharded.stablehlo_text


def test_dynamic_dims_may_be_split():
    batch = torch.export.Dim("batch", min=2, max=64)
    art = export_to_stablehlo(MLP(), (torch.randn(8, 32),), dynamic_shapes=({0: batch},), mesh=MESH,
                              shardings={"x": ("data", None)})
    assert "tensor<?x32xf32> {sdy.sharding" in art.stablehlo_text


@pytest.mark.parametrize("mesh, shardings, message", [
    (MESH, {"x": ("batch", None)}, r"x: the spec \('batch', None\) names axis 'batch', which the mesh .* lacks; "
                                   r"use one of 'data', 'model'"),
    (MESH, {"up.weight": ("model", None, None)}, r"up.weight: the spec .* has 3 entries but the tensor has 2 dims"),
    ({"model": 3}, {"up.weight": ("model", None)}, r"up.weight: dim 0 has size 64, not divisible by 3 .*'model'"),
    (MESH, {"*.q_proj.weight": ("model", None)}, r"key '\*.q_proj.weight' matches no input or weight; .*up.weight"),
    (MESH, {"x": ("data", "data")}, r"x: the spec .* splits along axis 'data' twice"),
    (MESH, {"*.weight": ("model", None), "up.weight": (None, "model")}, r"up.weight is given two shardings"),
    (None, {"x": ("data", None)}, r"shardings need a device mesh"),
    ({"data": 0}, {}, r"mesh axis 'data': expected a name with a positive int size"),
    (MESH, {"x": "data"}, r"one entry per tensor dim"),
])
def test_mistakes_are_named_before_lowering(mesh, shardings, message):
    with pytest.raises((ShardingError, TypeError), match=message):
        export_to_stablehlo(MLP(), (torch.randn(8, 32),), mesh=mesh, shardings=shardings)


def test_mark_sharding_axes_are_checked_against_the_mesh():
    with pytest.raises(ShardingError, match=r"mark_sharding on gelu: the spec .* names axis 'model', which the mesh"):
        export_to_stablehlo(MLP(mark=("data", "model")), (torch.randn(8, 32),), mesh={"data": 2})
    with pytest.raises(ValueError, match="the spec has 1 entries, the tensor 2 dims"):
        mark_sharding(torch.randn(2, 2), ("data",))
