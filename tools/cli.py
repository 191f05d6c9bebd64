"""``torch-stablehlo`` (also ``python -m torch_stablehlo``): export, run, verify, inspect, coverage, explore, iree,
serve.

Every command exits 0 when it succeeds. On failure it prints one line saying why on
stderr and exits 1 (``--traceback`` prints the traceback too); usage errors exit 2.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import re
import sys
import traceback
from pathlib import Path

import torch
from rich.console import Console
from tqdm import tqdm

from torch_stablehlo.exporter import ShardingPlan, export_to_stablehlo, find_divergence, load_artifact
from torch_stablehlo.exporter.autoshard.picture import plan_picture
from torch_stablehlo.exporter.formats.bundle import DEFAULT_SHARD_BYTES
from .inspection import bundle_report, format_report, human_size
from torch_stablehlo.exporter.formats.iree import TARGET, compile_for_iree, parse_sizes
from torch_stablehlo.exporter.formats.manifest_schema import signature_from_json
from .npz import run_npz
from torch_stablehlo.exporter.formats.versions import DEFAULT_TARGET, TARGET_CHOICES
from torch_stablehlo.golden import store, zoo
from torch_stablehlo.exporter.terminal import printable, quiet_third_party_logs

from .coverage import write_report

PROG = "torch-stablehlo"
_DYNAMIC = re.compile(r"(?P<arg>[A-Za-z_]\w*):(?P<dim>\d+)=(?P<name>[A-Za-z_]\w*)(?:\[(?P<min>\d*),(?P<max>\d*)\])?")
_SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]i?B|B)?", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}


# -- argument parsing --------------------------------------------------------------------------

def parse_dynamic(specs: list[str]) -> dict:
    """``['x:0=batch[1,64]', 'y:0=batch']`` -> torch.export ``dynamic_shapes`` keyed by argument name.

    ``ARG:DIM=NAME[MIN,MAX]`` makes dim ``DIM`` of the forward argument ``ARG`` symbolic; dims
    with the same ``NAME`` are the same symbol. The range is optional and either end may be empty.
    """
    ranges: dict[str, tuple] = {}
    placed: list[tuple[str, int, str]] = []
    for spec in specs:
        match = _DYNAMIC.fullmatch(spec.replace(" ", ""))
        if not match:
            raise ValueError(f"--dynamic {spec!r}: expected ARG:DIM=NAME or ARG:DIM=NAME[MIN,MAX], "
                             "e.g. 'x:0=batch[1,64]'")
        bounds = tuple(int(match[key]) if match[key] else None for key in ("min", "max"))
        name = match["name"]
        if ranges.setdefault(name, bounds) != bounds:
            raise ValueError(f"--dynamic: dim {name!r} is given two ranges, {ranges[name]} and {bounds}")
        placed.append((match["arg"], int(match["dim"]), name))
    dims = {name: torch.export.Dim(name, min=low, max=high) for name, (low, high) in ranges.items()}
    shapes: dict[str, dict] = {}
    for arg, dim, name in placed:
        if dim in shapes.setdefault(arg, {}):
            raise ValueError(f"--dynamic: dim {dim} of {arg!r} is given twice")
        shapes[arg][dim] = dims[name]
    return shapes


def every_argument(model: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes: dict) -> dict:
    """``dynamic_shapes`` (from ``--dynamic``) naming every argument ``forward`` is called with, as torch.export
    wants: the ones not named get ``None`` (static)."""
    arguments = inspect.signature(model.forward).bind(*args, **kwargs).arguments
    unknown = sorted(set(dynamic_shapes) - set(arguments))
    if unknown:
        raise ValueError(f"--dynamic names {', '.join(map(repr, unknown))}, which forward is not called with "
                         f"(its arguments: {', '.join(arguments)})")
    return {name: dynamic_shapes.get(name) for name in arguments}


def parse_size(text: str) -> int:
    """``2GB``, ``500MB``, ``1.5GiB`` or a number of bytes."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 2GB, 500MB, 1048576)")
    size = int(float(match["number"]) * _UNITS[(match["unit"] or "B").upper()])
    if size <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r} must be positive")
    return size


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--traceback", action="store_true", help="print the traceback of an error")
    common.add_argument("--verbose", action="store_true", help="let third-party libraries log (PJRT, torchao, ...)")
    parser = argparse.ArgumentParser(prog=PROG, description="Convert torch models to StableHLO bundles and TF "
                                     "SavedModels; run, verify and inspect bundles.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    export = commands.add_parser("export", parents=[common], help="export a model to a bundle and/or a SavedModel",
                                 description="Export a model (MODULE:FACTORY, or a saved ExportedProgram .pt2) "
                                             "to a bundle and/or a TF SavedModel. The factory takes no arguments "
                                             "and returns (model, args), (model, args, kwargs) or an object with "
                                             "model/args/kwargs attributes.")
    export.add_argument("source", help="MODULE:FACTORY (importable from the current folder) or FILE.pt2")
    export.add_argument("--bundle", type=Path, help="write the bundle folder here")
    export.add_argument("--saved-model", type=Path, help="write a TF SavedModel folder here")
    export.add_argument("--signature-name", default="serving_default", help="SavedModel signature key")
    export.add_argument("--dynamic", action="append", default=[], metavar="ARG:DIM=NAME[MIN,MAX]",
                        help="make a dim symbolic, e.g. 'x:0=batch[1,64]' (repeatable; not for .pt2)")
    export.add_argument("--target-version", default=DEFAULT_TARGET,
                        help=f"StableHLO version to serialize at: {', '.join(TARGET_CHOICES)} or e.g. 1.10.0 "
                             f"(default {DEFAULT_TARGET})")
    export.add_argument("--shard-size", type=parse_size, default=DEFAULT_SHARD_BYTES,
                        help="largest weights file in the bundle, e.g. 500MB "
                             f"(default {human_size(DEFAULT_SHARD_BYTES)})")
    export.add_argument("--no-text", action="store_true", help="leave the readable module.mlir out of the bundle")
    export.set_defaults(run=_export)

    run = commands.add_parser("run", parents=[common], help="run a bundle on inputs from an .npz file",
                              description="Run a bundle on PJRT. The .npz holds one array per tensor input, "
                                          "named as in the bundle's signature (see inspect); outputs are "
                                          "written by their signature names (logits, pair.0, output_0, ...)")
    run.add_argument("bundle", type=Path)
    run.add_argument("--inputs", type=Path, required=True, help="inputs .npz")
    run.add_argument("--output", type=Path, required=True, help="outputs .npz to write")
    run.set_defaults(run=_run)

    verify = commands.add_parser("verify", parents=[common], help="compare a bundle's outputs with a golden",
                                 description="Run a bundle on a stored golden's inputs and compare with its "
                                             "outputs: max |error| <= tolerance * max |golden| per output "
                                             "(<= the abs tolerance instead, for quantized goldens).")
    verify.add_argument("bundle", type=Path)
    verify.add_argument("--golden", required=True,
                        help="a golden zoo model name (golden/data/NAME.safetensors) or a golden .safetensors file")
    verify.add_argument("--tolerance", type=float,
                        help="max |error| / max |golden| allowed per output (default: the golden's, from its "
                             f"manifest, else {zoo.F32_TOLERANCE:g})")
    verify.add_argument("--abs-tolerance", type=float,
                        help="max |error| allowed instead (default: the golden's, for quantized models)")
    verify.add_argument("--bisect", action="store_true",
                        help="also find the first op whose result disagrees with eager torch (the golden must be a "
                             "zoo model, which is rebuilt for it)")
    verify.add_argument("--bisect-report", type=Path, metavar="FILE.json",
                        help="write the bisect's finding as JSON here (for explore --divergence)")
    verify.set_defaults(run=_verify)

    inspect = commands.add_parser("inspect", parents=[common], help="show a bundle's signature, ops, versions, weights",
                                  description="Show a bundle's versions, signature, op histogram and weight "
                                              "sizes (the weights themselves are not read).")
    inspect.add_argument("bundle", type=Path)
    inspect.add_argument("--top", type=int, default=10, help="how many of the largest weights to list")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.add_argument("--shardings", action="store_true",
                         help="draw, for each weight and input, which part of it each device of the mesh holds")
    inspect.set_defaults(run=_inspect)

    coverage = commands.add_parser("coverage", parents=[common], help="write the core ATen op coverage report",
                                   description="Run the OpInfo sweep and write coverage.md and coverage.json: "
                                               "which core ATen ops have a StableHLO lowering, how torch's OpInfo "
                                               "samples fare per dtype and with a dynamic dim, and which ops have "
                                               "a quantized form.")
    coverage.add_argument("--out", type=Path, default=Path("docs"), help="folder to write to (default: docs)")
    coverage.add_argument("--ops", help="comma-separated OpInfo entries to sweep (default: all of op_db)")
    coverage.add_argument("--jobs", type=int, help="worker processes (default: one per CPU)")
    coverage.set_defaults(run=_coverage)

    explore = commands.add_parser("explore", parents=[common], help="draw a bundle's module in Model Explorer",
                                  description="Open the bundle's module in Model Explorer (a local server on "
                                              "127.0.0.1) with per-op source lines and, from a bisect report, "
                                              "the error of the op that disagrees with eager torch.")
    explore.add_argument("bundle", type=Path)
    explore.add_argument("--divergence", type=Path, metavar="REPORT.json",
                         help="a bisect report (verify --bisect-report) to overlay")
    explore.add_argument("--out", type=Path, metavar="FILE.json",
                         help="write the overlays as Model Explorer node data here instead of starting a server")
    explore.add_argument("--port", type=int, default=8080, help="the server's port (default: 8080)")
    explore.set_defaults(run=_explore)

    iree = commands.add_parser("iree", parents=[common], help="compile a bundle with IREE to a .vmfb",
                               description="Compile a bundle's module with IREE (the dev extra's iree-base-compiler). "
                                           "A dynamic module is specialised to --sizes first (see docs/iree.md).")
    iree.add_argument("bundle", type=Path)
    iree.add_argument("--out", type=Path, required=True, help=".vmfb to write")
    iree.add_argument("--sizes", type=parse_sizes, default=None, metavar="NAME=INT,...",
                      help="a size for every symbolic dim, named as in the signature, e.g. batch=4,seq=16")
    iree.add_argument("--target", default=TARGET, help=f"IREE target backend (default {TARGET}: the host CPU)")
    iree.set_defaults(run=_iree)

    serve = commands.add_parser("serve", parents=[common], help="serve an LLM with an OpenAI-compatible API",
                                description="Serve a transformers causal LM through the continuous-batching "
                                            "Engine: POST /v1/completions and /v1/chat/completions (streamed "
                                            "with stream: true), GET /v1/models, /health, /metrics. PATH is a "
                                            "checkpoint folder (config.json, *.safetensors, tokenizer files; "
                                            "exported on first use into a cached engine bundle) or an engine "
                                            "bundle (then --tokenizer). Needs the 'serve' extra.")
    serve.add_argument("path", type=Path, metavar="PATH", help="a transformers checkpoint folder or an engine bundle")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (default 8000)")
    serve.add_argument("--tokenizer", type=Path, help="the tokenizer's folder (default: PATH, for a checkpoint)")
    serve.add_argument("--model-name", help="the model's name in the API (default: PATH's folder name)")
    serve.add_argument("--slots", type=int, help="requests decoded at once, for a checkpoint's export (default 8)")
    serve.add_argument("--max-cache-len", type=int,
                       help="tokens per slot (prompt and answer), for a checkpoint's export (default: the "
                            "model's context, at most 2048)")
    serve.add_argument("--cache-dir", type=Path,
                       help="where exported engine bundles are cached (default: $TORCH_STABLEHLO_ENGINE_DIR or "
                            "~/.cache/torch-stablehlo/engines)")
    serve.add_argument("--max-queue", type=int, default=64,
                       help="requests waiting for a slot before new ones get 429 (default 64)")
    serve.add_argument("--chat-max-tokens", type=int, default=256,
                       help="max_tokens of a chat request that names none (default 256)")
    serve.add_argument("--ray", action="store_true", help="serve as Ray Serve replicas of the engine")
    serve.add_argument("--replicas", type=int, default=1, help="with --ray: how many replicas (default 1)")
    serve.add_argument("--replica-cpus", type=float, default=1.0, help="with --ray: CPUs Ray reserves per replica")
    serve.add_argument("--ray-address", help="with --ray: a running Ray cluster to join ('auto', HOST:6379); "
                                             "default: start a local one")
    serve.set_defaults(run=_serve)
    return parser


