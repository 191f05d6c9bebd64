"""Conversion speed: ExportedProgram -> StableHLO text, against ``ep.run_decompositions()``.

Both are measured on the same program in the same run (median of several runs); the ratio is
what matters. Four tables:

- GPT-2 12-layer (768 wide), sdpa and eager attention: target <= 0.15 s.
- every golden zoo model (``golden.zoo``), at its golden size.
- transformers models whose graphs once needed a re-trace (``aten.pad``, ``detach_``, in-place ops on
  temporaries, in-place static KV-cache writes): MobileNetV2, Swin, Mistral, ResNet and a Llama decoder step with
  a static cache, tiny sizes from configs (nothing downloaded); each should convert in <= 0.2 s.
- linearity: a 1024-wide GPT-2 decoder at 2, 12 and 24 layers (built on the meta device: conversion
  never reads weight values), with the time per graph node, which should stay flat, and a
  least-squares line time = a + b * nodes.

    .venv/bin/python bench/convert_speed.py [--repeats 5] [--skip-zoo] [--small]

``--small``: every table at tiny sizes (GPT-2 2 layers x 64 wide, the zoo's ``mlp`` only, linearity at 1, 2 and 3
layers x 64 wide), one repeat: seconds, to check that the script runs; its figures say nothing about speed.

The machine may be shared: medians, and ratios of two figures measured in the same run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from torch_stablehlo.exporter import export_to_stablehlo

HEADER = (f"{'model':<26}{'nodes':>7}{'first (s)':>10}{'ours (s)':>10}{'run_decompositions (s)':>24}{'ratio':>8}"
          f"{'us/node':>9}")


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gpt2_program(attention: str = "sdpa", layers: int = 12, width: int = 768, heads: int = 12,
                 meta: bool = False) -> torch.export.ExportedProgram:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(use_cache=False, attn_implementation=attention, n_layer=layers, n_embd=width, n_head=heads)
    with torch.device("meta" if meta else "cpu"):
        model = GPT2LMHeadModel(config).eval()
        input_ids = torch.zeros((1, 16), dtype=torch.long)
    return torch.export.export(model, (input_ids,))


def zoo_program(name: str) -> torch.export.ExportedProgram:
    from torch_stablehlo.golden import zoo
    from torch_stablehlo.quantize import plain_quantized_weights

    built = zoo.get(name).build()
    return torch.export.export(plain_quantized_weights(built.model), tuple(built.args), built.kwargs)


def mobilenet_v2():
    from transformers import MobileNetV2Config, MobileNetV2Model

    return MobileNetV2Model(MobileNetV2Config(image_size=32, depth_multiplier=0.35)), (_image(),), {}


def swin():
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(image_size=36, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)
    return SwinModel(config), (_image(36),), {}  # 9x9 patches: windows of 4 pad them (aten.pad)


def mistral():
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(use_cache=False, **_DECODER)), (_tokens(16),), {}


def resnet():
    from transformers import ResNetConfig, ResNetModel

    return ResNetModel(ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1])), (_image(),), {}


def static_cache_llama():
    """One decoder step of a Llama writing its static KV cache (``index_copy_`` into the cache tensors)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model = LlamaForCausalLM(LlamaConfig(**_DECODER))
    model.generation_config.use_cache, model.generation_config.cache_implementation = True, "static"
    step = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=32)
    return step, (), {"input_ids": _tokens(4), "cache_position": torch.arange(4)}


_DECODER = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2)
TRANSFORMERS_MODELS = {"mobilenet_v2": mobilenet_v2, "swin": swin, "mistral": mistral, "resnet": resnet,
                       "llama-static-cache": static_cache_llama}


def _image(size: int = 32) -> torch.Tensor:
    return torch.randn((1, 3, size, size), generator=torch.Generator().manual_seed(0))


def _tokens(length: int) -> torch.Tensor:
    return torch.randint(0, 128, (1, length), generator=torch.Generator().manual_seed(0))


def transformers_program(name: str) -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    model, args, kwargs = TRANSFORMERS_MODELS[name]()
    return torch.export.export(model.eval(), args, kwargs)


def measure(name: str, program: torch.export.ExportedProgram, repeats: int) -> tuple[int, float]:
    """Prints one row (the first call, imports and caches included, then the median); returns (nodes, our
    median seconds)."""
    start = time.perf_counter()
    export_to_stablehlo(program)
    first = time.perf_counter() - start
    ours = median_seconds(lambda: export_to_stablehlo(program), repeats)
    try:
        baseline = median_seconds(lambda: program.run_decompositions(), max(1, repeats // 2))
        baseline_text, ratio = f"{baseline:.3f}", f"{ours / baseline:.3f}"
    except Exception as error:  # noqa: BLE001  (some programs cannot be decomposed here; say so)
        baseline_text, ratio = f"fails ({type(error).__name__})", "-"
    nodes = len(program.graph.nodes)
    print(f"{name:<26}{nodes:>7}{first:>10.3f}{ours:>10.3f}{baseline_text:>24}{ratio:>8}{ours / nodes * 1e6:>9.0f}",
          flush=True)
    return nodes, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-zoo", action="store_true", help="only the GPT-2 tables")
    parser.add_argument("--small", action="store_true", help="tiny sizes, one repeat: checks that the script runs")
    options = parser.parse_args()
    if options.small:
        options.repeats = 1
    gpt2 = dict(layers=2, width=64, heads=4) if options.small else dict(layers=12, width=768, heads=12)
    linearity = (dict(layers=(1, 2, 3), width=64, heads=4) if options.small
                 else dict(layers=(2, 12, 24), width=1024, heads=16))

    print("transformers models that once needed a re-trace (target: <= 0.2 s)")
    print(HEADER)
    for name in TRANSFORMERS_MODELS:
        measure(name, transformers_program(name), options.repeats)

    print(f"\nGPT-2 {gpt2['layers']}-layer, {gpt2['width']} wide (target at 12 layers, 768 wide: <= 0.15 s)")
    print(HEADER)
    for attention in ("sdpa", "eager"):
        measure(f"gpt2-{gpt2['layers']}layer/{attention}", gpt2_program(attention, **gpt2), options.repeats)

    if not options.skip_zoo:
        from torch_stablehlo.golden import zoo

        print("\ngolden zoo")
        print(HEADER)
        for name in ["mlp"] if options.small else zoo.names():
            measure(name, zoo_program(name), options.repeats)

    width, heads = linearity["width"], linearity["heads"]
    print(f"\nlinearity: GPT-2 decoder {width} wide, {heads} heads (meta weights)")
    print(HEADER)
    points = [measure(f"gpt2-{width}w-{layers}layer", gpt2_program(layers=layers, width=width, heads=heads, meta=True),
                      options.repeats) for layers in linearity["layers"]]
    slope, intercept = _fit(points)
    worst = max(abs(t - (intercept + slope * n)) / t for n, t in points)
    first, last = linearity["layers"][0], linearity["layers"][-1]
    print(f"fit: time = {intercept * 1e3:.1f} ms + {slope * 1e6:.0f} us x nodes; largest deviation from the "
          f"line {worst:.1%}; us/node {first}->{last} layers: {points[0][1] / points[0][0] * 1e6:.0f} -> "
          f"{points[-1][1] / points[-1][0] * 1e6:.0f}")


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    xs, ys = [n for n, _ in points], [t for _, t in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return slope, mean_y - slope * mean_x


if __name__ == "__main__":
    main()
