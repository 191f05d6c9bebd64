"""Encoder-decoders: transformers' own recipe (``Seq2SeqLMExportableModule``, T5; exported strict and non-strict)
through our artifacts, and ``export_generate`` of T5 and BART, token-exact with ``model.generate(do_sample=False)``.
Tiny models from configs with seeded random weights (no downloads), scaled so that greedy decoding does not settle
on one token at once (T5's ``initializer_factor``, BART's ``init_std``); the padded batches also set
``no_repeat_ngram_size``, so that no row repeats one token and each choice reads more of the logits than their
maximum."""
import functools

import numpy as np
import pytest
import torch
from jaxlib.mlir import ir
from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration
from transformers.integrations.executorch import (Seq2SeqLMDecoderExportableModuleWithStaticCache,
                                                  Seq2SeqLMEncoderExportableModule, Seq2SeqLMExportableModule)

from torch_stablehlo import export_to_stablehlo, exporter, load_artifact
from torch_stablehlo.exporter import InputError
from torch_stablehlo.exporter.errors import DimensionError
from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.op_counts import op_histogram
from tests.llm.test_export_generate import assert_generate_prefix

VOCAB = 128
PROMPT = torch.tensor([[3, 17, 42, 9, 5, 77, 1]])
NEW_TOKENS = 24
CACHE = 32
BART_BOS, BART_EOS = 0, 2


def _t5(**generation):
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
        initializer_factor=10.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)).eval()
    model.generation_config.update(**generation)
    return model


def _bart(**generation):
    """BART's own generation defaults: decoder start = eos = forced eos = 2 (``BART_EOS``), pad 1."""
    torch.manual_seed(0)
    model = BartForConditionalGeneration(BartConfig(
        vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128,
        init_std=1.0)).eval()
    model.generation_config.update(**generation)
    return model


def hf_generate(model, input_ids, attention_mask=None, max_new_tokens=NEW_TOKENS) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                              do_sample=False)


