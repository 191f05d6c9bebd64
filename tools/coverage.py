"""The core ATen coverage report: ``docs/coverage.md`` and ``docs/coverage.json``.

One row per core ATen overload (``torch.Tag.core``): whether a lowering is registered, how the OpInfo
samples that exercise it fared per dtype (``tools.opinfo_sweep``), whether it passed the sweep with a
dynamic dim 0, and whether it has a quantized form. Then every OpInfo sample that failed or errored, with
its reason, and every sample not counted (torch.export refused it, it is random, eager raised); the quantized
forms; and every higher-order op torch registers (``torch.cond``, ``while_loop``, ...) with its lowering.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm

from torch_stablehlo.aten_lowerings import lowering_for, op_name
from torch_stablehlo.quantize import quantized_lowerings

from .opinfo_sweep import COUNTED, DTYPES, STATUS, dtype_name, opinfos, sweep_op

DTYPE_NAMES = [dtype_name(d) for d in DTYPES]
PASSES = ("static", "dynamic")


def core_aten_ops() -> list[torch._ops.OpOverload]:
    """Every core ATen overload, sorted by name (from the dispatcher's list: ``dir(torch.ops.aten)``
    only lists the packets loaded so far)."""
    packets = {name.removeprefix("aten::").split(".")[0]
               for name in torch._C._dispatch_get_all_op_names() if name.startswith("aten::")}
    ops = []
    for packet in (getattr(torch.ops.aten, name) for name in sorted(packets)):
        ops += [op for op in (getattr(packet, overload) for overload in packet.overloads())
                if torch.Tag.core in op.tags]
    return sorted(ops, key=op_name)


# -- the sweep ------------------------------------------------------------------------------------

def sweep_entry(name: str) -> dict:
    """Both passes of one OpInfo entry: ``{"static": {dtype: [SampleResult]}, "dynamic": {...}}``. The dynamic
    pass (dim 0 of every input symbolic) tests shapes, so it runs in one dtype: the first in which a static
    sample passed (none: nothing to learn about dynamic dims). The dynamic pass exports again: a static
    trace has every dim specialised and cannot be relaxed to symbolic dims afterwards, so torch.export must
    re-trace; what the passes could share (the samples and their eager results) is a few percent of an
    entry's cost next to export (about half) and XLA compilation (about a third)."""
    static = sweep_pass(name, "static")
    return {"static": static, "dynamic": sweep_pass(name, "dynamic", dynamic_dtypes(static))}


def dynamic_dtypes(static: dict[str, list]) -> list[str]:
    """The dtype the dynamic pass runs in, from the static pass's results: the first with a passing sample (none:
    nothing to learn about dynamic dims)."""
    return [dtype for dtype, results in static.items() if any(r.status == "passed" for r in results)][:1]


def sweep_pass(name: str, which: str, dtypes: list[str] | None = None) -> dict[str, list]:
    """One pass (``PASSES``) of one OpInfo entry, in ``dtypes`` (default: every dtype of ``DTYPES`` the entry
    supports); the dynamic pass sweeps only the dtypes given."""
    if which == "static":
        return sweep_op(name, dtypes=dtypes)
    return sweep_op(name, dynamic=True, dtypes=dtypes) if dtypes else {}


def run_sweep(names: list[str], jobs: int | None = None) -> dict[str, dict]:
    """``sweep_entry`` for each name, in ``jobs`` worker processes, with a progress bar on a terminal."""
    jobs = jobs or os.cpu_count() or 1
    results = {}
    with multiprocessing.get_context("spawn").Pool(jobs, initializer=_quiet_worker, maxtasksperchild=40) as pool:
        for name, result in tqdm(pool.imap_unordered(_named_entry, names), total=len(names), disable=None,
                                 desc="OpInfo sweep", unit="op"):
            results[name] = result
    return dict(sorted(results.items()))


def _named_entry(name: str):
    return name, sweep_entry(name)


def _quiet_worker():
    """Sweep modules are compiled once and thrown away: keep them out of the persistent cache."""
    os.environ["TORCH_STABLEHLO_CACHE_DIR"] = "off"


