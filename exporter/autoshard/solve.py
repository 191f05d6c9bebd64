"""The sharding problem as an integer linear program, solved by HiGHS (``highspy``), as Alpa and XLA's
auto-sharding pass formulate it: one 0/1 variable per strategy of each choice (exactly one chosen), and per edge a
continuous variable per (producer layout, consumer layout) pair whose row and column sums equal the two choices'
variables, so with one-hot choices it is 1 exactly at the chosen pair; the objective is the summed seconds, the
memory budget a hard row.

HiGHS is chosen over OR-Tools CP-SAT (integer-only coefficients, so seconds would need scaling; a wheel 10x the
size that pins protobuf, which tensorflow pins too) and PuLP/CBC (writes the model to a file and runs CBC as a
subprocess): it is an in-process MILP solver with a numpy-level API, MIT licensed, and a small wheel.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShardingError
from .problem import Problem

try:
    import highspy
except ImportError:  # an optional extra: the error says how to get it when the search runs
    highspy = None

_SCALE = 1e6       # seconds -> microseconds: coefficients near 1 for the solver
_TIME_LIMIT = 60.0  # seconds


@dataclass(frozen=True)
class Solution:
    picks: list[int]      # per choice, the index of its chosen strategy
    seconds: float        # the objective: estimated seconds of one call
    memory: float         # bytes per device of the weights and inputs


def solve(problem: Problem, max_bytes: float | None = None) -> Solution:
    """The cheapest strategy per choice with the weights' and inputs' bytes per device <= ``max_bytes``."""
    if highspy is None:
        raise ShardingError("the sharding search needs the HiGHS solver: pip install "
                            "'torch-stablehlo-exporter[sharding]' (or highspy)")
    least = sum(min(c.memory) for c in problem.choices if c.memory)
    if max_bytes is not None and least > max_bytes:
        raise ShardingError(f"max_bytes_per_device={max_bytes:.0f}: the weights and inputs need at least "
                            f"{least:.0f} bytes per device even split as far as the mesh {problem.mesh} allows; "
                            "give a larger budget or a mesh with more devices")
    costs, integral, rows = [], [], []          # rows: (indices, values, lower, upper)
    first = []
    for choice in problem.choices:
        first.append(len(costs))
        costs += [s * _SCALE for s in choice.seconds]
        integral += [1] * len(choice.strategies)
        rows.append((list(range(first[-1], len(costs))), [1.0] * len(choice.strategies), 1.0, 1.0))
    for edge in problem.edges:
        producer, consumer = problem.choices[edge.producer], problem.choices[edge.consumer]
        sources = sorted({s.result for s in producer.strategies})
        targets = sorted({edge.taken(s) for s in consumer.strategies})
        base = len(costs)
        for source in sources:
            for target in targets:
                costs.append(edge.count * problem.reshard_seconds(source, target, edge.nbytes) * _SCALE)
                integral.append(0)
        for i, source in enumerate(sources):
            picks = [first[edge.producer] + k for k, s in enumerate(producer.strategies) if s.result == source]
            pairs = [base + i * len(targets) + j for j in range(len(targets))]
            rows.append((pairs + picks, [1.0] * len(pairs) + [-1.0] * len(picks), 0.0, 0.0))
        for j, target in enumerate(targets):
            picks = [first[edge.consumer] + k for k, s in enumerate(consumer.strategies)
                     if edge.taken(s) == target]
            pairs = [base + i * len(targets) + j for i in range(len(sources))]
            rows.append((pairs + picks, [1.0] * len(pairs) + [-1.0] * len(picks), 0.0, 0.0))
    if max_bytes is not None:
        held = [(first[i] + k, m) for i, c in enumerate(problem.choices) if c.memory for k, m in enumerate(c.memory)]
        rows.append(([i for i, _ in held], [m for _, m in held], -np.inf, float(max_bytes)))
    values = _run(costs, integral, rows)
    picks = [int(np.argmax(values[first[i]:first[i] + len(c.strategies)])) for i, c in enumerate(problem.choices)]
    seconds = sum(c.seconds[k] for c, k in zip(problem.choices, picks)) + sum(
        e.count * problem.reshard_seconds(problem.choices[e.producer].strategies[picks[e.producer]].result,
                                          e.taken(problem.choices[e.consumer].strategies[picks[e.consumer]]),
                                          e.nbytes) for e in problem.edges)
    memory = sum(c.memory[k] for c, k in zip(problem.choices, picks) if c.memory)
    return Solution(picks, seconds, memory)


def _run(costs: list[float], integral: list[int], rows: list) -> np.ndarray:
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", _TIME_LIMIT)
    h.setOptionValue("mip_rel_gap", 1e-4)
    n = len(costs)
    h.addCols(n, np.array(costs, dtype=np.float64), np.zeros(n), np.ones(n), 0, np.array([], dtype=np.int32),
              np.array([], dtype=np.int32), np.array([], dtype=np.float64))
    starts, indices, values = [], [], []
    for index, value, _, _ in rows:
        starts.append(len(indices))
        indices += index
        values += value
    h.addRows(len(rows), np.array([r[2] for r in rows], dtype=np.float64),
              np.array([r[3] for r in rows], dtype=np.float64), len(indices), np.array(starts, dtype=np.int32),
              np.array(indices, dtype=np.int32), np.array(values, dtype=np.float64))
    columns = np.array([i for i, k in enumerate(integral) if k], dtype=np.int32)
    h.changeColsIntegrality(len(columns), columns, np.ones(len(columns), dtype=np.uint8))
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal and h.getInfo().mip_gap == np.inf:
        raise ShardingError(f"the sharding search found no plan ({h.modelStatusToString(status)}): the memory "
                            "budget cannot be met together with the mesh's splits")
    return np.array(h.getSolution().col_value)
