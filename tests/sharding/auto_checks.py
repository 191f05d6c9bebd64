"""The 8-device checks of searched and FSDP plans, in one process whose CPU client has 8 devices (run by
test_auto_sharding.py): ``python -m tests.sharding.auto_checks REPORT.json FOLDER``; ``--load FOLDER`` runs the
auto-sharded bundle saved there in a fresh process against the eager outputs saved beside it.

Most checks price plans with stated rates (a costs file written here, the form ``runtime.device_costs`` caches),
so the plan that must win is known; ``decoder_auto`` measures the devices' rates as a user's export does."""
from __future__ import annotations

import json
import os
import re
import sys
import traceback
from pathlib import Path

import jax
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from torch_stablehlo.exporter import (ShardingError, auto_shardings, export_to_stablehlo, fsdp_shardings,
                                      load_artifact)
from torch_stablehlo.exporter.generate import export_generate
from torch_stablehlo.exporter.generate.generation_settings import resolve_settings
from torch_stablehlo.exporter.generate.loop_steps import Decode, LoopState, Prompt, cache_shapes
from torch_stablehlo.golden.sharded_decoder import decoder_example
from torch_stablehlo.runtime.device_costs import FILE_VARIABLE, costs_key

from tests.sharding.engine_checks import engine_heads
from tests.sharding.spmd_checks import TOLERANCE, check
from tests.support import left_padded_prompts


class MLP(torch.nn.Module):
    def __init__(self, width: int = 512, hidden: int = 2048):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def _mlp():
    torch.manual_seed(0)
    return MLP().eval(), (torch.randn(3, 512),)  # 3 rows: the batch cannot be split over 4 devices


def stated_costs(folder: Path, name: str, mesh: dict, latency: float) -> str:
    """A costs file pricing plans on ``mesh`` at 10 Gflop/s, 10 GB/s and collectives of ``latency`` s + 1 ns per
    byte (for ``$TORCH_STABLEHLO_DEVICE_COSTS``)."""
    line = {"latency": latency, "per_byte": 1e-9}
    costs = {"flops": 1e10, "memory": 1e10, "all_reduce": {a: line for a in mesh}, "all_gather": {a: line for a in mesh}}
    path = folder / f"{name}.json"
    path.write_text(json.dumps({costs_key(mesh): costs}))
    return str(path)


def _collective_counts(art) -> dict[str, int]:
    hlo = art._executables[max(art._executables)].loaded.hlo_modules()[0].to_string()
    return {name: len(re.findall(rf"= \S+ {name}(-start)?\(", hlo)) for name in ("all-reduce", "all-gather")}


def mlp_megatron(folder: Path) -> dict:
    """Cheap collectives, products worth splitting: colwise up, rowwise down, one all-reduce."""
    mesh = {"model": 4}
    os.environ[FILE_VARIABLE] = stated_costs(folder, "cheap", mesh, latency=2e-5)
    model, args = _mlp()
    plan = auto_shardings(model, args, mesh=mesh, timed=False)  # the integer program's optimum alone
    proof = check(model, args, mesh=mesh, shardings=plan)
    art = export_to_stablehlo(model, args, mesh=mesh, shardings=plan)
    art(*args)
    return {"plan": {k: list(v) for k, v in plan.items()}, "cost": plan.cost, "counts": _collective_counts(art),
            "artifact_plan": {k: list(v) for k, v in art.sharding_plan.items()}, **proof}