def padded_batch(pad: int):
    """Three sources of 9, 6 and 3 tokens, right-padded to 9 (as T5's and BART's tokenizers pad)."""
    torch.manual_seed(1)
    ids = torch.randint(3, VOCAB, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return ids.masked_fill(mask == 0, pad), mask


@functools.cache
def _padded_artifact(family: str):
    """The model (``no_repeat_ngram_size=2``; BART also forces its bos first, as bart-large-cnn's config does), its
    padded batch and export_generate's artifact for it."""
    generation = {"t5": {}, "bart": {"forced_bos_token_id": BART_BOS}}[family]
    model = {"t5": _t5, "bart": _bart}[family](no_repeat_ngram_size=2, **generation)
    ids, mask = padded_batch(model.generation_config.pad_token_id)
    return model, ids, mask, exporter.export_generate(model, ids, max_new_tokens=NEW_TOKENS, attention_mask=mask)


def _recipe_programs(model, strict: bool):
    """The recipe's encoder and decoder programs: its own ``export`` (strict=True: the decoder's caches are
    buffers), or ``torch.export.export`` over its wrapper modules as a user would call it (strict=False: the
    caches are lifted constants written in place)."""
    if strict:
        recipe = Seq2SeqLMExportableModule(model, max_hidden_seq_length=16, max_cache_length=CACHE).export(PROMPT)
        return recipe.exported_encoder, recipe.exported_decoder
    source = torch.export.Dim("source", max=16)
    encoder = Seq2SeqLMEncoderExportableModule(model.get_encoder()).eval()
    decoder = Seq2SeqLMDecoderExportableModuleWithStaticCache(model, CACHE, 1).eval()
    example = (torch.tensor([[0]]), torch.zeros(1, PROMPT.shape[1], model.config.d_model), torch.tensor([0]))
    with torch.no_grad():
        return (torch.export.export(encoder, (PROMPT,), dynamic_shapes=({1: source},), strict=False),
                torch.export.export(decoder, example, dynamic_shapes=(None, {1: source}, None), strict=False))


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non_strict"])
def test_recipe_decodes_like_generate(strict, tmp_path):
    """The recipe's encoder and decoder programs (the decoder's static cache is state), decoded as its runner
    does (the start token 0, each greedy token fed back at the next position): generate's 24 tokens, directly
    and through a bundle of the decoder."""
    model = _t5(eos_token_id=None)  # the runner loop never stops early
    expected = hf_generate(model, PROMPT)[0].tolist()
    assert len(set(expected)) > 8, expected
    encoder, decoder = (export_to_stablehlo(program) for program in _recipe_programs(model, strict))
    caches = [s for s in decoder.signature.state if len(s.tensor.shape) == 4]
    assert len(caches) == 4 and all(s.tensor.shape[2] == CACHE for s in caches), decoder.signature

    def decode(run) -> list[int]:
        hidden, tokens = encoder(PROMPT), [0]
        for position in range(NEW_TOKENS):
            logits = run(torch.tensor([[tokens[-1]]]), hidden, torch.tensor([position]))
            tokens.append(int(logits[0, -1].argmax()))
        return tokens

    assert decode(decoder) == expected
    assert decode(load_artifact(decoder.reset_state().save(tmp_path / "decoder"))) == expected


@functools.cache
def _t5_artifact(max_new_tokens: int):
    """Plain greedy T5 and export_generate's artifact of it for ``PROMPT``, sources up to 16 tokens."""
    model = _t5()
    return model, exporter.export_generate(model, PROMPT, max_new_tokens=max_new_tokens, max_source_len=16)


def test_t5_one_artifact_takes_every_source_length_up_to_its_bound():
    """Batch 1, plain greedy: the example's source and a shorter one through one artifact; a source past the
    bound is refused before anything runs."""
    model, art = _t5_artifact(NEW_TOKENS)
    assert art.signature.dims == {"source": [1, 16]}
    for length in (7, 3):
        ours = art(PROMPT[:, :length])
        assert ours.shape == (1, 1 + NEW_TOKENS)
        assert_generate_prefix(ours, hf_generate(model, PROMPT[:, :length]), art.settings.pad_token_id)
    with pytest.raises(DimensionError, match="source"):
        art(torch.randint(3, VOCAB, (1, 17)))


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_padded_batch_is_token_exact_with_generate(family):
    """Right-padded sources of 9, 6 and 3 tokens: the encoder's mask, then cross-attention's; BART also forces
    its bos first and its eos at the last token (forced_bos_token_id, forced_eos_token_id)."""
    model, ids, mask, art = _padded_artifact(family)
    ours = art(ids, attention_mask=mask)
    assert ours.shape == (3, 1 + NEW_TOKENS)
    theirs = hf_generate(model, ids, mask)
    assert_generate_prefix(ours, theirs, art.settings.pad_token_id)
    assert (ours[:, 0] == model.generation_config.decoder_start_token_id).all()
    assert all(len(set(row[1:].tolist())) > 4 for row in theirs), theirs
    if family == "bart":  # the rows that reach the last token (one here) end with the forced eos
        assert (ours[:, 1] == BART_BOS).all() and (ours[:, 2:] != BART_BOS).all(), ours
        reaching = [row for row in ours.tolist() if BART_EOS not in row[1:-1]]
        assert reaching and all(row[-1] == BART_EOS for row in reaching), ours


def test_left_padding_is_token_exact_with_generate():
    """The same sources left-padded, through the same artifact (the encoder's mask is any mask)."""
    model, ids, mask, art = _padded_artifact("t5")
    shifts = (mask == 0).sum(1)
    left_ids = torch.stack([row.roll(int(shift)) for row, shift in zip(ids, shifts)])
    left_mask = torch.stack([row.roll(int(shift)) for row, shift in zip(mask, shifts)])
    assert (left_mask[:, -1] == 1).all() and (left_mask[:, 0] == torch.tensor([1, 0, 0])).all()
    assert_generate_prefix(art(left_ids, attention_mask=left_mask), hf_generate(model, left_ids, left_mask),
                           art.settings.pad_token_id)


def _located(text: str, function: str, module_path: str) -> int:
    """How many ops of ``function`` in the module ``text`` come from ``module_path`` (their location)."""
    with make_context():
        module = ir.Module.parse(text)
        body = next(op for op in module.body.operations if ir.StringAttr(op.attributes["sym_name"]).value == function)
        locations = []
        body.operation.walk(lambda op: locations.append(str(op.location)) or ir.WalkResult.ADVANCE)
    return sum(module_path in location for location in locations)


@pytest.mark.parametrize("family, projections", [("t5", ("EncDecAttention.k/", "EncDecAttention.v/")),
                                                 ("bart", ("encoder_attn.k_proj/", "encoder_attn.v_proj/"))])
def test_cross_attention_keys_and_values_are_computed_once(family, projections):
    """The prefill projects the encoder's output to each decoder layer's cross-attention keys and values; the
    decode step (the loop's body) does not: it reads the carried ones."""
    text = _padded_artifact(family)[3].stablehlo_text
    assert all(_located(text, "prefill", p) > 0 for p in projections)
    assert [_located(text, "decode", p) for p in projections] == [0, 0]


def test_bundle_round_trip(tmp_path):
    _, ids, mask, art = _padded_artifact("bart")
    loaded = load_artifact(art.save(tmp_path / "bart"))
    torch.testing.assert_close(loaded(input_ids=ids, attention_mask=mask), art(ids, attention_mask=mask),
                               rtol=0, atol=0)


def test_jax_handoff_generates_the_same_tokens():
    """The source's length is dynamic there too: the batch's first 5 columns (exported with 9)."""
    _, ids, mask, art = _padded_artifact("bart")
    source, source_mask = ids[:, :5], mask[:, :5]
    np.testing.assert_array_equal(np.asarray(art.to_jax()(source.numpy(), attention_mask=source_mask.numpy())),
                                  art(source, attention_mask=source_mask).numpy())


def test_module_size_does_not_grow_with_max_new_tokens():
    """4x the new tokens: one while loop either way, the op count and the text within 3%."""
    texts = [_t5_artifact(n)[1].stablehlo_text for n in (NEW_TOKENS, 4 * NEW_TOKENS)]
    counts = [op_histogram(text) for text in texts]
    assert [c["stablehlo.while"] for c in counts] == [1, 1]
    assert abs(counts[1].total() - counts[0].total()) < 0.03 * counts[0].total()
    assert abs(len(texts[1]) - len(texts[0])) < 0.03 * len(texts[0])


def test_bad_sources_and_settings_are_refused():
    _, ids, mask, art = _padded_artifact("t5")
    with pytest.raises(InputError, match="padding alone"):
        art(ids, attention_mask=mask * torch.tensor([[1], [0], [1]]))
    with pytest.raises(ValueError, match="encoder_no_repeat_ngram_size=2"):
        exporter.export_generate(_t5(encoder_no_repeat_ngram_size=2), PROMPT)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        exporter.export_generate(_bart(), PROMPT, max_source_len=256)
