"""The sharding search: candidate plans proposed, then the fastest chosen by timing them on the mesh.

The integer program (``plan.ilp_plan``) prices plans with rates measured on the mesh's devices, but a step's time
on them is not the sum of its parts: on CPU, virtual devices share the host's cores, XLA fuses, overlaps and adds
collectives of its own. So the program's optimum is one proposal among several: its optimum under the measured
rates and under two other calibrations of them (all-gathers priced as the measured all-reduces; every collective
at a tenth of its measured price, the rates a fast interconnect has), and the plans the field writes by hand:
data-parallel, Megatron-LM's tensor-parallel plan (over the last axis, the batch over the others; found from the
graph, ``plan.megatron_plan``; a loop step's carried state laid out as the search lays it out) and FSDP (over the last axis, the batch over the first). Replicated is not timed:
data-parallel holds the same weights, does a share of the work and is the replicated plan where no axis divides
the batch. Those that fit ``max_bytes_per_device`` are compiled and timed on the mesh (``timing``): a few calls
of each, then more calls of those within ``CLOSE`` of the fastest and of the hand plans within ``HAND_CLOSE``
(those the search must beat). The fastest of those is the plan, but a hand
plan within ``TIE`` of it wins the tie: a plan the field knows, where the timing cannot tell them apart. Its cost:
one compile and a few calls of a shallow copy per distinct candidate, and more calls of the close ones.
"""
from __future__ import annotations

from dataclasses import replace

from torch.export import ExportedProgram

from torch_stablehlo.runtime.device_costs import Collective, DeviceCosts, device_costs

from ..conversion.input_shardings import check_mesh
from ..conversion.signature import Signature
from .plan import ShardingPlan, checked_budget, data_parallel_plan, fsdp_plan, ilp_plan, megatron_plan
from .timing import CONFIRM_ROUNDS, ROUNDS, TimedRuns, timeable

CLOSE = 2.0  # candidates within this of the fastest after a few calls are called more (see timing.CONFIRM_ROUNDS)
HAND_CLOSE = 3.0  # hand plans, within this: the search's choice is always timed against them (a few calls on a
#                   loaded machine put GPT-2's data-parallel plan 2.1x behind a searched plan it beat by 1.3x)
TIE = 1.05   # a hand plan this close to the fastest is chosen
HAND_PLANS = ("data-parallel", "megatron", "fsdp")


def search_plan(program: ExportedProgram, signature: Signature, mesh, max_bytes_per_device=None,
                platform: str = "cpu", timed: bool = True, loop_carried: int = 0) -> ShardingPlan:
    """The fastest plan for ``program`` over ``mesh`` whose weights and inputs fit ``max_bytes_per_device``:
    timed among the candidates (``timed``, where the program can run: static shapes, weights with data), else
    the integer program's optimum under the measured rates. ``plan.timings``: each timed candidate's best call
    after a few, ``plan.confirmed`` the close ones' after more.
    ``loop_carried``: the first that many results are the first user inputs of the next call (``ilp_plan``)."""
    mesh = check_mesh(mesh)
    budget = checked_budget(max_bytes_per_device)
    costs = device_costs(mesh, platform)  # MeshError here, before any search or compile, if devices are missing
    searched = ilp_plan(program, signature, mesh, costs, budget, loop_carried)
    if not timed or not timeable(program, signature):
        return searched
    candidates = {"searched": searched}
    for name, calibrated in (("searched, gathers as reduces", _gathers_as_reduces(costs)),
                             ("searched, collectives / 10", _cheaper_collectives(costs, 10.0))):
        candidates[name] = ilp_plan(program, signature, mesh, calibrated, budget, loop_carried)
    first, last = list(mesh)[0], list(mesh)[-1]
    candidates["data-parallel"] = data_parallel_plan(program, signature, mesh)  # replicated where nothing divides
    candidates["megatron"] = megatron_plan(program, signature, mesh)
    if loop_carried:  # a loop step's hand plan keeps what it carries (a decode step's KV cache) as the search does:
        # over its heads where the search splits it so, with the keys' and values' products, as Megatron serves
        candidates["megatron"].update({slot.name: searched[slot.name] for slot in signature.user_inputs[:loop_carried]
                                       if slot.name in searched})
    candidates["fsdp"] = fsdp_plan(program, signature, last, first, mesh)
    distinct = {}
    for name, plan in candidates.items():
        fits = budget is None or plan.total_device_bytes <= budget
        if fits and not any(_same(plan, other) for other in distinct.values()):
            distinct[name] = plan
    runs = TimedRuns(program, signature, distinct, platform)
    timings = runs.timed(list(distinct), ROUNDS)
    close = [name for name, seconds in timings.items()
             if seconds <= (HAND_CLOSE if name in HAND_PLANS else CLOSE) * min(timings.values())]
    confirmed = runs.timed(close, CONFIRM_ROUNDS) if len(close) > 1 else {}
    best = _preferred(confirmed or timings)
    chosen = distinct[best]
    chosen.timings, chosen.confirmed, chosen.chosen = timings, confirmed, best
    chosen.cost = (confirmed or timings)[best]
    return chosen


def _preferred(timings: dict[str, float]) -> str:
    """The fastest candidate, or the fastest hand plan within ``TIE`` of it."""
    fastest = min(timings, key=timings.get)
    hand = [name for name in timings if name in HAND_PLANS and timings[name] <= TIE * timings[fastest]]
    return min(hand, key=timings.get) if hand else fastest


def _same(a: ShardingPlan, b: ShardingPlan) -> bool:
    return dict(a) == dict(b) and a.constraints == b.constraints


def _gathers_as_reduces(costs: DeviceCosts) -> DeviceCosts:
    return replace(costs, all_gather=dict(costs.all_reduce))


def _cheaper_collectives(costs: DeviceCosts, factor: float) -> DeviceCosts:
    def cheaper(line: Collective) -> Collective:
        return Collective(line.latency / factor, line.per_byte / factor)
    return replace(costs, all_reduce={a: cheaper(c) for a, c in costs.all_reduce.items()},
                   all_gather={a: cheaper(c) for a, c in costs.all_gather.items()})