def mlp_budget(folder: Path) -> dict:
    """Collectives so dear that replicated wins, until a budget of 40% of the replicated bytes forbids it."""
    mesh = {"model": 4}
    os.environ[FILE_VARIABLE] = stated_costs(folder, "dear", mesh, latency=1.0)
    model, args = _mlp()
    free = auto_shardings(model, args, mesh=mesh, timed=False)
    budget = int(0.4 * free.total_device_bytes)
    plan = auto_shardings(model, args, mesh=mesh, max_bytes_per_device=budget, timed=False)
    proof = check(model, args, mesh=mesh, shardings=plan)
    try:
        auto_shardings(model, args, mesh=mesh, max_bytes_per_device=free.total_device_bytes // 10)
        unmeetable = None
    except ShardingError as error:
        unmeetable = str(error)
    return {"free": {k: list(v) for k, v in free.items()}, "free_bytes": free.total_device_bytes, "budget": budget,
            "plan_bytes": plan.total_device_bytes, "unmeetable": unmeetable, **proof}


def fsdp(folder: Path) -> dict:
    mesh = {"data": 2, "fsdp": 4}
    model, args = decoder_example()
    plan = fsdp_shardings(model, args, axis="fsdp", batch_axis="data", mesh=mesh)
    return {"plan": {k: list(v) for k, v in plan.items()}, "plan_bytes": plan.total_device_bytes,
            **check(model, args, mesh=mesh, shardings=plan)}


def decoder_auto(folder: Path) -> dict:
    """Rates measured here (written to a fresh costs file); the bundle and eager outputs kept for ``--load``."""
    os.environ[FILE_VARIABLE] = str(folder / "measured.json")
    mesh = {"data": 2, "model": 4}
    model, args = decoder_example()
    art = export_to_stablehlo(model, args, mesh=mesh, shardings="auto")
    # equal to eager here, its bundle in a fresh process (--load); to_jax() of a searched plan: mlp_megatron's check
    torch.testing.assert_close(art(*args), model(*args), **TOLERANCE)
    art.save(folder / "bundle")
    np.save(folder / "input_ids.npy", args[0].numpy())
    np.save(folder / "expected.npy", model(*args).detach().numpy())
    measured = json.loads((folder / "measured.json").read_text())
    plan = art.sharding_plan
    return {"plan_text": str(plan), "measured": list(measured), "timings": plan.timings, "confirmed": plan.confirmed,
            "chosen": plan.chosen, "cost": plan.cost}


class TiedHead(torch.nn.Module):
    """An embedding whose weight the output head shares (as GPT-2's lm_head shares wte's)."""

    def __init__(self, vocab: int = 64, width: int = 32):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(vocab, width), torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids)))


def tied_split_apart(folder: Path) -> dict:
    """The tied weight split over the mesh as the embedding, whole as the head: the program takes it in two
    layouts, so the runtime places two copies (one shared copy gave PJRT an argument of the wrong size)."""
    torch.manual_seed(0)
    model, args = TiedHead().eval(), (torch.randint(0, 64, (8, 4)),)
    plan = {"embed.weight": (("data", "model"),), "head.weight": (), "ids": ("data",)}
    return check(model, args, mesh={"data": 2, "model": 4}, shardings=plan)


def _mixtral():
    import transformers  # the zoo's dependency, imported where this check needs it
    torch.manual_seed(0)
    config = transformers.MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, num_local_experts=4,
                                        num_experts_per_tok=2, max_position_embeddings=32)
    model = transformers.MixtralForCausalLM(config).eval()
    return _LogitsOf(model), (torch.randint(0, 128, (4, 8)),)


