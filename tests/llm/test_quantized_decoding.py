"""A decoder quantized with torchao (``quantize_``), through transformers' static-cache recipe exported with
``torch.export.export`` (strict=False: the weights are tensor subclasses, which torch.export unwraps into ops on
their inner tensors), decodes like torch running the same quantized model: teacher-forced logits within a stated
tolerance at every step, and greedy tokens equal up to the first step where torch's top-2 logit margin is below
that tolerance. The compiled module holds the forms XLA's CPU backend runs fast (``stablehlo_ir.int8_products``).

Tolerances, on logits spanning about 20 (tiny Llama, initializer range 0.5): weight-only int8 and int4 group-wise
1e-3 (measured under 1e-4: float32 sums in another order); dynamic int8 activations 0.5 (measured up to 0.35): an
activation whose float value differs from torch's by an ulp (another summation order upstream) can round to the
next int8 step, which moves the logits by that step times the weights. A single quantized linear, where the
activations are torch's own, is within 1e-5 for every config.

torchao's dynamic int8 path takes one of two forms by CPU (``torchao.kernel.intmm._int_scaled_matmul_cpu``): int8
x int8 products, or, on a CPU with VNNI and no AMX, the int8 activations shifted into uint8 and the product
corrected by the weight's column sums. ``int8_dynamic`` is the form this CPU takes; ``int8_dynamic/s8`` and
``int8_dynamic/u8`` force one (torchao's ISA probes patched while it traces and runs), so both are tested on any
x86 CPU: their products and single linears in ``make test``, the decoding of the form this CPU does not take under
``--full-sweep`` (half a minute).
"""
import contextlib
import copy
import functools
from unittest import mock

import pytest
import torch
from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, IntxWeightOnlyConfig,
                                  quantize_)
from torchao.kernel import intmm
from torchao.quantization.granularity import PerGroup
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

from torch_stablehlo import export_to_stablehlo
from torch_stablehlo.stablehlo_ir.int8_products import has_uint8_activations
from torch_stablehlo.stablehlo_ir.passes import prepare_for_xla

from ..conftest import full_sweep

PROMPT = [3, 17, 42, 9, 5, 77]
NEW_TOKENS = 24
CACHE = 64
CONFIGS = {"int8_weight_only": Int8WeightOnlyConfig,
           "int8_dynamic": Int8DynamicActivationInt8WeightConfig,
           "int4_group32": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))}
TOLERANCE = {"int8_weight_only": 1e-3, "int8_dynamic": 0.5, "int4_group32": 1e-3}
# the int8 products XLA compiles: rows x depth int8 operand (3 digits of one float row; one int8 row padded to 2)
FAST_ROWS = {"int8_weight_only": 3, "int8_dynamic": 2, "int4_group32": None}
# torchao's dynamic int8 form on this CPU (as _int_scaled_matmul_cpu chooses it)
NATIVE_FORM = "u8" if intmm._cpu_is_vnni_supported() and not intmm._cpu_is_amx_tile_supported() else "s8"


def _config_and_form(name: str) -> tuple[str, str]:
    """("int8_dynamic", "u8") for "int8_dynamic/u8"; a name without a form: this CPU's."""
    config, _, form = name.partition("/")
    return config, form or NATIVE_FORM


def _form(form: str):
    """torchao's dynamic int8 products in ``form`` while the block runs, whatever the CPU."""
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(intmm, "_cpu_is_vnni_supported", lambda: form == "u8"))
    stack.enter_context(mock.patch.object(intmm, "_cpu_is_amx_tile_supported", lambda: False))
    return stack


@functools.cache
def _float_model():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, tie_word_embeddings=False, initializer_range=0.5, max_position_embeddings=256)).eval()
    model.generation_config.cache_implementation = "static"
    return model


def _quantized(name: str):
    """The recipe's module around the quantized model (torch runs torchao's kernels), and our artifact of it."""
    return _quantized_in(*_config_and_form(name))


@functools.cache
def _quantized_in(config: str, form: str):
    model = copy.deepcopy(_float_model())
    quantize_(model, CONFIGS[config]())
    recipe = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=CACHE).model
    step = {"input_ids": torch.tensor([[0]]), "cache_position": torch.tensor([0])}
    with _form(form):
        program = torch.export.export(recipe, (), step, strict=False)
    return recipe, export_to_stablehlo(program)


def _step(run, token: int, position: int) -> torch.Tensor:
    with torch.no_grad():
        return run(input_ids=torch.tensor([[token]]), cache_position=torch.tensor([position]))[0, -1]