def letters(results: dict[str, list]) -> dict[str, str]:
    """One letter per sample (``opinfo_sweep.STATUS``), by dtype: the form the report stores."""
    return {dtype: "".join(STATUS[r.status] for r in samples) for dtype, samples in results.items()}


# -- the report -----------------------------------------------------------------------------------

def coverage(sweep: dict[str, dict]) -> dict:
    quantized = quantized_lowerings()
    per_op = _per_core_op(sweep)
    rows = [{"op": op_name(op), "lowering": lowering_for(op) is not None, "quantized": op_name(op) in quantized,
             **per_op.get(op_name(op), {"opinfo": {}, "dynamic": [0, 0, 0]})}
            for op in core_aten_ops()]
    lowered = sum(row["lowering"] for row in rows)
    return {"torch_version": torch.__version__,
            "summary": {"core_ops": len(rows), "lowered": lowered, "missing": len(rows) - lowered,
                        "quantized": sum(row["quantized"] for row in rows),
                        "dynamic_core_ops": sum(row["dynamic"][0] > 0 and not any(row["dynamic"][1:]) for row in rows),
                        **{f"opinfo_{p}": _totals(sweep, p) for p in PASSES}},
            "ops": rows,
            "opinfo": {name: {**{p: letters(entry[p]) for p in PASSES}, "aten_ops": entry_ops(entry)}
                       for name, entry in sweep.items()},
            "problems": [problem for name, entry in sweep.items() for problem in _problems(name, entry)],
            "quantized_forms": quantized,
            "higher_order": higher_order_ops()}


def higher_order_ops() -> list[dict]:
    """Every higher-order op torch registers, sorted by name: whether it has a lowering and what it becomes
    (the first paragraph of the rule's docstring, else of its module's)."""
    rows = []
    for name, op in sorted(torch._ops._higher_order_ops.items()):
        rule = lowering_for(op)
        doc = (rule.__doc__ or sys.modules[rule.__module__].__doc__) if rule is not None else ""
        rows.append({"op": name, "lowering": rule is not None, "becomes": " ".join(doc.split("\n\n")[0].split())})
    return rows


def entry_ops(entry: dict) -> dict[str, dict[str, str]]:
    """The ATen overloads (after our decompositions) that an entry's counted samples exercised, by pass and
    dtype, space-separated: what ``tests/tools/test_opinfo_sweep.py`` picks its sample of entries by."""
    return {p: {dtype: " ".join(sorted({op for r in samples if r.status in COUNTED for op in r.aten_ops}))
                for dtype, samples in entry[p].items()} for p in PASSES}


def _per_core_op(sweep: dict) -> dict[str, dict]:
    """passed/failed/errored counts per dtype (static pass) and in the dynamic pass, for each op any
    counted sample exercised."""
    counts: dict[str, dict] = {}
    for entry in sweep.values():
        for p in PASSES:
            for dtype, samples in entry[p].items():
                for result in samples:
                    if result.status not in COUNTED:
                        continue
                    for op in result.aten_ops:
                        row = counts.setdefault(op, {"opinfo": {}, "dynamic": [0, 0, 0]})
                        cell = row["dynamic"] if p == "dynamic" else row["opinfo"].setdefault(dtype, [0, 0, 0])
                        cell[COUNTED.index(result.status)] += 1
    return counts


def _totals(sweep: dict, which: str) -> dict:
    statuses = Counter(r.status for entry in sweep.values() for samples in entry[which].values() for r in samples)
    eligible = sum(statuses[s] for s in COUNTED)
    return {"entries": len(sweep), "samples": sum(statuses.values()), "eligible": eligible,
            **{s: statuses[s] for s in STATUS},
            "pass_rate": round(statuses["passed"] / eligible, 4) if eligible else 0.0}


def _problems(name: str, entry: dict):
    for p in PASSES:
        for dtype, samples in entry[p].items():
            for index, result in enumerate(samples):
                if result.status != "passed":
                    yield {"opinfo": name, "pass": p, "dtype": dtype, "sample": index, "status": result.status,
                           "reason": result.reason}


