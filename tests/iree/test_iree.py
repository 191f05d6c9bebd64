"""IREE as a second consumer: the golden zoo's float models compiled by IREE for the host CPU (llvm-cpu) and run by
its runtime, against the stored goldens (static) and eager torch (dynamic, specialised by ``iree_module``) at
the zoo's tolerance. Each module is compiled once per session. ``make test`` takes a fixed sample of the models
(``STATIC_SAMPLE``, ``DYNAMIC_SAMPLE`` at one of its sizes); ``--full-sweep`` every float zoo model."""
from __future__ import annotations

import functools

import iree.runtime as ireert
import numpy as np
import pytest
import torch

from torch_stablehlo.exporter import compile_for_iree, export_to_stablehlo, iree_module
from torch_stablehlo.exporter.conversion.calls import output_values, tensor_inputs
from torch_stablehlo.golden import dynamic, store, zoo
from torch_stablehlo.stablehlo_ir.op_counts import count_ops
from torch_stablehlo.tools.model_table import MODELS

from ..conftest import sampled

STATIC = ["mlp", "cnn", "gpt2_2layer", "gpt2_2layer_eager", "gpt2_12layer", "llama", "bert", "vit", "cond_heads",
          "rnn_scan", "decoder_scan_layers"]
DYNAMIC = ["gpt2_2layer", "bert", "llama"]
SIZES = [{"batch": 1, "length": 2}, {"batch": 3, "length": 17}]
# make test's fixed sample, one model of each kind IREE compiles differently (dense, convolution, attention,
# case, while), the dynamic one at one size, ResNet specialised; --full-sweep takes every float zoo model, both
# sizes and ResNet static too
STATIC_SAMPLE = ["mlp", "cnn", "gpt2_2layer", "cond_heads", "rnn_scan"]
DYNAMIC_SAMPLE = ["gpt2_2layer"]
SIZES_SAMPLE = SIZES[1:]


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ == "test_static_model_compiles_and_matches_golden":
        sampled(metafunc, "name", STATIC, STATIC_SAMPLE)
    elif metafunc.function.__name__ == "test_dynamic_text_model_specialised_matches_eager":
        sampled(metafunc, "name", DYNAMIC, DYNAMIC_SAMPLE)
        sampled(metafunc, "size", SIZES, SIZES_SAMPLE, ids=lambda s: "x".join(map(str, s.values())))
    elif metafunc.function.__name__ == "test_resnet_compiles_and_matches_eager":
        sampled(metafunc, "dynamic_batch", [False, True], [True], ids=lambda dynamic: "specialised" if dynamic
                else "static")