def _greedy(run) -> tuple[list[int], list[torch.Tensor]]:
    """The recipe's runner loop: the prompt token by token, then greedy; the tokens and each step's logits."""
    logits = [_step(run, token, position) for position, token in enumerate(PROMPT)]
    tokens = list(PROMPT)
    for _ in range(NEW_TOKENS):
        tokens.append(int(logits[-1].argmax()))
        logits.append(_step(run, tokens[-1], len(tokens) - 1))
    return tokens, logits


def _reset(recipe) -> None:
    for buffer in recipe.buffers():
        buffer.zero_()


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ == "test_decodes_like_torch_running_the_quantized_model":
        other = ["int8_dynamic/" + {"s8": "u8", "u8": "s8"}[NATIVE_FORM]] if full_sweep(metafunc.config) else []
        metafunc.parametrize("name", [*CONFIGS, *other])


def test_decodes_like_torch_running_the_quantized_model(name):
    recipe, artifact = _quantized(name)
    config, form = _config_and_form(name)
    tolerance = TOLERANCE[config]
    _reset(recipe)
    with _form(form):  # torch eager in the same form
        expected, expected_logits = _greedy(recipe)

    artifact.reset_state()  # teacher-forced: torch's tokens fed to both, logits compared at every step
    for position, token in enumerate(expected[:-1]):
        torch.testing.assert_close(_step(artifact, token, position), expected_logits[position], rtol=0,
                                   atol=tolerance, msg=f"{name}: logits at step {position}")

    artifact.reset_state()
    tokens, _ = _greedy(artifact)
    differing = [i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b]
    if differing:
        step = differing[0] - 1  # the step whose logits chose the first differing token
        top2 = expected_logits[step].topk(2).values
        assert float(top2[0] - top2[1]) < tolerance, f"{name}: tokens differ at {differing[0]}: {tokens} {expected}"
    assert len(set(expected[len(PROMPT):])) > 3, "greedy decoding should not settle on one token"


@pytest.mark.parametrize("name", ["int8_weight_only", "int8_dynamic", "int8_dynamic/s8", "int8_dynamic/u8"])
def test_xla_runs_int8_products(name):
    """Every linear is an int8 x int8 -> int32 dot_general in the module XLA compiles: the float row split into
    3 int8 digits (weight-only), the int8 row padded to 2 (dynamic, torchao's uint8 rows shifted back to int8 and
    its correction gone); the weights read as stored, int8."""
    _, artifact = _quantized(name)
    config, form = _config_and_form(name)
    rows = FAST_ROWS[config]
    assert has_uint8_activations(artifact.stablehlo_text) == (config == "int8_dynamic" and form == "u8")
    text = prepare_for_xla(artifact.stablehlo_text)
    products = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    int8 = [line for line in products if f"(tensor<{rows}x64xi8>" in line or f"(tensor<{rows}x128xi8>" in line]
    assert len(int8) == 2 * 7 + 1, "7 linears a layer and the head"
    assert all("xi32>" in line.split("->")[-1] for line in int8)
    assert not any("tensor<1x64xi8>" in line.split("->")[0] or "ui8>" in line for line in products)
    assert sum(w.dtype == torch.int8 for w in artifact.weights.values()) == 15


@pytest.mark.parametrize("name, rows", [(name, 256) for name in CONFIGS] + [
    (name, rows) for name in ("int8_dynamic/s8", "int8_dynamic/u8") for rows in (1, 256)])
def test_one_quantized_linear_is_torchs(name, rows):
    """Without upstream float differences the dynamic path's int8 activations are torch's exactly (each row with
    its scale: a scale an ulp off, as XLA's division by a broadcast number would make it, flips some); in the uint8
    form too (zero points, rounding and the shift), one row (the padded product) or many."""
    config, form = _config_and_form(name)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 64)).eval()
    quantize_(model, CONFIGS[config]())
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(0))
    with _form(form), torch.no_grad():
        artifact = export_to_stablehlo(torch.export.export(model, (x,), strict=False))
        assert has_uint8_activations(artifact.stablehlo_text) == (config == "int8_dynamic" and form == "u8")
        torch.testing.assert_close(artifact(x), model(x), rtol=0, atol=1e-5)


def test_block_wise_int8_weights_convert():
    """Weight-only int8 in groups of 16 (torchao's block-wise Int8Tensor): torch.export's dequantize_affine,
    lowered as its ATen math."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    quantize_(model, Int8WeightOnlyConfig(granularity=PerGroup(16)))
    x = torch.randn(4, 64)
    artifact = export_to_stablehlo(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(artifact(x), model(x), rtol=0, atol=1e-5)