def markdown(report: dict) -> str:
    summary = report["summary"]
    static, dynamic = summary["opinfo_static"], summary["opinfo_dynamic"]
    lines = ["# Core ATen op coverage", "",
             "Generated by `torch-stablehlo coverage`; do not edit.", "",
             f"- torch {report['torch_version']}: **{summary['lowered']} of {summary['core_ops']}** core ATen "
             f"overloads have a StableHLO lowering; {summary['missing']} have none.",
             f"- OpInfo sweep (torch's `op_db`, up to 4 samples per op and dtype, compared with eager using "
             f"`torch.testing.assert_close`'s default tolerance for the dtype; float16/bfloat16 results that miss it "
             f"pass if they are no further from the float64 result than eager torch's own, plus that tolerance, "
             f"the rule of torch's reference tests): **{static['passed']} of "
             f"{static['eligible']}** eligible samples pass ({static['pass_rate']:.2%}) over {static['entries']} "
             f"entries; {static['failed']} failed, {static['errored']} errored. Not counted: "
             f"{static['not_exportable']} that torch.export cannot export, {static['random']} random, "
             f"{static['eager_error']} that eager torch rejects.",
             f"- Dynamic pass (dim 0 of every input exported as `Dim.DYNAMIC`, one dtype per entry): "
             f"**{dynamic['passed']} of {dynamic['eligible']}** pass ({dynamic['pass_rate']:.2%}); "
             f"{summary['dynamic_core_ops']} core ops pass every dynamic sample that exercises them; "
             f"{dynamic['not_exportable']} samples torch.export specialises (not counted).",
             f"- {summary['quantized']} core overloads also have a quantized form (see the last table).", "",
             "Cells are passed/counted OpInfo samples that exercise the op (after our decompositions).", "",
             "| op | lowering | " + " | ".join(DTYPE_NAMES) + " | dynamic | quantized |",
             "|---|---|" + "---|" * len(DTYPE_NAMES) + "---|---|"]
    for row in report["ops"]:
        cells = [_cell(row["opinfo"].get(d)) for d in DTYPE_NAMES]
        lines.append(f"| `{row['op']}` | {_yes(row['lowering'])} | " + " | ".join(cells)
                     + f" | {_cell(row['dynamic'])} | {_yes(row['quantized'])} |")
    for title, wanted in (("OpInfo samples that failed or errored", COUNTED[1:]),
                          ("OpInfo samples not counted", ("not_exportable", "random", "eager_error"))):
        problems = [p for p in report["problems"] if p["status"] in wanted]
        lines += ["", f"## {title} ({len(problems)})", "", "| entry | pass | dtype | sample | status | reason |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| `{p['opinfo']}` | {p['pass']} | {p['dtype']} | {p['sample']} | {p['status']} | "
                  f"{_escape(p['reason'])} |" for p in problems]
    lines += ["", "## Quantized lowerings", "", "| op | becomes |", "|---|---|"]
    lines += [f"| `{op}` | {form} |" for op, form in sorted(report["quantized_forms"].items())]
    return "\n".join(lines + higher_order_markdown(report["higher_order"])) + "\n"


def higher_order_markdown(rows: list[dict]) -> list[str]:
    """The report's section on higher-order ops, as lines."""
    lowered = sum(row["lowering"] for row in rows)
    lines = ["", f"## Higher-order ops ({lowered} of {len(rows)} lowered)", "",
             "Control flow and wrappers torch.export emits with nested graphs; the others raise "
             "`UnsupportedOpsError` naming the op and its source line.", "", "| op | lowering | becomes |",
             "|---|---|---|"]
    return lines + [f"| `{row['op']}` | {_yes(row['lowering'])} | {_escape(row['becomes'].replace('``', '`'))} |"
                    for row in rows]


def _cell(counts) -> str:
    return f"{counts[0]}/{sum(counts)}" if counts and sum(counts) else "-"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# -- the sample ``make test`` re-sweeps ----------------------------------------------------------

