"""A decoder with more than 2 GB of f32 weights: export, save, load and serve, with peak memory per step.

Builds a Llama-style model from a config with random weights (default ~1B parameters, about
4 GB of f32), then runs each step in a fresh process and prints its peak RSS against the
weight size:

    export+save   torch model -> ExportedProgram -> StableHLO -> bundle (sharded safetensors);
                  target: peak RSS < 2x the weights (the model itself is 1x)
    load+run      load_artifact(bundle) and one call on PJRT, checked against eager's logits
    saved_model   the bundle -> TF SavedModel (weights as tf.Variables, > 2 GB of variables)
    tf load+run   tf.saved_model.load and its serving signature, checked against eager's logits

    .venv/bin/python bench/multi_gb_export.py [--layers 20] [--shard-gb 1] [--out DIR]   # or: make bench-large
    .venv/bin/python bench/multi_gb_export.py --layers 1 --hidden 64 --intermediate 128 --heads 4 --vocab 512
                                              # a tiny model: seconds, to check that every step still runs

Needs about 3x the weight size of free disk (bundle + SavedModel) and of memory (the serving steps);
takes a few minutes. Not part of ``make test``; tests/exporter/formats/test_bundle.py covers the sharded path.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = ("export", "load", "saved_model", "tf_load")
TOKENS = (1, 8)
TOLERANCE = 1e-4  # of the largest |logit|, as for the float32 goldens


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def build(options):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=options.vocab, hidden_size=options.hidden, intermediate_size=options.intermediate,
                         num_hidden_layers=options.layers, num_attention_heads=options.heads,
                         num_key_value_heads=options.heads // 4, max_position_embeddings=256,
                         tie_word_embeddings=False, use_cache=False)
    torch.manual_seed(0)
    with torch.no_grad():
        model = LlamaForCausalLM(config).eval()
    return model, build_inputs(options)


def step_export(options, work: Path) -> dict:
    import numpy as np
    import torch

    from torch_stablehlo.exporter import export_to_stablehlo

    model, input_ids = build(options)
    weight_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    params = sum(p.numel() for p in model.parameters())
    after_build = peak_rss_bytes()
    with torch.no_grad():
        np.save(work / "eager_logits.npy", model(input_ids=input_ids).logits.numpy())
    start = time.perf_counter()
    artifact = export_to_stablehlo(model, (), {"input_ids": input_ids})
    exported = time.perf_counter()
    assert all(w.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
               for w, p in zip((artifact.weights[n] for n in model.state_dict()), model.state_dict().values())), \
        "the artifact holds the model's own tensors, not copies"
    artifact.save(work / "bundle", shard_size=int(options.shard_gb * 1024 ** 3))
    return {"params": params, "weight_bytes": weight_bytes, "after_build_rss": after_build,
            "export_s": exported - start, "save_s": time.perf_counter() - exported,
            "text_bytes": len(artifact.stablehlo_text),
            "shards": len(list((work / "bundle").glob("weights*.safetensors")))}


def step_load(options, work: Path) -> dict:
    import numpy as np
    import torch

    from torch_stablehlo.exporter import load_artifact

    start = time.perf_counter()
    artifact = load_artifact(work / "bundle")
    loaded = time.perf_counter()
    input_ids = build_inputs(options)
    logits = artifact(input_ids=input_ids).logits
    expected = torch.from_numpy(np.load(work / "eager_logits.npy"))
    return {"load_s": loaded - start, "run_s": time.perf_counter() - loaded,
            "max_abs_error": float((logits - expected).abs().max()), "max_abs_logit": float(expected.abs().max())}


def step_saved_model(options, work: Path) -> dict:
    from torch_stablehlo.exporter import load_artifact

    start = time.perf_counter()
    load_artifact(work / "bundle").save_tf_saved_model(work / "saved_model")
    variables = sum(f.stat().st_size for f in (work / "saved_model" / "variables").iterdir())
    return {"saved_model_s": time.perf_counter() - start, "variables_bytes": variables,
            "graph_bytes": (work / "saved_model" / "saved_model.pb").stat().st_size}


def step_tf_load(options, work: Path) -> dict:
    import numpy as np
    import tensorflow as tf

    start = time.perf_counter()
    served = tf.saved_model.load(str(work / "saved_model"))
    loaded = time.perf_counter()
    input_ids = build_inputs(options)
    outputs = served.signatures["serving_default"](input_ids=tf.constant(input_ids.numpy()))
    if "logits" not in outputs:  # outputs are named as in the signature: ModelOutput fields by their names
        raise KeyError(f"the SavedModel's serving_default returns {sorted(outputs)}, no 'logits'")
    expected = np.load(work / "eager_logits.npy")
    return {"tf_load_s": loaded - start, "tf_run_s": time.perf_counter() - loaded,
            "max_abs_error": float(np.abs(outputs["logits"].numpy() - expected).max())}


def build_inputs(options):
    import torch

    return torch.randint(0, options.vocab, TOKENS, generator=torch.Generator().manual_seed(0))


def run_step(step: str, options, work: Path) -> dict:
    """Run one step in a fresh process, so its peak RSS is its own."""
    command = [sys.executable, __file__, "--step", step, "--work", str(work), "--layers", str(options.layers),
               "--hidden", str(options.hidden), "--intermediate", str(options.intermediate),
               "--heads", str(options.heads), "--vocab", str(options.vocab), "--shard-gb", str(options.shard_gb)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"step {step} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--heads", type=int, default=32, help="attention heads (a multiple of 4: 4 per KV head)")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--shard-gb", type=float, default=1.0, help="bundle shard size in GiB")
    parser.add_argument("--out", type=Path, help="work folder, kept (default: a temporary one, removed)")
    parser.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.step:  # a child process: one step, its figures as one JSON line
        figures = globals()[f"step_{options.step}"](options, options.work)
        print(json.dumps(dict(figures, peak_rss=peak_rss_bytes())))
        return

    work = options.out or Path(tempfile.mkdtemp(prefix="multi-gb-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        results = {}
        for step in STEPS:
            print(f"{step} ...", flush=True)
            results[step] = run_step(step, options, work)
        report(results)
    finally:
        if options.out is None:
            shutil.rmtree(work, ignore_errors=True)
    scale = results["load"]["max_abs_logit"]
    wrong = [f"{step}: max |error| {results[step]['max_abs_error']:.2e} > {TOLERANCE} x max |logit| {scale:.2f}"
             for step in ("load", "tf_load") if not results[step]["max_abs_error"] <= TOLERANCE * scale]
    if wrong:
        raise SystemExit("logits differ from eager's: " + "; ".join(wrong))


def report(results: dict) -> None:
    export = results["export"]
    weights = export["weight_bytes"]
    gb = 1024 ** 3
    print(f"\nmodel: Llama-style decoder, {export['params'] / 1e9:.2f} B parameters, {weights / gb:.2f} GiB of f32 "
          f"weights; bundle in {export['shards']} shards; StableHLO text {export['text_bytes'] / 1024:.0f} KiB "
          f"(no weights in it)")
    print(f"export {export['export_s']:.1f} s, save {export['save_s']:.1f} s; "
          f"RSS after building the model {export['after_build_rss'] / gb:.2f} GiB")
    print(f"{'step':<14}{'peak RSS (GiB)':>16}{'/ weights':>11}   notes")
    notes = {
        "export": "target < 2.0",
        "load": f"max |error| {results['load']['max_abs_error']:.2e} (max |logit| "
                f"{results['load']['max_abs_logit']:.2f})",
        "saved_model": f"variables {results['saved_model']['variables_bytes'] / gb:.2f} GiB, graph "
                       f"{results['saved_model']['graph_bytes'] / 1024:.0f} KiB",
        "tf_load": f"max |error| {results['tf_load']['max_abs_error']:.2e}",
    }
    for step in STEPS:
        peak = results[step]["peak_rss"]
        print(f"{step:<14}{peak / gb:>16.2f}{peak / weights:>11.2f}   {notes[step]}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
