"""Run speed: our artifact on the PJRT CPU client against torch eager (``torch.no_grad``), same threads.

Every golden zoo model at a realistic size: text models batch 8 x 128 tokens, vision models
(ViT, CNN) batch 8 at 224x224, the MLP batch 1024; the quantized entries at their golden
size. Both sides get the same CPUs: the process is pinned to ``--threads`` CPUs
(``sched_setaffinity``, before torch and jaxlib start), torch uses that many threads
(``torch.set_num_threads``) and XLA's CPU client sizes its intra-op pool to the CPUs it may
use. Calls alternate between torch and ours; medians after warm-up.

Columns: ``ours`` is the whole call (inputs placed on the device, outputs back as torch
tensors); ``execute`` is the compiled executable alone on inputs already placed. Target:
ours <= 0.4x torch eager for GPT-2, Llama and BERT.

Then StableHLO ops per transformer layer, by op name: ops in ``@main`` of the model built
with 2 layers minus those with 1 layer (composite decompositions not counted: the SDPA
composite is one op), with torchax's count beside ours when torchax imports.

With ``--peer torchax``: GPT-2 12-layer (eager attention, which torchax can export) at 8 x 128, side by side
in this process on the same PJRT client: torch eager, our artifact call, and torchax's StableHLO module compiled
the way ours is (``runtime.pjrt.Executable``) and run on weights already on the device. torchax lives in its own venv
(``../shared/peers/torchax_venv.sh``; never our dependency): its Python exports the same saved
``ExportedProgram`` (``bench/peers/torchax_export.py``) and hands its module text and weights back.
Targets: ours <= 0.9x torchax and <= 0.6x eager.

    .venv/bin/python bench/run_speed.py [--threads N] [--repeats 5] [--models gpt2_12layer,bert]
    .venv/bin/python bench/run_speed.py --peer torchax [--peer-python /tmp/peers/venv-torchax/bin/python]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

TEXT = dict(batch=8, length=128)
VISION = dict(batch=8, image_size=224)
SIZES = {"mlp": dict(batch=1024), "cnn": VISION, "vit": VISION, "gpt2_2layer": TEXT, "gpt2_2layer_eager": TEXT,
         "gpt2_12layer": TEXT, "llama": TEXT, "bert": TEXT}
TARGETS = {"gpt2_2layer", "gpt2_2layer_eager", "gpt2_12layer", "llama", "bert"}
TARGET_RATIO = 0.4
PEER_TARGETS = {"torchax": 0.9, "eager": 0.6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", help="comma-separated zoo names (default: all)")
    parser.add_argument("--skip-ops", action="store_true", help="skip the ops-per-layer table")
    parser.add_argument("--peer", choices=["torchax"], help="only the side-by-side run against this peer")
    parser.add_argument("--peer-python", default="/tmp/peers/venv-torchax/bin/python",
                        help="the peer venv's Python (made by ../shared/peers/torchax_venv.sh)")
    options = parser.parse_args()
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:options.threads])  # before torch/XLA make pools

    import torch

    torch.set_num_threads(options.threads)
    if options.peer:
        print(f"threads: {options.threads} for torch and XLA; {options.repeats} timed calls each, alternating, "
              "medians")
        against_torchax(options.peer_python, options.repeats)
        return
    from torch_stablehlo.golden import zoo

    names = options.models.split(",") if options.models else zoo.names()
    print(f"threads: torch.set_num_threads({options.threads}); XLA CPU client pinned to the same "
          f"{options.threads} CPUs (sched_setaffinity); {options.repeats} timed calls each, alternating, medians")
    print(f"{'model':<24}{'inputs':<26}{'torch (s)':>10}{'ours (s)':>10}{'ratio':>7}{'execute (s)':>12}"
          f"{'ratio':>7}  target")
    for name in names:
        time_model(name, SIZES.get(name, {}), options.repeats)
    if not options.skip_ops:
        print()
        ops_per_layer()


def time_model(name: str, size: dict, repeats: int) -> None:
    import torch

    from torch_stablehlo.exporter import export_to_stablehlo
    from torch_stablehlo.exporter.conversion.calls import tensor_inputs
    from torch_stablehlo.golden import zoo
    from torch_stablehlo.runtime import pjrt
    from torch_stablehlo.stablehlo_ir.dtypes import to_numpy

    built = zoo.get(name).build(**size)
    model, args, kwargs = built.model, tuple(built.args), dict(built.kwargs)
    artifact = export_to_stablehlo(model, args, kwargs)
    tensors = tensor_inputs(artifact.signature, args, kwargs)

    def eager():
        with torch.no_grad():
            return model(*args, **kwargs)

    def ours():
        return artifact(*args, **kwargs)

    artifact(*args, **kwargs)  # compile, place weights
    hosts = [to_numpy(t) for t in tensors]
    executable = artifact._compiled([h.shape for h in hosts])
    device_inputs = artifact._held_on_device(executable) + executable.put(hosts)

    seconds = timed({"eager": eager, "ours": ours, "execute": lambda: executable.execute(device_inputs)}, repeats)
    eager_s, ours_s, execute_s = (seconds[k] for k in ("eager", "ours", "execute"))
    shapes = ", ".join("x".join(map(str, t.shape)) for t in tensors)
    target = (f"<= {TARGET_RATIO}: " + ("met" if ours_s / eager_s <= TARGET_RATIO else "missed")) \
        if name in TARGETS else ""
    print(f"{name:<24}{shapes[:25]:<26}{eager_s:>10.3f}{ours_s:>10.3f}{ours_s / eager_s:>7.2f}{execute_s:>12.3f}"
          f"{execute_s / eager_s:>7.2f}  {target}", flush=True)


def timed(calls: dict, repeats: int) -> dict:
    """Median seconds of each call, after one warm-up each; the calls alternate."""
    for fn in calls.values():
        fn()
    times = {label: [] for label in calls}
    for _ in range(repeats):
        for label, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(seconds) for label, seconds in times.items()}


# -- side by side with torchax ----------------------------------------------------------------

def against_torchax(peer_python: str, repeats: int) -> None:
    import numpy as np
    import torch
    import transformers as tf

    from torch_stablehlo.exporter import export_to_stablehlo
    from torch_stablehlo.golden import zoo
    from torch_stablehlo.runtime import pjrt
    from torch_stablehlo.stablehlo_ir.dtypes import to_torch

    class Logits(torch.nn.Module):  # a plain tensor out: a saved program with a ModelOutput does not load
        def __init__(self):
            super().__init__()
            self.lm = tf.GPT2LMHeadModel(tf.GPT2Config(use_cache=False, attn_implementation="eager")).eval()

        def forward(self, input_ids, attention_mask):
            return self.lm(input_ids=input_ids, attention_mask=attention_mask).logits

    torch.manual_seed(0)
    model = Logits().eval()
    ids = torch.randint(0, model.lm.config.vocab_size, (TEXT["batch"], TEXT["length"]), generator=zoo.example_generator())
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    program = torch.export.export(model, (), kwargs)
    with tempfile.TemporaryDirectory() as folder:
        torch.export.save(program, Path(folder, "program.pt2"))
        exported = subprocess.run([peer_python, str(Path(__file__).parent / "peers" / "torchax_export.py"),
                                   str(Path(folder, "program.pt2")), folder], capture_output=True, text=True)
        if exported.returncode:
            sys.exit(f"torchax export failed with {peer_python} (make its venv with ../shared/peers/torchax_venv.sh)"
                     f":\n{exported.stderr[-2000:]}")
        print(exported.stdout.strip().splitlines()[-1])
        peer = pjrt.Executable(Path(folder, "torchax.mlir").read_text())
        with np.load(Path(folder, "torchax_weights.npz")) as stored:
            peer_inputs = peer.put([stored[f"w{i}"] for i in range(len(stored.files) - 1)])
            inputs_kept = list(stored["inputs_kept"])
    host_inputs = [kwargs["input_ids"].numpy(), kwargs["attention_mask"].numpy()]
    # jax without x64 (as torchax runs) takes int64 token ids as int32
    peer_inputs += peer.put([host_inputs[i].astype(np.int32) for i in inputs_kept], first=len(peer_inputs))

    artifact = export_to_stablehlo(program)
    artifact(**kwargs)
    executable = artifact._compiled([])
    device_inputs = artifact._held_on_device(executable) + executable.put(host_inputs)

    def eager():
        with torch.no_grad():
            return model(**kwargs)

    ours_logits = artifact(**kwargs)
    peer_logits = to_torch(peer.execute(peer_inputs)[0])
    seconds = timed({"eager": eager, "ours": lambda: artifact(**kwargs),
                     "execute": lambda: executable.execute(device_inputs),
                     "torchax": lambda: peer.execute(peer_inputs)}, repeats)
    print(f"GPT-2 12-layer, eager attention, {TEXT['batch']} x {TEXT['length']} tokens; logits differ from torchax's "
          f"by at most {(ours_logits - peer_logits).abs().max().item():.2e}")
    for label in ("eager", "torchax", "ours", "execute"):
        ratios = "".join(f"   {seconds[label] / seconds[base]:.2f}x {base}" for base in ("eager", "torchax")
                         if label not in (base, "eager"))
        print(f"  {label:<9}{seconds[label]:8.3f} s{ratios}")
    for base, target in PEER_TARGETS.items():
        ratio = seconds["ours"] / seconds[base]
        print(f"target ours <= {target}x {base}: {ratio:.2f}x, {'met' if ratio <= target else 'missed'}")


# -- ops per transformer layer ---------------------------------------------------------------

def _layered(kind: str, layers: int):
    """(model, kwargs) of a zoo-like transformer with ``layers`` layers, small sizes (op counts do not depend
    on them)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 16))
    if kind == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(use_cache=False, n_layer=layers, n_embd=64, n_head=4,
                                                 vocab_size=100))
    elif kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
                                                   num_hidden_layers=layers, num_attention_heads=4,
                                                   num_key_value_heads=2, use_cache=False))
    else:
        model = tf.BertModel(tf.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=layers,
                                           num_attention_heads=4, intermediate_size=128))
    return model.eval(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


_OP = re.compile(r"^\s*(?:%\S+ = )?\"?((?:stablehlo|chlo|func)\.[a-z_]+)", re.M)


def main_ops(text: str) -> Counter:
    """Op names in ``@main`` of a module's text (private functions, e.g. composite decompositions, left out)."""
    start = text.index("func.func public @main") if "func.func public @main" in text else text.index("@main")
    body = text[start:]
    end = re.search(r"^  }", body, re.M)
    return Counter(op for op in _OP.findall(body[:end.start() if end else len(body)]) if op != "func.return")


def _torchax_text(model, kwargs) -> str:
    import torch
    import torchax.export

    program = torch.export.export(model, (), kwargs)
    return torchax.export.exported_program_to_stablehlo(program)[1].mlir_module()


def ops_per_layer() -> None:
    from torch_stablehlo.exporter import export_to_stablehlo

    try:
        import torchax.export  # noqa: F401
        torchax_error = None
    except Exception as error:  # noqa: BLE001  (not installed, or not importable with this torch)
        torchax_error = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    print("StableHLO ops per transformer layer in @main (2-layer model minus 1-layer model)"
          + ("" if torchax_error is None else f"; torchax unavailable ({torchax_error}): ours alone"))
    for kind in ("gpt2", "llama", "bert"):
        counts = {}
        for exporter_name in ("ours", "torchax") if torchax_error is None else ("ours",):
            per_layers = []
            for layers in (1, 2):
                model, kwargs = _layered(kind, layers)
                text = export_to_stablehlo(model, (), kwargs).stablehlo_text if exporter_name == "ours" \
                    else _torchax_text(model, kwargs)
                per_layers.append(main_ops(text))
            counts[exporter_name] = per_layers[1] - per_layers[0]
        ours = counts["ours"]
        line = f"{kind:<6} ours {sum(ours.values()):>4} ops/layer"
        if "torchax" in counts:
            line += f", torchax {sum(counts['torchax'].values()):>4}"
        print(line)
        names = sorted(set(ours) | set(counts.get("torchax", {})), key=lambda op: -ours.get(op, 0))
        print("       " + ", ".join(f"{op.split('.', 1)[1]} {ours.get(op, 0)}"
                                    + (f"/{counts['torchax'].get(op, 0)}" if "torchax" in counts else "")
                                    for op in names))


if __name__ == "__main__":
    main()
