"""``generation_config``'s sampling settings as ``model.generate`` reads them (``settings.resolve_sampling``): a
checkpoint-like config (``do_sample=True, temperature=0.6, top_p=0.9``, as many instruct checkpoints'
``generation_config.json``) makes ``export_generate`` sample from generate's own distribution, and arguments given
to ``export_generate`` override the config's (``do_sample=False``: greedy, token-exact with generate's greedy).

The distribution test: 2048 first tokens (64 rows of one prompt, 32 seeds) against softmax of the scores generate
itself samples from (its processed scores, ``output_scores=True``): nothing outside their support, and the
frequencies within 0.06 in total variation (the sampling noise over 5 tokens is about 0.02).
"""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from torch_stablehlo import exporter
from torch_stablehlo.exporter.conversion.signature import RNG_SEED
from torch_stablehlo.exporter.generate.generation_settings import Sampling, resolve_sampling
from tests.support import left_padded_prompts

VOCAB = 128
ROWS, SEEDS = 64, 32


@pytest.fixture(scope="module")
def model():
    """A tiny Llama whose logits spread wide enough (initializer range 0.5) that temperature 0.6 and top-p 0.9
    leave a few tokens, with a checkpoint's sampling config."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=256, initializer_range=0.5)).eval()
    config = model.generation_config
    config.do_sample, config.temperature, config.top_p = True, 0.6, 0.9
    return model


def test_config_sampling_draws_from_generates_distribution(model):
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))
    art = exporter.export_generate(model, prompt.expand(ROWS, -1), max_new_tokens=1)
    assert art.settings.sampling == Sampling(True, 0.6, 50, 0.9)
    samples = torch.cat([art.manual_seed(seed)(prompt.expand(ROWS, -1))[:, -1] for seed in range(SEEDS)])
    with torch.no_grad():
        scores = model.generate(prompt, max_new_tokens=1, output_scores=True, return_dict_in_generate=True).scores
    expected = scores[0][0].double().softmax(-1)
    assert 3 <= int((expected > 0).sum()) <= 10 and expected.max() < 0.6  # a distribution worth testing
    observed = torch.bincount(samples, minlength=VOCAB).double() / len(samples)
    assert observed[expected == 0].sum() == 0
    assert 0.5 * (observed - expected).abs().sum() < 0.06


def test_explicit_greedy_overrides_the_config(model):
    ids, mask = left_padded_prompts((7, 4), VOCAB)
    art = exporter.export_generate(model, ids, max_new_tokens=8, attention_mask=mask, do_sample=False)
    assert art.settings.sampling == Sampling()
    assert RNG_SEED not in [slot.name for slot in art.signature.main_inputs]
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                              cache_implementation="static")
    ours = art(ids, attention_mask=mask)
    torch.testing.assert_close(ours[:, :expected.shape[1]], expected, rtol=0, atol=0)


class _Config:
    """A generation_config's sampling fields (unset: None, as transformers 5 leaves them)."""

    def __init__(self, **values):
        self.do_sample = self.temperature = self.top_k = self.top_p = None
        self.__dict__.update(values)


def test_arguments_then_config_then_generates_defaults():
    checkpoint = _Config(do_sample=True, temperature=0.6, top_p=0.9)
    assert resolve_sampling(checkpoint) == Sampling(True, 0.6, 50, 0.9)
    assert resolve_sampling(checkpoint, temperature=1.3, top_k=0) == Sampling(True, 1.3, None, 0.9)
    assert resolve_sampling(checkpoint, do_sample=False) == Sampling()
    assert resolve_sampling(_Config()) == Sampling()
    assert resolve_sampling(_Config(), do_sample=True, top_p=1.0) == Sampling(True, 1.0, 50, None)
    assert resolve_sampling(_Config(temperature=0.6, top_k=5)) == Sampling()  # greedy ignores the config's
    with pytest.raises(ValueError, match="temperature=0.6 only apply when sampling"):
        resolve_sampling(_Config(), temperature=0.6)
    with pytest.raises(ValueError, match="top_p must be in"):
        resolve_sampling(checkpoint, top_p=0.0)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        resolve_sampling(_Config(do_sample=True, temperature=0.0))
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        resolve_sampling(checkpoint, temperature=float("inf"))
    with pytest.raises(ValueError, match="not True or False"):
        resolve_sampling(checkpoint, top_k=True)
    with pytest.raises(ValueError, match="do_sample must be True, False or None"):
        resolve_sampling(checkpoint, do_sample=1)
