"""The 8-device checks (``spmd_checks``), run once in a subprocess whose CPU client has 8 devices: each model
equals eager and the single-device artifact through the call, a bundle and ``to_jax()``, and is really
partitioned: the compiled program's per-device arguments are the shards, and its HLO has the collectives."""
import json
import os
import subprocess
import sys

import pytest

from tests.sharding import spmd_checks


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("spmd") / "report.json"
    subprocess.run([sys.executable, "-m", "tests.sharding.spmd_checks", str(path)], check=True, timeout=300,
                   env=dict(os.environ), capture_output=True)
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", [run.__name__ for run in spmd_checks.CHECKS])
def test_matches_eager_single_device_bundle_and_jax(report, name):
    result = report[name]
    assert result["ok"], result.get("error")
    assert result["nr_devices"] == 8
    assert result["device_argument_bytes"] == result["shard_argument_bytes"]  # each device: its shards only


@pytest.mark.parametrize("name, weight, dim, parts", [
    ("tensor_parallel_mlp", "up.weight", 0, 8), ("tensor_parallel_mlp", "up.bias", 0, 8),
    ("tensor_parallel_mlp", "down.weight", 1, 8),
    ("decoder", "layers.0.self_attn.q_proj.weight", 0, 4), ("decoder", "layers.1.self_attn.o_proj.weight", 1, 4),
    ("decoder", "layers.1.mlp.down_proj.weight", 1, 4),
])
def test_weights_placed_as_shards(report, name, weight, dim, parts):
    shape, shard = report[name]["weight_shapes"][weight], report[name]["weight_shard_shapes"][weight]
    assert shard[dim] * parts == shape[dim] and shard[:dim] + shard[dim + 1:] == shape[:dim] + shape[dim + 1:]


@pytest.mark.parametrize("name", ["tensor_parallel_mlp", "decoder", "marked", "dynamic_batch"])
def test_row_parallel_product_is_all_reduced(report, name):
    result = report[name]
    assert "all-reduce" in result["collectives"]
    assert result["device_argument_bytes"] < result["full_argument_bytes"] / 2


def test_data_parallel_splits_only_the_batch(report):
    result = report["data_parallel"]
    assert result["weight_shard_shapes"]["up.weight"] == result["weight_shapes"]["up.weight"]
    assert result["full_argument_bytes"] - result["device_argument_bytes"] == 8 * 32 * 4 * 7 // 8


def test_exported_records_the_input_shardings(report):
    hlo = report["decoder"]["in_shardings_hlo"]
    assert hlo["input_ids"] == "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    assert hlo["layers.0.self_attn.q_proj.weight"] == "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert hlo["embed.weight"] == "None"
