"""export_generate: a tiny Llama's whole generate loop as one program, token-exact with transformers' own
``generate`` (static cache) for one prompt and for a left-padded batch, stopping at eos, honouring or refusing
generation_config settings, sampling from the artifact's seed, and handed off as a bundle and to JAX."""
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from torch_stablehlo import exporter, load_artifact
from torch_stablehlo.exporter import InputError
from torch_stablehlo.stablehlo_ir.op_counts import op_histogram
from tests.support import left_padded_prompts

VOCAB = 128


def tiny_llama(**config) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, **config)
    return LlamaForCausalLM(config).eval()


def hf_generate(model, input_ids, attention_mask=None, max_new_tokens=12, **kwargs) -> torch.Tensor:
    return model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, do_sample=False,
                          cache_implementation="static", **kwargs)


def assert_generate_prefix(ours: torch.Tensor, theirs: torch.Tensor, pad: int) -> None:
    """Ours has ``prompt + max_new_tokens`` columns; transformers stops once every row is done: the rest is pad."""
    torch.testing.assert_close(ours[:, :theirs.shape[1]], theirs, rtol=0, atol=0)
    assert (ours[:, theirs.shape[1]:] == pad).all()


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def padded_batch():
    """Three prompts of 7, 5 and 3 tokens, left-padded to 7."""
    return left_padded_prompts((7, 5, 3), VOCAB)


@pytest.fixture(scope="module")
def greedy(model, padded_batch):
    ids, mask = padded_batch
    return exporter.export_generate(model, ids, max_new_tokens=12, attention_mask=mask)


def test_padded_batch_is_token_exact_with_generate(model, padded_batch, greedy):
    ids, mask = padded_batch
    ours = greedy(ids, attention_mask=mask)
    assert ours.shape == (3, 7 + 12)
    assert_generate_prefix(ours, hf_generate(model, ids, mask), greedy.settings.pad_token_id)


def test_one_artifact_takes_every_prompt_length_up_to_its_cache(model):
    torch.manual_seed(2)
    prompt = torch.randint(3, VOCAB, (1, 9))
    art = exporter.export_generate(model, prompt[:, :1], max_new_tokens=16, max_cache_len=32)  # a 1-token example
    assert art.signature.dims == {"prompt": [1, 16]}
    for length in (1, 9):
        assert_generate_prefix(art(prompt[:, :length]), hf_generate(model, prompt[:, :length], max_new_tokens=16),
                               art.settings.pad_token_id)
    with pytest.raises(InputError, match="a prompt of 17 tokens does not fit.*1 to 16 tokens"):
        art(torch.randint(3, VOCAB, (1, 17)))


def test_rows_stop_at_eos_and_pad_after(model, padded_batch):
    """With eos 77 or 2 the rows end at new tokens 1, 8 and 2 (any id of the list counts); the loop stops once all
    have ended, as transformers' generate does, and the columns after are pad."""
    ids, mask = padded_batch
    art = exporter.export_generate(model, ids, max_new_tokens=12, attention_mask=mask, eos_token_id=[77, 2],
                                   pad_token_id=0)
    ours = art(ids, attention_mask=mask)
    assert ours[:, 7:].tolist() == [[2] + [0] * 11, [5, 5, 5, 5, 23, 105, 86, 96, 77, 0, 0, 0], [10, 77] + [0] * 10]
    theirs = hf_generate(model, ids, mask, eos_token_id=[77, 2], pad_token_id=0)
    assert theirs.shape[1] == 7 + 9
    assert_generate_prefix(ours, theirs, 0)


def test_module_size_does_not_grow_with_max_new_tokens(model, padded_batch, greedy):
    """4x the new tokens (48, not 12; the same cache of 64): one while loop either way, the op count and the text
    within 3% (an unrolled loop would be 4x; the prompt's range differs, [1, 52] against [1, 16], and torch's shape
    arithmetic for it takes a few ops more or less)."""
    ids, mask = padded_batch
    longer = exporter.export_generate(model, ids, max_new_tokens=48, max_cache_len=64, attention_mask=mask)
    texts = [greedy.stablehlo_text, longer.stablehlo_text]
    counts = [op_histogram(text) for text in texts]
    assert [c["stablehlo.while"] for c in counts] == [1, 1]
    assert abs(counts[1].total() - counts[0].total()) < 0.03 * counts[0].total()
    assert abs(len(texts[1]) - len(texts[0])) < 0.03 * len(texts[0])


def test_generation_config_settings_are_honoured(padded_batch):
    ids, mask = padded_batch
    model = tiny_llama()
    config = model.generation_config
    config.repetition_penalty, config.no_repeat_ngram_size = 1.5, 2
    config.bad_words_ids = [[int(ids[0, -1])], [5, 6]]
    config.min_new_tokens, config.eos_token_id = 4, int(hf_generate(tiny_llama(), ids, mask)[1, 7])
    art = exporter.export_generate(model, ids, max_new_tokens=12, attention_mask=mask)
    assert_generate_prefix(art(ids, attention_mask=mask), hf_generate(model, ids, mask), art.settings.pad_token_id)


def test_unimplemented_generation_config_settings_are_refused(padded_batch):
    model = tiny_llama()
    model.generation_config.num_beams, model.generation_config.sequence_bias = 2, {(3,): 1.0}
    with pytest.raises(ValueError, match=r"num_beams=2, sequence_bias=\{\(3,\): 1.0\}"):
        exporter.export_generate(model, padded_batch[0])


def test_bad_prompts_are_refused_before_running(greedy, padded_batch):
    ids, mask = padded_batch
    with pytest.raises(InputError, match="left-pad"):
        greedy(ids, attention_mask=mask.flip(1))
    with pytest.raises(InputError, match="int64"):
        greedy(ids.to(torch.int32))