class _LogitsOf(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def moe_experts_split(folder: Path) -> dict:
    """A mixture-of-experts decoder (transformers' Mixtral, its experts' products one grouped op) on cheap
    collectives: the experts' weights are split (the grouped product read as an einsum over experts, inputs and
    outputs), and the plan runs equal to eager."""
    mesh = {"data": 2, "model": 4}
    os.environ[FILE_VARIABLE] = stated_costs(folder, "cheap_moe", mesh, latency=2e-6)
    model, args = _mixtral()
    plan = auto_shardings(model, args, mesh=mesh, timed=False)
    proof = check(model, args, mesh=mesh, shardings=plan)
    return {"plan": {k: list(v) for k, v in plan.items()}, **proof}


def _tiny_llama_decode():
    """A tiny Llama, three left-padded prompts (3 rows: no mesh axis of 2 splits the batch), and its generate
    loop's decode step with the example it is traced with."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                         max_position_embeddings=256)).eval()
    ids, mask = left_padded_prompts((7, 5, 3), 128)
    settings = resolve_settings(model.generation_config, ids.shape[1], 128, max_new_tokens=GENERATED,
                                max_cache_len=None, eos_token_id=None, pad_token_id=None, do_sample=False,
                                temperature=None, top_k=None, top_p=None)
    size = settings.max_cache_len
    example = (LoopState.example(3, size, cache_shapes(model, 3, size), model.dtype), Prompt.example(3, size))
    return model, (ids, mask), Decode(model, settings), example


GENERATED = 8


def _heads_plan(folder: Path, mesh: dict):
    """The decode step's plan on cheap collectives, its cache priced as carried from step to step."""
    os.environ[FILE_VARIABLE] = stated_costs(folder, "cheap_decode", mesh, latency=2e-6)
    model, prompts, step, example = _tiny_llama_decode()
    plan = auto_shardings(step, example, mesh=mesh, timed=False,
                          loop_carried=len(torch.utils._pytree.tree_leaves(example[0])))
    return model, prompts, plan


def generate_heads_plan(folder: Path) -> dict:
    """A decode step whose batch no axis divides, on cheap collectives: the KV cache split over its heads, as the
    keys' and values' products are (the integer program alone: no compile)."""
    _, _, plan = _heads_plan(folder, {"model": 2})
    return {"plan": {k: list(v) for k, v in plan.items()}}


def generate_on_mesh(folder: Path) -> dict:
    """export_generate over {"model": 2}: with the heads plan above and with shardings="auto", tokens equal to
    transformers' greedy generate; the compiled program's cache shapes per device and its collectives."""
    mesh = {"model": 2}
    model, (ids, mask), plan = _heads_plan(folder, mesh)
    want = model.generate(ids, attention_mask=mask, max_new_tokens=GENERATED, do_sample=False,
                          cache_implementation="static")
    os.environ[FILE_VARIABLE] = str(folder / "measured_generate.json")  # "auto": rates measured here
    report = {}
    for name, shardings in (("heads", plan), ("auto", "auto")):
        art = export_generate(model, ids, max_new_tokens=GENERATED, attention_mask=mask, mesh=mesh,
                              shardings=shardings)
        got = art(ids, attention_mask=mask)
        hlo = art._executables[max(art._executables)].loaded.hlo_modules()[0].to_string()
        report[name] = {"equal": bool(torch.equal(got[:, :want.shape[1]], want)), "chosen": art.sharding_plan.chosen,
                        "cache_shapes": sorted(set(re.findall(r"f32\[3,[12],64,16\]", hlo))),
                        "counts": _collective_counts(art)}
    return report


def load_and_run(folder: Path) -> None:
    art = load_artifact(folder / "bundle")
    out = art(torch.from_numpy(np.load(folder / "input_ids.npy")))
    torch.testing.assert_close(out, torch.from_numpy(np.load(folder / "expected.npy")), **TOLERANCE)
    print("fresh process: equal", dict(art.sharding_plan)["input_ids"])


CHECKS = [mlp_megatron, mlp_budget, fsdp, decoder_auto, tied_split_apart, generate_heads_plan, engine_heads]
FULL_SWEEP_CHECKS = [moe_experts_split, generate_on_mesh]  # run by --full-sweep: exports of transformers models


def main(report_path: str, folder: str, names: list[str]) -> None:
    report = {}
    for run in [c for c in CHECKS + FULL_SWEEP_CHECKS if c.__name__ in names] if names else CHECKS:
        try:
            report[run.__name__] = {"ok": True, **run(Path(folder))}
        except Exception:  # noqa: BLE001  (each check reports its own failure)
            report[run.__name__] = {"ok": False, "error": traceback.format_exc()}
    Path(report_path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    jax.config.update("jax_num_cpu_devices", 8)  # before the CPU client starts (importing this module does not)
    if sys.argv[1] == "--load":
        load_and_run(Path(sys.argv[2]))
    else:
        main(sys.argv[1], sys.argv[2], sys.argv[3:])
