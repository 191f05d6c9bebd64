"""The model sweep (``tools.model_sweep``, ``make models``) on a fixed sample of ``tools.model_table``: a decoder
and an encoder-decoder (encoder and decoder lengths symbolic apart), each static, dynamic and through the TF
SavedModel, against eager at float32's tolerance (vision models: the golden zoo's ViT and CNN, static and
dynamic, in tests/golden; ``make models`` sweeps the whole table); the table covers what issue 23 asks for."""
from collections import Counter

import pytest
import torch

from torch_stablehlo.tools import model_sweep
from torch_stablehlo.tools.model_table import MINIMUM_PER_CATEGORY, MODELS

SAMPLE = ("llama", "bart")


def test_the_table_covers_every_category():
    counts = Counter(entry.category for entry in MODELS.values())
    assert len(MODELS) >= 40
    assert {category: min(counts[category], minimum) for category, minimum in MINIMUM_PER_CATEGORY.items()} \
        == MINIMUM_PER_CATEGORY


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    model_sweep.warm_up()
    return {name: model_sweep.sweep_model(MODELS[name], tmp_path_factory.mktemp(name)) for name in SAMPLE}


@pytest.mark.parametrize("name", SAMPLE)
def test_sample_passes_every_pass(results, name):
    result = results[name]
    for which in model_sweep.PASSES:
        assert result[which]["status"] == model_sweep.PASSED, (which, result[which])
        assert result[which]["max_error"] < 1e-4
    assert not result["static"]["retraced"] and not result["dynamic"]["retraced"]


def test_a_wrong_output_fails_the_comparison():
    expected = [torch.ones(3, 4)]
    assert model_sweep.compare([torch.ones(3, 4) + 1e-7], expected)["status"] == model_sweep.PASSED
    off = model_sweep.compare([torch.ones(3, 4) + 1e-3], expected)
    assert off["status"] == model_sweep.FAILED and off["max_error"] == pytest.approx(1e-3, rel=1e-3)
    assert model_sweep.compare([torch.ones(3, 5)], expected)["status"] == model_sweep.FAILED


def test_the_report_lists_each_model_and_why_a_pass_failed(results):
    broken = {**results["bart"], "dynamic": {"status": model_sweep.TORCH_EXPORT, "reason": "UserError: a | b"}}
    report = model_sweep.markdown({**results, "broken": broken})
    assert "| llama | decoder | `LlamaForCausalLM` | pass | pass (batch, sequence) | pass |" in report
    assert "| broken | dynamic | torch.export | UserError: a \\| b |" in report
    assert "- dynamic: **2 of 3** pass; 1 torch.export cannot export." in report
    quick = {p: {**results["llama"][p], "convert_s": 0.01} for p in model_sweep.PASSES if "convert_s" in results["llama"][p]}
    slow = {**results["llama"], **quick, "static": {**results["llama"]["static"], "convert_s": 1.5}}
    assert "- Conversions over 0.2 s: slow (static, 1.50 s)." in model_sweep.markdown({"slow": slow})