def test_top_k_1_sampling_is_greedy(model, padded_batch, greedy):
    ids, mask = padded_batch
    art = exporter.export_generate(model, ids, max_new_tokens=12, attention_mask=mask, do_sample=True, top_k=1)
    torch.testing.assert_close(art.manual_seed(3)(ids, attention_mask=mask), greedy(ids, attention_mask=mask))


@pytest.fixture(scope="module")
def sampling(model, padded_batch):
    ids, mask = padded_batch
    return exporter.export_generate(model, ids, max_new_tokens=12, attention_mask=mask, do_sample=True,
                                    temperature=1.5)


def test_sampling_is_reproducible_per_seed(sampling, padded_batch):
    ids, mask = padded_batch
    first = sampling.manual_seed(7)(ids, attention_mask=mask)
    torch.testing.assert_close(sampling.manual_seed(7)(ids, attention_mask=mask), first)
    assert not torch.equal(sampling(ids, attention_mask=mask), first)  # the next call draws from the next seed
    assert not torch.equal(sampling.manual_seed(8)(ids, attention_mask=mask), first)
    assert len(set(first[0, 7:].tolist())) > 3  # every step draws new numbers


def test_sampling_through_the_saved_model_and_jax(sampling, padded_batch, tmp_path):
    """The SavedModel's seeded signature and the JAX model's ``seed=`` draw the artifact's sequences for the same
    seed (different ones for another seed); without a seed both draw from their own counter, from 0, as the
    artifact's calls after ``manual_seed(0)``."""
    tf = pytest.importorskip("tensorflow")
    ids, mask = padded_batch
    expected = {seed: sampling.manual_seed(seed)(ids, attention_mask=mask).numpy() for seed in (0, 1, 7)}
    assert not np.array_equal(expected[0], expected[7]) and not np.array_equal(expected[0], expected[1])
    loaded = tf.saved_model.load(str(sampling.save_tf_saved_model(tmp_path / "tf")))
    inputs = {"input_ids": tf.constant(ids.numpy()), "attention_mask": tf.constant(mask.numpy())}
    jax_model = sampling.to_jax()
    for seed in (0, 7):
        served = loaded.signatures["serving_default_seeded"](**inputs, seed=tf.constant(seed, tf.int64))
        np.testing.assert_array_equal(served["sequences"].numpy(), expected[seed])
        np.testing.assert_array_equal(np.asarray(jax_model(ids.numpy(), attention_mask=mask.numpy(), seed=seed)),
                                      expected[seed])
    for seed in (0, 1):
        np.testing.assert_array_equal(loaded.signatures["serving_default"](**inputs)["sequences"].numpy(),
                                      expected[seed])
        np.testing.assert_array_equal(np.asarray(jax_model(ids.numpy(), attention_mask=mask.numpy())), expected[seed])


@pytest.mark.parametrize("top_k, top_p", [(6, None), (None, 0.3)])
def test_sampled_frequencies_match_the_filtered_softmax(model, top_k, top_p):
    """2048 first tokens (64 rows of one prompt, 32 seeds) against softmax(logits / T) over the top-k / top-p set:
    nothing outside the set, and the frequencies within 0.06 in total variation."""
    temperature, rows = 0.1, 64
    prompt = torch.randint(3, VOCAB, (1, 6))
    art = exporter.export_generate(model, prompt.expand(rows, -1), max_new_tokens=1, do_sample=True,
                                   temperature=temperature, top_k=top_k, top_p=top_p)
    samples = torch.cat([art.manual_seed(seed)(prompt.expand(rows, -1))[:, -1] for seed in range(32)])
    with torch.no_grad():
        scores = model(prompt).logits[0, -1] / temperature
    order = scores.argsort(descending=True)
    probabilities = scores.softmax(-1)[order]
    keep = len(scores) if top_k is None else top_k
    if top_p is not None:  # the smallest head of the sorted tokens whose mass reaches top_p
        keep = int((probabilities.cumsum(0) < top_p).sum()) + 1
    expected = torch.zeros(VOCAB).index_put_((order[:keep],), probabilities[:keep] / probabilities[:keep].sum())
    assert 2 <= keep <= 10 and expected.max() < 0.8  # a distribution worth testing
    observed = torch.bincount(samples, minlength=VOCAB).double() / len(samples)
    assert observed[expected == 0].sum() == 0
    assert 0.5 * (observed - expected.double()).abs().sum() < 0.06


def test_bundle_and_jax_handoff_generate_the_same_tokens(greedy, padded_batch, tmp_path):
    ids, mask = padded_batch
    expected = greedy(ids, attention_mask=mask)
    loaded = load_artifact(greedy.save(tmp_path / "generate"))
    torch.testing.assert_close(loaded(ids, attention_mask=mask), expected)
    jax_model = greedy.to_jax()
    np.testing.assert_array_equal(np.asarray(jax_model(ids.numpy(), attention_mask=mask.numpy())), expected.numpy())


def test_saved_model_serves_sequences(greedy, padded_batch, tmp_path):
    tf = pytest.importorskip("tensorflow")
    ids, mask = padded_batch
    serve = tf.saved_model.load(str(greedy.save_tf_saved_model(tmp_path / "tf"))).signatures["serving_default"]
    shorter = ids[:, 2:], mask[:, 2:]  # the prompt's length is dynamic in the SavedModel too
    for prompt, prompt_mask in (padded_batch, shorter):
        served = serve(input_ids=tf.constant(prompt.numpy()), attention_mask=tf.constant(prompt_mask.numpy()))
        np.testing.assert_array_equal(served["sequences"].numpy(), greedy(prompt, attention_mask=prompt_mask).numpy())
