"""Searched and FSDP sharding plans. On one device: the FSDP layout, the picture, each bad input raised before
anything compiles. On 8 devices (``auto_checks``, one subprocess): the integer program's known optimum for a
two-layer MLP (colwise then rowwise, one all-reduce), the memory budget, FSDP and auto plans equal to eager
through the call, a bundle and ``to_jax()``, the auto plan the fastest of the candidates timed, a tied weight split
two ways, a tiny Llama's serving engine over {"model": 2} (``engine_checks``); the auto-sharded bundle in a fresh
process, and ``inspect --shardings`` on it."""
import json
import operator
import os
import subprocess
import sys

import pytest
import torch

from torch_stablehlo.exporter import (ShardingError, auto_shardings, export_engine, export_to_stablehlo,
                                      fsdp_shardings)
from torch_stablehlo.exporter.autoshard.choose import HAND_PLANS, TIE
from torch_stablehlo.exporter.autoshard.op_dims import op_dims
from torch_stablehlo.exporter.autoshard.plan import held_slots, megatron_plan
from torch_stablehlo.exporter.autoshard.timing import shallow_program
from torch_stablehlo.exporter.conversion.inplace import InPlaceWrites
from torch_stablehlo.exporter.conversion.pipeline import prepared_program
from torch_stablehlo.exporter.conversion.signature import signature_of
from torch_stablehlo.golden.sharded_decoder import DecoderConfig, decoder_example
from torch_stablehlo.runtime import pjrt
from torch_stablehlo.runtime.device_costs import FILE_VARIABLE
from torch_stablehlo.runtime.spmd import MeshError
from tests.serving.engine_models import tiny
from tests.sharding import auto_checks


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("auto")
    subprocess.run([sys.executable, "-m", "tests.sharding.auto_checks", str(folder / "report.json"), str(folder)],
                   check=True, timeout=600, env=dict(os.environ), capture_output=True)
    return {**json.loads((folder / "report.json").read_text()), "folder": folder}


@pytest.mark.full_sweep_only
def test_a_mixture_of_experts_plan_splits_the_experts_and_equals_eager(tmp_path):
    subprocess.run([sys.executable, "-m", "tests.sharding.auto_checks", str(tmp_path / "report.json"), str(tmp_path),
                    "moe_experts_split"], check=True, timeout=600, env=dict(os.environ), capture_output=True)
    result = _ok(json.loads((tmp_path / "report.json").read_text())["moe_experts_split"])
    experts = {k: v for k, v in result["plan"].items() if ".experts." in k}
    assert len(experts) == 4 and all("model" in str(spec) for spec in experts.values()), experts
    assert result["device_argument_bytes"] < result["full_argument_bytes"] / 2


CACHES = [f"state_caches_{i}" for i in range(4)]


def test_a_decode_steps_cache_is_split_over_heads_where_no_axis_divides_the_batch(report):
    plan = _ok(report["generate_heads_plan"])["plan"]
    assert {name: plan[name] for name in CACHES} == dict.fromkeys(CACHES, [None, "model"])  # [rows, kv heads, ...]
    for layer in (0, 1):  # the keys' and values' products split alike: each device makes its own heads' entries
        assert plan[f"model.model.layers.{layer}.self_attn.k_proj.weight"] == ["model"]
        assert plan[f"model.model.layers.{layer}.self_attn.v_proj.weight"] == ["model"]
    assert plan["state_tokens"] == []


@pytest.mark.full_sweep_only
def test_export_generate_over_a_mesh_is_token_exact_with_generate(tmp_path):
    subprocess.run([sys.executable, "-m", "tests.sharding.auto_checks", str(tmp_path / "report.json"), str(tmp_path),
                    "generate_on_mesh"], check=True, timeout=600, env=dict(os.environ), capture_output=True)
    result = _ok(json.loads((tmp_path / "report.json").read_text())["generate_on_mesh"])
    heads, auto = result["heads"], result["auto"]
    assert heads["equal"] and auto["equal"]
    assert "f32[3,1,64,16]" in heads["cache_shapes"]  # each device holds one of the two kv heads' cache
    assert auto["chosen"] is not None                   # "auto": a searched (and timed) plan