# -- commands -----------------------------------------------------------------------------------

def _export(options) -> int:
    if options.bundle is None and options.saved_model is None:
        raise ValueError("nothing to write: give --bundle DIR and/or --saved-model DIR")
    dynamic_shapes = parse_dynamic(options.dynamic) or None
    steps = 2 + (options.bundle is not None) + (options.saved_model is not None)
    with _progress(steps) as step:
        with step("loading the model"):
            model, args, kwargs = _load_source(options.source, dynamic=dynamic_shapes is not None)
        with step("exporting and converting to StableHLO"):
            if not isinstance(model, torch.export.ExportedProgram):
                if dynamic_shapes:
                    dynamic_shapes = every_argument(model, args, kwargs, dynamic_shapes)
                model = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes)
            artifact = export_to_stablehlo(model)
        written = []
        if options.bundle is not None:
            with step("writing the bundle"):
                path = artifact.save(options.bundle, target_version=options.target_version,
                                     shard_size=options.shard_size, include_text=not options.no_text)
                written.append(f"bundle: {path} ({human_size(_folder_bytes(path))})")
        if options.saved_model is not None:
            with step("writing the SavedModel"):
                path = artifact.save_tf_saved_model(options.saved_model, options.signature_name,
                                                    target_version=options.target_version)
                written.append(f"saved model: {path} ({human_size(_folder_bytes(path))}), "
                               f"signature {options.signature_name!r}")
    print(artifact.signature)
    print("\n".join(written))
    return 0