def run_in_iree(vmfb: bytes, artifact, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """``@main``'s results for the model's inputs (weights first), run by IREE's local-task driver."""
    weights = [artifact.weights[slot.target] for slot in artifact.signature.weights]
    inputs = weights + tensor_inputs(artifact.signature, args, kwargs)
    module = ireert.load_vm_flatbuffer(vmfb, driver="local-task")
    results = module.main(*[np.ascontiguousarray(t.detach().numpy()) for t in inputs])
    results = results if isinstance(results, (list, tuple)) else [results]
    return [torch.from_numpy(np.asarray(r.to_host())) for r in results]


@functools.lru_cache(maxsize=None)
def static_case(name: str):
    """(artifact, vmfb, golden) of a zoo model exported at its golden size."""
    built = zoo.get(name).build()
    artifact = export_to_stablehlo(built.model, tuple(built.args), dict(built.kwargs))
    return artifact, compile_for_iree(artifact), store.load_golden(name)


@functools.lru_cache(maxsize=None)
def dynamic_case(name: str):
    """(model, artifact) of a zoo model's dynamic variant: one export, symbolic batch and sequence."""
    built, artifact = dynamic.export_variant(name)
    return built.model, artifact


def test_every_float_zoo_model_is_checked():
    assert sorted(STATIC) == sorted(set(zoo.names()) - set(zoo.names("quantized")))
    assert set(STATIC_SAMPLE) <= set(STATIC) and set(DYNAMIC_SAMPLE) <= set(DYNAMIC)


def test_static_model_compiles_and_matches_golden(name):
    artifact, vmfb, golden = static_case(name)
    results = run_in_iree(vmfb, artifact, golden.args, golden.kwargs)
    comparison = store.compare(output_values(artifact.signature, results), golden.outputs, zoo.get(name).tolerance)
    assert comparison.ok, f"{name} in IREE: max rel error {comparison.max_rel:.2e} {comparison.problems}"


def test_dynamic_text_model_specialised_matches_eager(name, size):
    model, artifact = dynamic_case(name)
    dims = {zoo.DynamicVariant.DIM_NAMES[k]: v for k, v in size.items()}
    inputs = zoo.get(name).build(**size)
    results = run_in_iree(compile_for_iree(artifact, dims), artifact, inputs.args, inputs.kwargs)
    with torch.no_grad():
        expected = torch.utils._pytree.tree_flatten(model(*inputs.args, **inputs.kwargs))[0]
    comparison = store.compare(output_values(artifact.signature, results), expected, zoo.get(name).tolerance)
    assert comparison.ok, f"{name} {size} in IREE: max rel error {comparison.max_rel:.2e} {comparison.problems}"
    assert "?" not in iree_module(artifact, dims).split("func.func public @main")[1].split("{")[0]


def test_dynamic_mlp_compiles_as_it_is():
    """A dynamic module without gathers over two symbolic dims needs no specialising: IREE lowers its dynamic
    broadcasts, which say which dims expand."""
    model, artifact = dynamic_case("mlp")
    vmfb = compile_for_iree(artifact)
    for batch in (1, 5):
        inputs = zoo.get("mlp").build(batch=batch)
        with torch.no_grad():
            expected = [model(*inputs.args)]
        results = output_values(artifact.signature, run_in_iree(vmfb, artifact, inputs.args, inputs.kwargs))
        assert store.compare(results, expected, zoo.get("mlp").tolerance).ok


def test_dynamic_gpt2_is_close_to_its_static_twin_in_ops():
    """One shape tensor per distinct shape, sizes read once, no broadcast to the sizes a value has: the module
    with symbolic batch and sequence has at most 15% more ops than the same model exported static."""
    model, artifact = dynamic_case("gpt2_2layer")
    twin = zoo.get("gpt2_2layer").build(**zoo.get("gpt2_2layer").dynamic.example)  # the same sizes, static
    static = export_to_stablehlo(model, tuple(twin.args), dict(twin.kwargs))
    dynamic_ops, static_ops = count_ops(artifact.stablehlo_text), count_ops(static.stablehlo_text)
    assert dynamic_ops <= 1.15 * static_ops, f"dynamic {dynamic_ops} ops, static {static_ops}"


def test_resnet_compiles_and_matches_eager(dynamic_batch):
    """transformers' ResNetModel (the model sweep's tiny config): its last stage convolves a 2x2 map with a 3x3,
    stride 2, padding 1 kernel into one row, which IREE compiles once the unread padding row is dropped."""
    entry = MODELS["resnet"]
    model, example, inputs = entry.build(), entry.inputs(), entry.inputs(dynamic=dynamic_batch)
    program = torch.export.export(model, (), example, strict=False,
                                  dynamic_shapes=entry.dynamic_shapes() if dynamic_batch else None)
    artifact = export_to_stablehlo(program)
    sizes = {"batch": len(inputs["pixel_values"])} if dynamic_batch else None
    results = run_in_iree(compile_for_iree(artifact, sizes), artifact, (), inputs)
    with torch.no_grad():
        expected = torch.utils._pytree.tree_flatten(model(**inputs))[0]
    comparison = store.compare(output_values(artifact.signature, results), expected, zoo.F32_TOLERANCE)
    assert comparison.ok, f"resnet in IREE: max rel error {comparison.max_rel:.2e} {comparison.problems}"


def test_sizes_must_name_every_symbolic_dim_in_range():
    _, artifact = dynamic_case("gpt2_2layer")
    with pytest.raises(ValueError, match="missing"):
        iree_module(artifact, {"batch": 2})
    with pytest.raises(ValueError, match="outside its range"):
        iree_module(artifact, {"batch": 2, "seq": 1000})


def test_cli_compiles_a_bundle(tmp_path):
    from torch_stablehlo.tools.cli import main

    _, artifact = dynamic_case("mlp")
    bundle, vmfb = artifact.save(tmp_path / "mlp"), tmp_path / "mlp.vmfb"
    assert main(["iree", str(bundle), "--out", str(vmfb), "--sizes", "batch=3"]) == 0
    inputs = zoo.get("mlp").build(batch=3)
    results = output_values(artifact.signature, run_in_iree(vmfb.read_bytes(), artifact, inputs.args, inputs.kwargs))
    assert results[0].shape[0] == 3