def test_an_engine_over_a_mesh_serves_token_exact_with_its_cache_split_over_heads(report):
    result = _ok(report["engine_heads"])
    assert result["served"]["equal"], result["served"]           # staggered requests, each as generate alone
    assert "f32[2,1,64,16]" in result["cache_shapes"]            # each device: one of the two kv heads' cache
    assert result["donated"] and set(result["state_shards"]) == {2}  # the state on both devices, donated
    plan, loaded = result["plan"], result["loaded_plan"]
    assert result["loaded_mesh"] == {"model": 2} and loaded == plan  # the bundle keeps the plan
    assert {name: plan[name] for name in CACHES} == dict.fromkeys(CACHES, [None, "model"])
    assert plan["model.model.layers.1.mlp.down_proj.weight"] == [None, "model"] and plan["state_tokens"] == []


@pytest.mark.full_sweep_only
def test_engines_over_four_devices_and_an_auto_plan_serve_token_exact(tmp_path):
    names = ["engine_slots_and_heads", "engine_auto"]
    subprocess.run([sys.executable, "-m", "tests.sharding.engine_checks", str(tmp_path / "report.json"),
                    str(tmp_path), *names], check=True, timeout=900, env=dict(os.environ), capture_output=True)
    report = json.loads((tmp_path / "report.json").read_text())
    slots_and_heads, auto = (_ok(report[name]) for name in names)
    for result in (slots_and_heads, auto):
        assert result["served"]["equal"] and result["loaded"]["equal"], (result["served"], result["loaded"])
        assert result["donated"] and all(result["loaded_plan"][k] == v for k, v in result["plan"].items())
    assert "f32[1,1,64,16]" in slots_and_heads["cache_shapes"]  # each device: one slot's row of one kv head
    assert set(slots_and_heads["state_shards"]) == {4}
    assert auto["chosen"] is not None                          # "auto": a searched (and timed) plan


def test_an_engine_with_shardings_but_no_mesh_or_too_large_a_mesh_is_refused_before_compiling():
    model, compiled = tiny("llama"), dict(pjrt.STATS)
    with pytest.raises(ShardingError, match="shardings need a device mesh"):
        export_engine(model, slots=2, max_cache_len=64, shardings={"state_caches_*": (None, "model")})
    with pytest.raises(MeshError, match="needs 4 devices; the 'cpu' client has 1"):
        export_engine(model, slots=2, max_cache_len=64, mesh={"model": 4}, shardings="auto")
    assert pjrt.STATS == compiled


@pytest.fixture(scope="module")
def fsdp_plan():
    model, args = decoder_example()
    return fsdp_shardings(model, args, axis="fsdp", batch_axis="data", mesh={"data": 2, "fsdp": 4})


def _ok(result):
    assert result["ok"], result.get("error")
    return result


def test_search_finds_colwise_then_rowwise_with_one_all_reduce(report):
    result = _ok(report["mlp_megatron"])
    expected = {"up.weight": ["model"], "up.bias": ["model"], "down.weight": [None, "model"], "down.bias": [],
                "x": []}
    assert result["plan"] == expected and result["artifact_plan"] == expected
    assert result["counts"] == {"all-reduce": 1, "all-gather": 0}
    assert result["weight_shard_shapes"]["up.weight"] == [512, 512]  # 2048 rows over 4 devices
    assert result["device_argument_bytes"] == result["shard_argument_bytes"] < result["full_argument_bytes"] / 3


def test_memory_budget_forces_sharding_and_an_unmeetable_one_is_refused(report):
    result = _ok(report["mlp_budget"])
    assert all(spec == [] for spec in result["free"].values())  # collectives dearer than the products: replicated
    assert result["plan_bytes"] <= result["budget"] < result["free_bytes"]
    assert result["device_argument_bytes"] <= result["budget"]  # as compiled, not only as estimated
    assert "need at least 2101248 bytes per device" in result["unmeetable"]