def _load_source(source: str, *, dynamic: bool):
    """(model or ExportedProgram, args, kwargs) from MODULE:FACTORY or a .pt2 file."""
    if source.endswith(".pt2"):
        if not Path(source).is_file():
            raise FileNotFoundError(f"{source}: no such file")
        if dynamic:
            raise ValueError("--dynamic applies to MODULE:FACTORY; a .pt2 program was exported with its own dims")
        return torch.export.load(source), (), {}
    module_name, _, factory_name = source.partition(":")
    if not module_name or not factory_name:
        raise ValueError(f"{source!r}: expected MODULE:FACTORY (e.g. mypkg.models:build) or a FILE.pt2")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a factory next to where the command runs, as `python -m` would find it
    factory = getattr(importlib.import_module(module_name), factory_name, None)
    if not callable(factory):
        raise ValueError(f"{module_name} has no callable {factory_name!r}")
    built = factory()
    if all(hasattr(built, key) for key in ("model", "args", "kwargs")):
        return built.model, tuple(built.args), dict(built.kwargs)
    if isinstance(built, tuple) and len(built) in (2, 3):
        model, args, kwargs = (*built, {}) if len(built) == 2 else built
        return model, tuple(args), dict(kwargs)
    raise TypeError(f"{source} returned a {type(built).__name__}; expected (model, args), (model, args, kwargs) "
                    "or an object with model/args/kwargs attributes")