SIZE_QUERIES = "aten.sym_"
"""Ops that read a tensor's sizes, strides or storage offset (``aten.sym_size``, ``aten.sym_storage_offset``, ...):
their lowerings never read the values, and unit tests check them (tests/aten_lowerings/shape/); as sample targets
they cost make test the tensor_split entry (47 s), the one entry that reaches ``aten.sym_storage_offset``."""


def sample_targets(report: dict) -> dict[tuple[str, str], set]:
    """What the sample must reach, from the report: every core ATen overload but the size queries
    (``SIZE_QUERIES``) in every dtype a counted static sample exercised it in (``("static", op, dtype)``), every
    core overload a counted dynamic sample exercised (``("dynamic", op)``), every op family (``aten_lowerings``
    module) whose lowerings a counted sample reached (``("family", module)``); by the passes of the entries that
    reach each, ``(entry, pass)``."""
    core = {row["op"] for row in report["ops"]}
    family = _families({op for entry in report["opinfo"].values()
                        for p in PASSES for ops in entry["aten_ops"][p].values() for op in ops.split()})
    targets: dict[tuple[str, str], set] = {}
    for name, entry in report["opinfo"].items():
        for p in PASSES:
            reached = targets.setdefault((name, p), set())
            for dtype, ops in entry["aten_ops"][p].items():
                for op in ops.split():
                    if op in core and not op.startswith(SIZE_QUERIES):
                        reached.add(("static", op, dtype) if p == "static" else ("dynamic", op))
                    if op in family:
                        reached.add(("family", family[op]))
    return targets


# A pass costs one export and one compile of all its samples, worth about this many samples (the dynamic pass of
# acos, 3 samples, takes about 40% of its static pass, 18 samples); a sample that does not pass splits its batch
# (``opinfo_sweep._settle``): one more export and compile.
PASS_COST = 10
SPLIT_COST = 10


def sweep_sample(report: dict) -> list[tuple[str, str]]:
    """The fixed sample of OpInfo passes ``make test`` re-sweeps, as ``(entry, pass)``: a greedy cover of
    ``sample_targets`` (each step takes the pass reaching the most targets not yet reached per unit of its
    estimated cost: ``PASS_COST`` plus its samples, plus ``SPLIT_COST`` for each that does not pass; ties by
    name). Deterministic: a function of the report (and of which module registers each lowering)."""
    reaches = sample_targets(report)
    cost = {(name, p): PASS_COST + sum(len(letters) + SPLIT_COST * sum(letter != STATUS["passed"] for letter in letters)
                                       for letters in report["opinfo"][name][p].values()) for name, p in reaches}
    chosen: list[tuple[str, str]] = []
    reached: set = set()
    wanted = set().union(*reaches.values())
    while reached != wanted:
        best = max(sorted(set(reaches) - set(chosen)), key=lambda key: len(reaches[key] - reached) / cost[key])
        chosen.append(best)
        reached |= reaches[best]
    return sorted(chosen)


def _families(ops: set[str]) -> dict[str, str]:
    """The ``aten_lowerings`` module registering the lowering of each of ``ops`` that has one."""
    families = {}
    for name in ops:
        namespace, packet, overload = name.split(".")
        op = getattr(getattr(getattr(torch.ops, namespace), packet, None), overload, None)
        rule = lowering_for(op) if op is not None else None
        if rule is not None and rule.__module__.startswith("torch_stablehlo.aten_lowerings."):
            families[name] = rule.__module__
    return families


def write_report(out_dir: str | os.PathLike, names: list[str] | None = None, jobs: int | None = None) -> list[Path]:
    """Sweep ``names`` (default: every OpInfo entry) and write ``coverage.md`` and ``coverage.json`` into
    ``out_dir``; returns their paths."""
    report = coverage(run_sweep(sorted(opinfos()) if names is None else names, jobs))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "coverage.md", out_dir / "coverage.json"]
    paths[0].write_text(markdown(report))
    paths[1].write_text(json.dumps(report, indent=1) + "\n")
    return paths
