"""The model sweep: every architecture in ``tools.model_table`` exported, converted and run against eager torch,
written to ``docs/models.md`` and ``docs/models.json`` (``make models``), with ``tools.generate_sweep``'s
``export_generate`` table of its causal LMs.

    python -m torch_stablehlo.tools.model_sweep                   # every model -> docs/
    python -m torch_stablehlo.tools.model_sweep --only gpt2 vit   # some of them

Each model goes through three passes:

* ``static``: ``torch.export.export(model, kwargs=inputs, strict=False)``, converted, run on the same inputs;
* ``dynamic``: exported again with the table's symbolic dims (batch, and sequence where the model allows),
  converted, run at other sizes in their ranges;
* ``saved_model``: the dynamic artifact (the static one where there is none) saved as a TF SavedModel, loaded and
  called through ``serving_default`` at the dynamic pass's sizes.

A pass passes when every output is within the float32 tolerance of ``exporter.tolerances`` (``max |error| <= atol +
rtol * max |eager|``). Where ``torch.export.export`` itself raises, the pass records torch's exception
(``torch.export``): torch's limit, not ours. The conversion time is ``export_to_stablehlo`` on the
ExportedProgram alone, in a worker that has already converted another model, after a garbage collection;
``re-traced`` says whether the conversion re-traced the program (``decomposition.retraced``, torch's
``run_decompositions``).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.utils._pytree as pytree
from tqdm import tqdm

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.conversion import decomposition
from torch_stablehlo.exporter.conversion.calls import tensor_inputs
from torch_stablehlo.exporter.tolerances import TOLERANCES

from . import generate_sweep
from .generate_sweep import reason
from .model_table import MODELS, ModelEntry

PASSES = ("static", "dynamic", "saved_model")
PASSED, FAILED, ERROR, TORCH_EXPORT = "passed", "failed", "error", "torch.export"
CONVERSION_BUDGET_S = 0.2  # issue 23: every conversion within it, or the report says which are not


# -- one model -------------------------------------------------------------------------------------

def sweep_model(entry: ModelEntry, folder: Path) -> dict:
    """The three passes of one model: ``{"static": {...}, "dynamic": {...}, "saved_model": {...}}``, each with
    its ``status``, ``max_error`` (max |ours - eager| over the outputs), ``reason`` where it did not pass, and
    for the conversions ``convert_s`` and ``retraced``."""
    model = entry.build()
    static, static_artifact = _converted_pass(model, entry.inputs(), None, entry.inputs())
    dynamic, artifact = _converted_pass(model, entry.inputs(), entry.dynamic_shapes(), entry.inputs(dynamic=True))
    served = artifact or static_artifact
    saved = (_saved_model_pass(served, model, entry.inputs(dynamic=artifact is not None), folder) if served
             else {"status": ERROR, "reason": "nothing converted to save"})
    return {"category": entry.category, "model_class": entry.model_class, "dims": list(entry.symbolic),
            "notes": entry.notes,
            "static": static, "dynamic": dynamic, "saved_model": saved}


def _converted_pass(model, example: dict, dynamic_shapes, checked: dict):
    """Export, convert, run on ``checked`` and compare with eager: (the pass's record, the artifact or None)."""
    try:
        program = torch.export.export(model, (), example, strict=False, dynamic_shapes=dynamic_shapes)
    except Exception as error:  # torch's limit: recorded, not ours
        return {"status": TORCH_EXPORT, "reason": reason(error)}, None
    gc.collect()  # earlier models' garbage: a full collection inside the timed call would cost up to a second
    try:
        with _counting_retraces() as retraces:
            start = time.perf_counter()
            artifact = export_to_stablehlo(program)
            seconds = time.perf_counter() - start
    except Exception as error:
        return {"status": ERROR, "stage": "convert", "reason": reason(error)}, None
    record = {"convert_s": round(seconds, 3), "retraced": bool(retraces)}
    try:
        outputs = pytree.tree_leaves(artifact(**checked))
    except Exception as error:
        return {**record, "status": ERROR, "stage": "run", "reason": reason(error)}, None
    return {**record, **compare(outputs, _eager(model, checked))}, artifact


def _saved_model_pass(artifact, model, inputs: dict, folder: Path) -> dict:
    import tensorflow as tf  # seconds to import: only here

    try:
        path = artifact.save_tf_saved_model(folder / "saved_model")
        signature = tf.saved_model.load(str(path)).signatures["serving_default"]
        slots = [slot for slot in artifact.signature.user_inputs if slot.tensor is not None]
        tensors = tensor_inputs(artifact.signature, (), inputs)
        served = signature(**{slot.tensor.name: tf.constant(t.numpy()) for slot, t in zip(slots, tensors)})
        names = [slot.tensor.name for slot in artifact.signature.user_outputs if slot.tensor is not None]
        outputs = [torch.from_numpy(served[name].numpy()) for name in names]
    except Exception as error:
        return {"status": ERROR, "reason": reason(error)}
    return compare(outputs, _eager(model, inputs))


def _eager(model, inputs: dict) -> list[torch.Tensor]:
    with torch.no_grad():
        return [leaf for leaf in pytree.tree_leaves(model(**inputs)) if isinstance(leaf, torch.Tensor)]


def compare(outputs: list, expected: list[torch.Tensor]) -> dict:
    """``status`` (passed when every output is within its dtype's tolerance) and ``max_error``, the largest
    max |ours - eager| over the outputs."""
    if len(outputs) != len(expected):
        return {"status": FAILED, "reason": f"{len(outputs)} outputs, eager returns {len(expected)}"}
    worst, off = 0.0, []
    for index, (ours, theirs) in enumerate(zip(outputs, expected)):
        ours = torch.as_tensor(ours)
        if ours.shape != theirs.shape:
            off.append(f"output {index}: shape {tuple(ours.shape)}, eager {tuple(theirs.shape)}")
            continue
        error = (ours.double() - theirs.double()).abs().max().item() if theirs.numel() else 0.0
        rtol, atol = TOLERANCES.get(theirs.dtype, (0.0, 0.0))
        scale = theirs.double().abs().max().item() if theirs.numel() else 0.0
        worst = max(worst, error)
        if not error <= atol + rtol * scale:
            off.append(f"output {index}: max error {error:.2e} > {atol:g} + {rtol:g} x {scale:.3g}")
    record = {"status": FAILED if off else PASSED, "max_error": worst}
    return {**record, "reason": "; ".join(off)} if off else record


@contextlib.contextmanager
def _counting_retraces():
    """Counts the re-traces (``decomposition.retraced``) made inside (a list, one entry per call)."""
    calls, original = [], decomposition.retraced

    def counted(program, table):
        calls.append(1)
        return original(program, table)

    decomposition.retraced = counted
    try:
        yield calls
    finally:
        decomposition.retraced = original


# -- the sweep -------------------------------------------------------------------------------------

def run_sweep(names: list[str], jobs: int = 1) -> dict[str, dict]:
    """``sweep_model`` for each name, in ``jobs`` worker processes (each converts a warm-up model first)."""
    results = {}
    with multiprocessing.get_context("spawn").Pool(jobs, initializer=warm_up) as pool:
        for name, result in tqdm(pool.imap_unordered(_named_model, names), total=len(names), disable=None,
                                 desc="model sweep", unit="model"):
            results[name] = result
    return {name: results[name] for name in names}


def warm_up():
    """Convert one small model, so that conversion times exclude what a process pays once (imports, the
    first lowering of each kind); keep the sweep's modules out of the persistent compile cache."""
    os.environ["TORCH_STABLEHLO_CACHE_DIR"] = "off"
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    export_to_stablehlo(torch.export.export(model, (torch.randn(2, 4),)))


def _named_model(name: str):
    with tempfile.TemporaryDirectory(prefix=f"model-sweep-{name}-") as folder:
        return name, sweep_model(MODELS[name], Path(folder))


# -- the report ------------------------------------------------------------------------------------

def markdown(results: dict[str, dict], generate: dict[str, dict] | None = None) -> str:
    """The forward-pass table, the passes that did not pass and, where given, ``generate_sweep``'s table."""
    counts = {p: sum(r[p]["status"] == PASSED for r in results.values()) for p in PASSES}
    limits = {p: sum(r[p]["status"] == TORCH_EXPORT for r in results.values()) for p in PASSES}
    rtol, atol = TOLERANCES[torch.float32]
    lines = ["# Model sweep", "", "Generated by `make models` (`python -m torch_stablehlo.tools.model_sweep`); "
             "do not edit. The models and their tiny configs: `tools/model_table.py`.", "",
             f"- torch {torch.__version__}, {len(results)} transformers architectures (random weights, seeded).",
             *(f"- {p}: **{counts[p]} of {len(results)}** pass; {limits[p]} torch.export cannot export."
               for p in PASSES),
             f"- Conversions over {CONVERSION_BUDGET_S} s: {', '.join(_slow(results)) or 'none'}.",
             "- A pass passes when every output is within float32's tolerance (`exporter/tolerances.py`: "
             f"max |error| <= {atol:g} + {rtol:g} x max |eager|). Max error: the largest max |ours - eager| over the "
             "outputs and passes. Convert: `export_to_stablehlo` on the ExportedProgram (torch.export excluded) "
             "in a process that has converted another model, after a garbage collection, static / dynamic. "
             "Re-traced: whether the conversion re-traced the program to decompose ops (`run_decompositions`).", "",
             "| model | category | class | static | dynamic | SavedModel | max error | convert s | re-traced | notes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        passes = [r[p] for p in PASSES]
        worst = max((p["max_error"] for p in passes if "max_error" in p), default=None)
        seconds = " / ".join(f"{p['convert_s']:.2f}" if "convert_s" in p else "-" for p in passes[:2])
        retraced = "yes" if any(p.get("retraced") for p in passes) else "no"
        dynamic = f"{_status(r['dynamic'])} ({', '.join(r['dims'])})"
        lines.append(f"| {name} | {r['category']} | `{r['model_class']}` | {_status(r['static'])} | {dynamic} | "
                     f"{_status(r['saved_model'])} | {'-' if worst is None else f'{worst:.1e}'} | {seconds} | "
                     f"{retraced} | {_escape(r['notes'])} |")
    problems = [(name, p, r[p]) for name, r in results.items() for p in PASSES if r[p]["status"] != PASSED]
    lines += ["", f"## Passes that did not pass ({len(problems)})", "", "| model | pass | status | reason |",
              "|---|---|---|---|"]
    lines += [f"| {name} | {p} | {record['status']} | {_escape(record.get('reason', ''))} |"
              for name, p, record in problems]
    if generate:
        lines += ["", *generate_sweep.markdown(generate)]
    return "\n".join(lines) + "\n"


def _slow(results: dict[str, dict]) -> list[str]:
    """``model (pass, seconds)`` for each conversion over the budget."""
    return [f"{name} ({p}, {r[p]['convert_s']:.2f} s)" for name, r in results.items() for p in PASSES
            if r[p].get("convert_s", 0) > CONVERSION_BUDGET_S]


def _status(record: dict) -> str:
    return {PASSED: "pass", TORCH_EXPORT: "torch.export"}.get(record["status"], "**FAIL**")


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_report(results: dict[str, dict], out: Path, generate: dict[str, dict] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = {"torch_version": torch.__version__, "models": results, "generate": generate or {}}
    (out / "models.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "models.md").write_text(markdown(results, generate))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_stablehlo.tools.model_sweep",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", action="extend", metavar="NAME", choices=list(MODELS),
                        help="sweep only these models")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default: 1)")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="folder to write to (default: docs)")
    options = parser.parse_args(argv)
    names = options.only or list(MODELS)
    results = run_sweep(names, options.jobs)
    generate = {name: generate_sweep.sweep_generate(MODELS[name]) for name in generate_sweep.generating_models()
                if name in names}
    write_report(results, options.out, generate)
    print(f"wrote {options.out / 'models.md'}: {sum(r['static']['status'] == PASSED for r in results.values())} of "
          f"{len(results)} pass static")
    return 0


if __name__ == "__main__":
    sys.exit(main())