def _run(options) -> int:
    with _progress(1) as step, step("loading, compiling and running"):
        outputs = run_npz(options.bundle, options.inputs, options.output)
    for name, value in outputs.items():
        print(printable(f"{name}: {value.dtype}{list(value.shape)}"))  # names from the bundle
    print(f"wrote {options.output}")
    return 0


def _verify(options) -> int:
    golden_file = Path(options.golden)
    name, data_dir = ((golden_file.stem, golden_file.parent) if golden_file.suffix == ".safetensors"
                      else (options.golden, store.DATA_DIR))
    golden = store.load_golden(name, data_dir)
    if options.tolerance is None and options.abs_tolerance is None:  # the golden's own, from its manifest
        record = store.read_manifest(data_dir)["models"].get(name, {})
        tolerance, abs_tolerance = record.get("tolerance", zoo.F32_TOLERANCE), record.get("abs_tolerance")
    else:
        tolerance = zoo.F32_TOLERANCE if options.tolerance is None else options.tolerance
        abs_tolerance = options.abs_tolerance
    with _progress(2) as step:
        with step("loading the bundle"):
            artifact = load_artifact(options.bundle)
        with step("compiling and running"):
            outputs = artifact(*golden.args, **golden.kwargs)
    comparison = store.compare_outputs(outputs, golden, tolerance, abs_tolerance)
    bound = f"abs tolerance {abs_tolerance:.3e}" if abs_tolerance is not None else f"tolerance {tolerance:.0e}"
    print(f"{'PASS' if comparison.ok else 'FAIL'}: {options.bundle} vs golden {name}: max abs error "
          f"{comparison.max_abs:.3e}, max rel error {comparison.max_rel:.3e} ({bound})"
          + "".join(f"; {problem}" for problem in comparison.problems))
    if options.bisect or options.bisect_report:
        _bisect(name, options.bisect_report)
    if not comparison.ok:
        print(f"{PROG} verify: outputs differ from golden {name}", file=sys.stderr)
    return 0 if comparison.ok else 1


def _bisect(name: str, report_path: Path | None) -> None:
    """Print (and write as JSON) the first op of zoo model ``name`` that disagrees with eager torch."""
    if name not in zoo.ZOO:
        raise ValueError(f"--bisect rebuilds the model, so --golden must name a zoo model "
                         f"({', '.join(zoo.ZOO)}), not {name!r}")
    built = zoo.ZOO[name].build()
    with _progress(1) as step, step("bisecting against eager torch"):
        divergence = find_divergence(built.model, built.args, built.kwargs)
    print(f"bisect: {divergence}" if divergence else "bisect: every op agrees with eager torch")
    if report_path:
        report_path.write_text(json.dumps(divergence.to_json() if divergence else None, indent=1))
        print(f"wrote {report_path}")


