"""One rule for a generate program's ``attention_mask``, greedy or sampled, through every entry point: left out,
it is ones (as ``model.generate`` defaults it) for the artifact, its bundle and its JAX model (the rule is part of
the signature: ``InputSlot.ones_like``); a TF SavedModel signature takes every input, so there it is required."""
import functools

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from torch_stablehlo import exporter, load_artifact

VOCAB = 64


IDS = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))


@functools.cache
def _generate_artifact(do_sample: bool):
    """export_generate of a one-layer Llama for ``IDS`` and 4 new tokens, greedy or sampled (built once a file)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                                         max_position_embeddings=128)).eval()
    return exporter.export_generate(model, IDS, max_new_tokens=4, do_sample=do_sample)


@pytest.mark.parametrize("do_sample", [False, True])
def test_left_out_mask_is_ones_everywhere(do_sample, tmp_path):
    ids, ones = IDS, torch.ones_like(IDS)
    art = _generate_artifact(do_sample)
    expected = art.manual_seed(5)(ids, attention_mask=ones)
    assert len(set(expected[:, 5:].flatten().tolist())) > 1
    torch.testing.assert_close(art.manual_seed(5)(ids), expected, rtol=0, atol=0)
    loaded = load_artifact(art.save(tmp_path / "bundle"))
    seeded = loaded.manual_seed(5) if do_sample else loaded
    torch.testing.assert_close(seeded(ids), expected, rtol=0, atol=0)
    jax_model = art.to_jax()
    seed = {"seed": 5} if do_sample else {}
    np.testing.assert_array_equal(np.asarray(jax_model(ids.numpy(), **seed)), expected.numpy())
    np.testing.assert_array_equal(np.asarray(jax_model(ids.numpy(), attention_mask=ones.numpy(), **seed)),
                                  expected.numpy())


def test_saved_model_requires_the_mask(tmp_path):
    tf = pytest.importorskip("tensorflow")
    ids, art = IDS, _generate_artifact(False)
    serve = tf.saved_model.load(str(art.save_tf_saved_model(tmp_path / "tf"))).signatures["serving_default"]
    assert sorted(serve.structured_input_signature[1]) == ["attention_mask", "input_ids"]
    with pytest.raises(TypeError, match="attention_mask"):
        serve(input_ids=tf.constant(ids.numpy()))
    served = serve(input_ids=tf.constant(ids.numpy()), attention_mask=tf.constant(np.ones((2, 5), np.int64)))
    np.testing.assert_array_equal(served["sequences"].numpy(), art(ids).numpy())
