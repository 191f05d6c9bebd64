"""Prove the serving paths of zoo models against their stored goldens.

    python -m torch_stablehlo.tools.serving                    # every model
    python -m torch_stablehlo.tools.serving --only mlp bert    # some of them

Each model is exported once; its stored golden inputs then go through

* ``pjrt``: the artifact in this process (the reference the others must equal);
* ``bundle``: the saved bundle, loaded and run in a new process (``tools.run_bundles``);
* ``tf``: the TF SavedModel, ``tf.saved_model.load(...).signatures["serving_default"]``;
* ``saved_model_cli``: the same SavedModel through ``saved_model_cli run``;
* ``jax``: the JAX handoff (``artifact.to_jax()``);

and each is compared with the golden outputs and with ``pjrt`` at the model's tolerance.
The subprocesses run while this process exports the next model: one ``saved_model_cli``
per model, one at a time, and one process for all the bundles, given each as it is written.
Exits non-zero if any model fails.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.utils._pytree as pytree

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.conversion.calls import tensor_inputs

from torch_stablehlo.golden import store, zoo
from .run_bundles import BUNDLE, ERROR, INPUTS, OUTPUTS

PATHS = ("pjrt", "bundle", "tf", "saved_model_cli", "jax")
SAVED_MODEL_CLI = Path(sys.executable).with_name("saved_model_cli")


@dataclass
class ServingResult:
    name: str
    against_golden: dict[str, store.Comparison] = field(default_factory=dict)   # path -> comparison
    against_pjrt: dict[str, store.Comparison] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        comparisons = [*self.against_golden.values(), *self.against_pjrt.values()]
        return not self.problems and set(self.against_golden) == set(PATHS) and all(c.ok for c in comparisons)

    def summary(self) -> str:
        """What failed (every path that is off, every subprocess that failed)."""
        lines = [f"{self.name}: {'PASS' if self.ok else 'FAIL'}"]
        for against, table in (("golden", self.against_golden), ("pjrt", self.against_pjrt)):
            lines += [f"  {path} vs {against}: max rel error {c.max_rel:.2e}, max abs error {c.max_abs:.2e}"
                      + "".join(f"; {problem}" for problem in c.problems)
                      for path, c in table.items() if not c.ok]
        return "\n".join(lines + [f"  {problem}" for problem in self.problems])


@dataclass
class _Job:
    """A subprocess producing one path's outputs for one or more models."""
    path: str
    process: subprocess.Popen
    log: Path
    read: Callable[[str], list[np.ndarray]]   # model name -> its outputs
    models: list[str]


@dataclass
class _Prepared:
    """One model exported, with its bundle, SavedModel and input files written under ``folder``."""
    folder: Path
    artifact: object
    golden: store.Golden
    comparing: tuple                  # (tolerance, abs_tolerance) for store.compare
    inputs: dict[str, np.ndarray]     # tensor inputs by signature name

    @property
    def output_names(self) -> list[str]:
        """The tensor outputs' signature names, in order: how every serving path names them."""
        return [slot.tensor.name for slot in self.artifact.signature.user_outputs if slot.tensor is not None]

    @property
    def saved_model(self) -> Path:
        return self.folder / "saved_model"


def check_serving(names: list[str], root: Path) -> list[ServingResult]:
    """Export each model under ``root / name`` and check every serving path; one result per model."""
    results = {name: ServingResult(name) for name in names}
    outputs: dict[str, dict[str, list]] = {}
    comparing: dict[str, tuple] = {}
    output_names: dict[str, list[str]] = {}
    bundles = _Job("bundle", _start(root / "bundles.log", sys.executable, "-m", "torch_stablehlo.tools.run_bundles",
                                    stdin=subprocess.PIPE),
                   root / "bundles.log", lambda model: _bundle_outputs(root / model, output_names[model]),
                   list(names))
    cli: _Job | None = None   # the saved_model_cli running: one at a time
    try:
        for name in names:
            model = _prepare(name, root / name)
            comparing[name] = (model.golden.outputs, *model.comparing)
            output_names[name] = model.output_names
            bundles.process.stdin.write(f"{model.folder}\n")
            bundles.process.stdin.flush()
            if cli is not None:
                _finish(cli, outputs, results)
            cli = _Job("saved_model_cli", _start(
                model.folder / "saved_model_cli.log", SAVED_MODEL_CLI, "run", "--dir", model.saved_model,
                "--tag_set", "serve", "--signature_def", "serving_default", "--outdir", model.folder / "cli",
                "--inputs", ";".join(f"{n}={model.folder / n}.npy" for n in model.inputs)),
                model.folder / "saved_model_cli.log",
                lambda done: _npy_outputs(root / done / "cli", output_names[done]), [name])
            outputs[name] = {"pjrt": model.artifact.run_flat([torch.from_numpy(v) for v in model.inputs.values()]),
                             "tf": _tf_outputs(model.saved_model, model.inputs, model.output_names),
                             "jax": _jax_outputs(model.artifact, model.golden)}
        bundles.process.stdin.close()
        for job in (cli, bundles):
            _finish(job, outputs, results)
    finally:
        for job in (cli, bundles):
            if job is not None:
                job.process.kill()
                job.process.wait()
    for name, result in results.items():
        golden_outputs, tolerance, abs_tolerance = comparing[name]
        for path in (p for p in PATHS if p in outputs[name]):
            flat = [torch.as_tensor(value) for value in outputs[name][path]]
            result.against_golden[path] = store.compare(flat, golden_outputs, tolerance, abs_tolerance)
            result.against_pjrt[path] = store.compare(flat, outputs[name]["pjrt"], tolerance, abs_tolerance)
    return list(results.values())