def test_fsdp_plan_runs_equal_to_eager_with_weights_split(report):
    result = _ok(report["fsdp"])
    assert result["plan"]["layers.0.mlp.down_proj.weight"] == [None, "fsdp"]
    assert result["weight_shard_shapes"]["embed.weight"] == [64, 64]  # [256, 64]: the vocab over 4 devices
    assert result["device_argument_bytes"] == result["shard_argument_bytes"] < result["full_argument_bytes"] / 3


def test_auto_plan_equals_eager_and_its_bundle_runs_in_a_fresh_process(report):
    result = _ok(report["decoder_auto"])
    assert result["measured"] == ["cpu/cpu/8/data=2,model=4"]  # the rates were measured and cached
    timings = result["timings"]  # the candidates timed on the mesh; the close ones again; the fastest chosen
    assert {"searched", "data-parallel", "megatron"} <= set(timings) and len(timings) >= 3
    final = result["confirmed"] or timings
    assert result["cost"] == final[result["chosen"]] <= TIE * min(final.values()) and result["cost"] > 0
    assert min(final.values()) == result["cost"] or result["chosen"] in HAND_PLANS  # a hand plan wins a tie
    header = " ".join(result["plan_text"].split())  # the header wraps at the picture's width
    assert f"plans timed ({result['chosen']}: " in header and "d7" in header
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-m", "tests.sharding.auto_checks", "--load", str(report["folder"])],
                         check=True, timeout=300, env=env, capture_output=True, text=True)
    assert "fresh process: equal" in out.stdout
    picture = subprocess.run([sys.executable, "-m", "torch_stablehlo", "inspect", str(report["folder"] / "bundle"),
                              "--shardings"], check=True, timeout=120, env=env, capture_output=True, text=True)
    assert "lm_head.weight  [256, 64]" in picture.stdout and "d7" in picture.stdout


def test_a_tied_weight_split_two_ways_runs_equal_to_eager(report):
    result = _ok(report["tied_split_apart"])
    assert result["weight_shard_shapes"] == {"embed.weight": [8, 32], "head.weight": [64, 32]}  # two copies


def test_fsdp_splits_each_weights_largest_dim_and_the_batch(fsdp_plan):
    assert fsdp_plan["embed.weight"] == ("fsdp",)                      # [256, 64]
    assert fsdp_plan["layers.1.mlp.down_proj.weight"] == (None, "fsdp")  # [64, 128]
    assert fsdp_plan["layers.0.input_norm.weight"] == ("fsdp",)
    assert fsdp_plan["input_ids"] == ("data",)
    assert fsdp_plan.device_bytes("embed.weight") == 256 * 64 * 4 // 4


def test_the_megatron_candidate_is_colwise_then_rowwise_in_each_layer():
    model, args = decoder_example()
    program, signature = prepared_program(model, args)
    plan = megatron_plan(program, signature, {"data": 2, "model": 4})
    for layer in (0, 1):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            assert plan[f"layers.{layer}.{name}.weight"] == ("model",)          # [out, in]: colwise
        for name in ("self_attn.o_proj", "mlp.down_proj"):                        # back to the residual: rowwise
            assert plan[f"layers.{layer}.{name}.weight"] == (None, "model")
        assert plan[f"layers.{layer}.input_norm.weight"] == ()
    assert plan["embed.weight"] == plan["lm_head.weight"] == () and plan["input_ids"] == ("data",)


def test_picture_shows_each_devices_part_and_bytes(fsdp_plan):
    text = str(fsdp_plan)
    assert "embed.weight  [256, 64]  (fsdp, None)  16384 B per device" in text
    assert "[0:64, :]" in text and "[192:256, :]" in text        # the vocab's four quarters
    assert "input_ids  [4, 8]  (data, None)  128 B per device" in text and "[2:4, :]" in text
    assert "\x1b" not in text                                     # plain text, no terminal codes


def test_auto_without_a_mesh_or_an_unknown_word_is_refused():
    model, args = auto_checks._mlp()
    with pytest.raises(ShardingError, match="needs a device mesh"):
        export_to_stablehlo(model, args, shardings="auto")
    with pytest.raises(ShardingError, match="give 'auto'"):
        export_to_stablehlo(model, args, mesh={"model": 1}, shardings="best")


