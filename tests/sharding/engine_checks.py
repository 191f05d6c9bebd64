"""The engine over a device mesh, in one process whose CPU client has ``DEVICES`` devices (run by
test_auto_sharding.py under --full-sweep): ``python -m tests.sharding.engine_checks REPORT.json FOLDER CHECK...``;
``engine_heads``, make test's sample, runs in ``auto_checks``' process.

Each check exports a tiny Llama's engine over a mesh, serves staggered requests (more than its slots) and
compares every request's tokens with transformers' greedy ``generate`` on its prompt alone; it reports what the
compiled generate program holds per device (its cache shapes) and whether the state passed to a call was donated."""
from __future__ import annotations

import json
import re
import sys
import traceback
from pathlib import Path

import jax
import torch

from torch_stablehlo import exporter, load_artifact
from torch_stablehlo.exporter.engine.state import sampling_rows
from torch_stablehlo.exporter.formats.engine_artifact import GENERATE
from torch_stablehlo.serving import Engine

from tests.serving.engine_models import VOCAB, generated, prompts, staggered, tiny

DEVICES = 4
SLOTS, CACHE, MAX_PROMPT = 2, 64, 16
LENGTHS, NEW = (5, 9, 3, 12), (10, 12, 8, 6)  # four requests through two slots
LAYERS = "model.model.layers.*"
# Megatron's split of the attention and the MLP, and the KV cache split over its kv heads (dim 1 of [slots, kv
# heads, length, head dim]) as the keys' and values' products are
HEADS_PLAN = {f"{LAYERS}.self_attn.[qkv]_proj.weight": ("model",), f"{LAYERS}.self_attn.o_proj.weight": (None, "model"),
              f"{LAYERS}.mlp.[gu]*_proj.weight": ("model",), f"{LAYERS}.mlp.down_proj.weight": (None, "model"),
              "state_caches_*": (None, "model")}
# also the slots over "data": every per-slot leaf of the state split by rows
SLOT_LEAVES = ("state_tokens", "state_done", "state_padding", "state_last_column", "state_sampling_*")
SLOTS_AND_HEADS_PLAN = {**HEADS_PLAN, **dict.fromkeys(SLOT_LEAVES, ("data",)), "state_caches_*": ("data", "model")}


def _served(art, model) -> dict:
    """Staggered requests through ``art``'s engine: equal to ``generate`` alone?"""
    asked = prompts(LENGTHS)
    want = [generated(model, prompt, new) for prompt, new in zip(asked, NEW)]
    with Engine(art) as engine:
        got, _ = staggered(engine, list(zip(asked, NEW)))
    return {"equal": got == want, "got": got, "want": want}


def _per_device(art) -> dict:
    """The generate program's cache shapes per device, and whether a call consumed the state it was given."""
    runner = art.runner()
    given = list(runner._state)
    runner.insert(0, [5, 6, 7], 4, sampling_rows(1, VOCAB), runner.prefill([5, 6, 7], sampling_rows(1, VOCAB), 4))
    donated = all(leaf.is_deleted() for leaf in given)
    runner.generate(1)
    hlo = next(e for k, e in runner._executables.items() if k[0] == GENERATE).loaded.hlo_modules()[0].to_string()
    return {"cache_shapes": sorted(set(re.findall(r"f32\[\d+,\d+,64,16\]", hlo))), "donated": donated,
            "state_shards": [len(leaf.sharding.device_set) for leaf in runner._state]}


def _engine(mesh: dict, shardings, folder: Path, serve_loaded: bool = True) -> dict:
    """The engine over ``mesh``: served, what a device holds, and its bundle loaded (and served, with
    ``serve_loaded``)."""
    model = tiny("llama")
    art = exporter.export_engine(model, slots=SLOTS, max_cache_len=CACHE, max_prompt_len=MAX_PROMPT, mesh=mesh,
                                 shardings=shardings)
    loaded = load_artifact(art.save(folder / "engine_bundle"))
    return {"served": _served(art, model), **_per_device(art),
            **({"loaded": _served(loaded, model)} if serve_loaded else {}),
            "plan": {k: list(v) for k, v in art.sharding_plan.items()},
            "loaded_plan": {k: list(v) for k, v in loaded.sharding_plan.items()},
            "loaded_mesh": loaded.mesh, "chosen": art.sharding_plan.chosen}


def engine_heads(folder: Path) -> dict:
    """{"model": 2}: the weights split as Megatron splits them, the KV cache over its two kv heads (the bundle
    loaded, not served: make test's sample)."""
    return _engine({"model": 2}, HEADS_PLAN, folder, serve_loaded=False)


def engine_slots_and_heads(folder: Path) -> dict:
    """{"data": 2, "model": 2}: the slots over "data" too."""
    return _engine({"data": 2, "model": 2}, SLOTS_AND_HEADS_PLAN, folder)


def engine_auto(folder: Path) -> dict:
    """{"model": 2}, shardings="auto": the plan searched on the generate step (the state priced as carried)."""
    return _engine({"model": 2}, "auto", folder)


CHECKS = {check.__name__: check for check in (engine_heads, engine_slots_and_heads, engine_auto)}


def main(report_path: str, folder: str, names: list[str]) -> None:
    report = {}
    for name in names:
        try:
            (Path(folder) / name).mkdir(parents=True, exist_ok=True)
            report[name] = {"ok": True, **CHECKS[name](Path(folder) / name)}
        except Exception:  # noqa: BLE001  (each check reports its own failure)
            report[name] = {"ok": False, "error": traceback.format_exc()}
    Path(report_path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    jax.config.update("jax_num_cpu_devices", DEVICES)  # before the CPU client starts (importing this does not)
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