def _prepare(name: str, folder: Path) -> _Prepared:
    folder.mkdir(parents=True, exist_ok=True)
    entry, golden = zoo.get(name), store.load_golden(name)
    built = entry.build()
    artifact = export_to_stablehlo(zoo.fresh_export(built.model, golden.args, golden.kwargs))
    artifact.save(folder / BUNDLE)
    artifact.save_tf_saved_model(folder / "saved_model")
    slots = [slot for slot in artifact.signature.user_inputs if slot.tensor is not None]
    inputs = {slot.tensor.name: t.numpy() for slot, t in
              zip(slots, tensor_inputs(artifact.signature, golden.args, golden.kwargs))}
    np.savez(folder / INPUTS, **inputs)
    for input_name, value in inputs.items():
        np.save(folder / f"{input_name}.npy", value)
    return _Prepared(folder, artifact, golden, (entry.tolerance, built.abs_tolerance), inputs)


def _start(log: Path, *command, stdin=None) -> subprocess.Popen:
    with open(log, "w") as stderr:  # a file, not a pipe, so nothing blocks on a full pipe
        return subprocess.Popen([str(part) for part in command], stdin=stdin, stdout=subprocess.DEVNULL,
                                stderr=stderr, text=True)


def _finish(job: _Job, outputs: dict, results: dict) -> None:
    """Wait for the job and file its outputs (or why there are none) under each of its models."""
    status = job.process.wait(timeout=900)
    for model in job.models:
        try:
            outputs[model][job.path] = job.read(model)
        except (FileNotFoundError, RuntimeError) as error:
            results[model].problems.append(f"{job.path} (exit status {status}): {error}\n"
                                           f"{job.log.read_text().strip()[-1500:]}")


def _npy_outputs(folder: Path, names: list[str]) -> list[np.ndarray]:
    missing = [name for name in names if not (folder / f"{name}.npy").is_file()]
    if missing:
        raise FileNotFoundError(f"no outputs {missing} in {folder}")
    return [np.load(folder / f"{name}.npy") for name in names]


def _bundle_outputs(folder: Path, names: list[str]) -> list[np.ndarray]:
    if (folder / ERROR).is_file():
        raise RuntimeError(f"the bundle failed:\n{(folder / ERROR).read_text()[-1500:]}")
    with np.load(folder / OUTPUTS) as stored:
        return [stored[name] for name in names]


def _tf_outputs(saved_model: Path, inputs: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
    import tensorflow as tf  # seconds to import: only here

    signature = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    outputs = signature(**{name: tf.constant(value) for name, value in inputs.items()})
    return [outputs[name].numpy() for name in names]


def _jax_outputs(artifact, golden: store.Golden) -> list[np.ndarray]:
    args, kwargs = pytree.tree_map(lambda t: t.numpy(), (golden.args, golden.kwargs))
    outputs = artifact.to_jax()(*args, **kwargs)
    return [np.array(leaf) for leaf in pytree.tree_flatten(outputs)[0]]


def render(results: list[ServingResult]) -> str:
    header = ("model", *PATHS, "worst vs pjrt", "result")
    rows = [header]
    for r in results:
        errors = [f"{r.against_golden[p].max_rel:.2e}" if p in r.against_golden else "-" for p in PATHS]
        worst = max((c.max_rel for c in r.against_pjrt.values()), default=float("nan"))
        rows.append((r.name, *errors, f"{worst:.2e}", "PASS" if r.ok else "FAIL"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["max rel error (max |error| / max |expected|, worst output) of each serving path vs the golden"]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines + [r.summary() for r in results if not r.ok])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_stablehlo.tools.serving", description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", action="extend", metavar="NAME", choices=zoo.names(),
                        help="check only these models")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="serving-") as root:
        results = check_serving(options.only or zoo.names(), Path(root))
    print(render(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