def test_mesh_larger_than_the_devices_is_refused_before_compiling():
    model, args = auto_checks._mlp()
    compiled = dict(pjrt.STATS)
    with pytest.raises(MeshError, match="needs 4 devices; the 'cpu' client has 1"):
        auto_shardings(model, args, mesh={"model": 4})
    with pytest.raises(MeshError, match="needs 4 devices"):
        export_to_stablehlo(model, args, mesh={"model": 4}, shardings="auto")
    assert pjrt.STATS == compiled


def test_unmeetable_or_bad_budget_is_refused(tmp_path, monkeypatch):
    mesh = {"model": 1}
    monkeypatch.setenv(FILE_VARIABLE, auto_checks.stated_costs(tmp_path, "one", mesh, latency=1e-5))
    model, args = auto_checks._mlp()
    with pytest.raises(ShardingError, match=r"max_bytes_per_device=1000: .* at least 8404992 bytes per device"):
        auto_shardings(model, args, mesh=mesh, max_bytes_per_device=1000)
    with pytest.raises(ShardingError, match="positive number of bytes"):
        auto_shardings(model, args, mesh=mesh, max_bytes_per_device=-5)


def test_plans_are_timed_on_a_shallow_copy_that_keeps_one_layer_of_a_stack():
    model, args = decoder_example(DecoderConfig(layers=3))
    program, signature = prepared_program(model, args)
    shallow = shallow_program(program, held_slots(signature, program))
    weights = [s.target for s in shallow.graph_signature.input_specs if s.target]
    assert "layers.0.mlp.up_proj.weight" in weights
    assert not any(w.startswith(("layers.1.", "layers.2.")) for w in weights)
    model.layers = model.layers[:1]  # eager with the first layer alone: what the copy computes
    torch.testing.assert_close(shallow.module()(*args), model(*args), atol=1e-5, rtol=1e-5)
    assert shallow_program(shallow, held_slots(signature_of(shallow, InPlaceWrites.of_program(shallow).kinds), shallow)) is shallow  # nothing repeats now


class _Blocks(torch.nn.Module):
    """A stack whose last layer's result is the program's output (as BERT's encoder is)."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def test_the_shallow_copy_returns_the_kept_layer_where_the_stack_returned_its_last():
    torch.manual_seed(0)
    model, args = _Blocks().eval(), (torch.randn(4, 8),)
    program, signature = prepared_program(model, args)
    shallow = shallow_program(program, held_slots(signature, program))
    assert len(shallow.graph_signature.input_specs) == 3  # layers.0's weight and bias, x
    torch.testing.assert_close(shallow.module()(*args), torch.tanh(model.layers[0](*args)))


class _NormedHalves(torch.nn.Module):
    """layer_norm, dropout, a chunk's halves: ops that took and gave whole tensors before they had einsum rules."""

    def __init__(self):
        super().__init__()
        self.norm, self.up = torch.nn.LayerNorm(8), torch.nn.Linear(8, 16)

    def forward(self, x):
        gate, up = self.up(torch.nn.functional.dropout(self.norm(x), 0.1, training=False)).chunk(2, dim=-1)
        return gate * up


@pytest.mark.full_sweep_only
def test_layer_norm_and_a_chunks_pieces_keep_their_other_dims_splittable():
    program, _ = prepared_program(_NormedHalves().eval(), (torch.randn(4, 3, 8),))
    nodes = {str(n.target): n for n in program.graph.nodes if n.op == "call_function"}
    norm = op_dims(nodes["aten.layer_norm.default"])
    assert [label in norm.fixed for label in norm.result] == [False, False, True]  # the normalized dim whole
    assert [labels for _, labels in norm.operands[1:]] == [norm.result[-1:]] * 2  # its weight and bias
    piece = op_dims(next(n for n in program.graph.nodes if n.target is operator.getitem))
    (source, labels), = piece.operands
    assert source.target is torch.ops.aten.linear.default
    assert [label in piece.fixed for label in labels] == [False, False, True]  # the rows split, the cut dim whole
    assert piece.result[:2] == labels[:2]