def _inspect(options) -> int:
    report = bundle_report(options.bundle, top=options.top)
    if options.shardings:
        signature = signature_from_json(report["signature"])
        if not signature.mesh:
            print(f"{options.bundle}: one device (exported without a mesh): nothing is sharded")
            return 0
        Console(highlight=False).print(plan_picture(ShardingPlan.of_signature(signature)))
        return 0
    print(json.dumps(report, indent=1) if options.json else format_report(report))
    return 0


def _explore(options) -> int:
    try:  # an optional dependency (the 'explore' extra), imported by the one command that draws
        from . import explore
    except ImportError as error:
        raise ImportError(f"explore needs Model Explorer: pip install 'torch-stablehlo-exporter[explore]' "
                          f"({error})") from error
    text = explore.module_path(options.bundle).read_text()
    divergence = json.loads(options.divergence.read_text()) if options.divergence else None
    shown = explore.overlays(text, divergence)
    if options.out:
        for path in explore.write_overlays(shown, options.out):
            print(f"wrote {path}")
        return 0
    explore.serve(options.bundle, shown, options.port)
    return 0


def _iree(options) -> int:
    artifact = load_artifact(options.bundle)
    with _progress(1) as step, step("compiling with IREE"):
        vmfb = compile_for_iree(artifact, options.sizes, target=options.target)
    options.out.write_bytes(vmfb)
    print(f"wrote {options.out} ({human_size(len(vmfb))}); @main takes the weights first, then the inputs")
    return 0


def _serve(options) -> int:
    try:  # optional dependencies (the 'serve' extra), imported by the one command that serves
        from torch_stablehlo.serving import launch
    except ImportError as error:
        raise ImportError(f"serve needs the serving stack: pip install 'torch-stablehlo-exporter[serve]' "
                          f"({error})") from error
    for name in ("slots", "max_cache_len", "max_queue", "chat_max_tokens", "replicas"):
        if getattr(options, name) is not None and getattr(options, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(options, name)}")
    if not options.ray and (options.replicas != 1 or options.ray_address):
        raise ValueError("--replicas and --ray-address go with --ray")
    served = launch.prepare(options.path, tokenizer=options.tokenizer, model_name=options.model_name,
                            slots=options.slots, max_cache_len=options.max_cache_len, cache_folder=options.cache_dir)
    settings = dict(host=options.host, port=options.port, max_queue=options.max_queue,
                    chat_max_tokens=options.chat_max_tokens)
    if options.ray:
        try:
            from torch_stablehlo.serving import ray_serve
        except ImportError as error:
            raise ImportError(f"serve --ray needs Ray Serve: pip install 'torch-stablehlo-exporter[serve]' "
                              f"({error})") from error
        ray_serve.serve_on_ray(served, replicas=options.replicas, replica_cpus=options.replica_cpus,
                               ray_address=options.ray_address, **settings)
    else:
        launch.serve_local(served, **settings)
    return 0


def _coverage(options) -> int:
    names = options.ops.split(",") if options.ops else None
    for path in write_report(options.out, names, options.jobs):
        print(f"wrote {path}")
    return 0


# -- plumbing -------------------------------------------------------------------------------------

@contextlib.contextmanager
def _progress(total: int):
    """A progress bar over a command's long steps, on stderr when it is a terminal; yields ``step(label)``."""
    bar = tqdm(total=total, file=sys.stderr, disable=None, leave=False,
               bar_format="{desc} [{n_fmt}/{total_fmt} steps, {elapsed}]")

    @contextlib.contextmanager
    def step(label: str):
        bar.set_description_str(label)
        yield
        bar.update()

    try:
        yield step
    finally:
        bar.close()


def _folder_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines() or [""]
    more = " (more with --traceback)" if len(lines) > 1 else ""
    return printable(f"{type(error).__name__}: {lines[0]}{more}")  # it may quote a bundle


def main(argv: list[str] | None = None) -> int:
    options = build_parser().parse_args(argv)
    if not options.verbose:
        quiet_third_party_logs()
    try:
        return options.run(options)
    except Exception as error:  # noqa: BLE001  (every failure becomes one line and exit status 1)
        if options.traceback:
            traceback.print_exc()
        print(f"{PROG} {options.command}: error: {_one_line(error)}", file=sys.stderr)
        return 1
