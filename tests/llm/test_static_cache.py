"""transformers' static and hybrid KV-cache recipes (``TorchExportableModuleForDecoderOnlyLM``) through our
artifacts: exported with ``strict=True`` (the recipe's own ``export``: the caches are buffers) and with
``strict=False`` (``torch.export.export`` directly: the caches are lifted constants written by ``index_copy_``),
decoded with the recipe's runner loop (prefill token by token, then greedy), token-exact with
``model.generate(do_sample=False)`` on a static cache, directly, through a bundle round trip and through the
handoffs that carry the state: ``to_jax`` (donated on the device) and a TF SavedModel (variables). Tiny models
from configs with seeded random weights (no downloads), scaled so that greedy decoding does not settle on
one token: a dropped cache changes the tokens after the first."""
import functools
import re

import jax
import numpy as np
import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM
from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

from torch_stablehlo import export_to_stablehlo, load_artifact
from torch_stablehlo.exporter.errors import LoweringError
from torch_stablehlo.runtime.analysis import input_output_aliases

PROMPT = torch.tensor([[3, 17, 42, 9, 5, 77]])
NEW_TOKENS = 24
CACHE = 64


def _llama(kv_heads: int = 2):
    """GQA (4 query heads, 2 key/value heads), tied embeddings: transformers' StaticCache."""
    return LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, vocab_size=128, tie_word_embeddings=True, initializer_range=0.5,
        max_position_embeddings=256))


def _gemma3():
    """A sliding window of 4 (smaller than prompt + new tokens) on layer 0, full attention on layer 1: the
    recipe's hybrid cache."""
    return Gemma3ForCausalLM(Gemma3TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=128, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=False, initializer_range=0.1, max_position_embeddings=256, pad_token_id=0))


MODELS = {"llama": _llama, "gemma3": _gemma3, "llama_mha": functools.partial(_llama, kv_heads=4)}


@functools.cache
def _model(name: str):
    """The model, and HF generate's greedy tokens on a static cache."""
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    model.generation_config.cache_implementation = "static"
    model.generation_config.eos_token_id = None  # the runner loop never stops early
    with torch.no_grad():
        expected = model.generate(PROMPT, max_new_tokens=NEW_TOKENS, do_sample=False)
    return model, expected[0].tolist()


@functools.cache
def _exported(name: str, strict: bool):
    """The recipe's program (its own ``export`` for strict=True, ``torch.export.export`` for strict=False)."""
    model, _ = _model(name)
    recipe = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=CACHE)
    step = {"input_ids": PROMPT[:, :1], "cache_position": torch.tensor([0])}
    if strict:
        return recipe.export(**step, strict=True)
    return torch.export.export(recipe.model, (), step, strict=False)


def decode(run, prompt=PROMPT, new_tokens=NEW_TOKENS) -> list[int]:
    """The recipe's runner loop (``TorchExportableModuleWithStaticCache.generate``): the prompt one token at a
    time, then each greedy token fed back at the next position."""
    tokens = prompt[0].tolist()
    for position in range(prompt.shape[1]):
        logits = run(input_ids=prompt[:, position:position + 1], cache_position=torch.tensor([position]))
    for _ in range(new_tokens):
        tokens.append(int(logits[0, -1].argmax()))
        logits = run(input_ids=torch.tensor([[tokens[-1]]]), cache_position=torch.tensor([len(tokens) - 1]))
    return tokens


def _attribute(module, target: str):
    return functools.reduce(getattr, target.split("."), module)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non_strict"])
@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_decodes_like_generate(name, strict, tmp_path):
    _, expected = _model(name)
    program = _exported(name, strict)
    artifact = export_to_stablehlo(program)
    caches = [s for s in artifact.signature.state if len(s.tensor.shape) == 4]
    assert len(caches) == 4 and all(s.tensor.shape[2] == CACHE for s in caches), artifact.signature
    exported = artifact.state
    assert not any(exported[s.name].any() for s in caches)
    assert decode(artifact) == expected

    eager = program.module()
    assert decode(eager) == expected
    for slot in artifact.signature.state:  # the state read back is what ep.module() carries
        torch.testing.assert_close(artifact.state[slot.name], _attribute(eager, slot.target), rtol=1e-4, atol=1e-4)
    reset = artifact.reset_state().state
    assert all(torch.equal(reset[name], value) for name, value in exported.items()), "back to the exported values"

    loaded = load_artifact(artifact.save(tmp_path / "bundle"))
    assert [s.name for s in loaded.signature.state] == [s.name for s in artifact.signature.state]
    assert decode(loaded) == expected


def test_state_stays_on_the_device_and_is_updated_in_place():
    """The cache writes are dynamic_update_slice (positions arange(1) + cumulative_length), each state argument
    is donated to its new value (input_output_alias in the optimized HLO) and a call consumes the buffers
    passed: nothing is copied back to the host between calls."""
    artifact = export_to_stablehlo(_exported("llama", False))
    text = artifact.stablehlo_text
    assert text.count("stablehlo.dynamic_update_slice") == 4 and "stablehlo.scatter" not in text
    assert text.count("tf.aliasing_output") == len(artifact.signature.state) == 6
    artifact(input_ids=PROMPT[:, :1], cache_position=torch.tensor([0]))
    executable, = artifact._executables.values()
    state = {i for i, s in enumerate(artifact.signature.main_inputs) if s.kind == "state"}
    aliases = input_output_aliases(executable.loaded)
    assert set(aliases) == state
    before = dict(artifact._device_state)
    artifact(input_ids=PROMPT[:, 1:2], cache_position=torch.tensor([1]))
    assert all(array.is_deleted() for array in before.values()), "the state passed is donated to the call"


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non_strict"])
def test_jax_handoff_carries_and_donates_the_state(strict):
    """``to_jax()`` decodes generate's tokens, carrying the state on the device and donating it to each call
    (the arrays passed are consumed); its functional form ``apply(weights, state, ...)`` under
    ``jax.jit(donate_argnums=1)`` aliases each state argument to its new value in the optimized HLO."""
    model = export_to_stablehlo(_exported("llama", strict)).to_jax()
    assert decode(_jax_steps(model)) == _model("llama")[1]
    carried = dict(model._state)
    model(**_numpy({"input_ids": PROMPT[:, :1], "cache_position": torch.tensor([0])}))
    assert all(array.is_deleted() for array in carried.values()), "the state passed is donated to the call"

    state = model.reset_state().state
    step = jax.jit(model.apply, donate_argnums=1)
    with jax.enable_x64(True):
        compiled = step.lower(model.weights, state, input_ids=PROMPT[:, :1].numpy(),
                              cache_position=np.array([0])).compile()
    weights = len(model.weights)
    assert set(input_output_aliases(compiled.runtime_executable())) == set(range(weights, weights + len(state)))


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non_strict"])
def test_saved_model_keeps_the_state_in_variables(strict, tmp_path):
    """The SavedModel's serving_default, called once per token, decodes generate's tokens: the state lives in
    variables each call updates, and holds what the artifact's does after the same calls."""
    tf = pytest.importorskip("tensorflow")
    artifact = export_to_stablehlo(_exported("llama", strict))
    loaded = tf.saved_model.load(str(artifact.save_tf_saved_model(tmp_path / "tf")))
    assert decode(_served_steps(tf, loaded)) == decode(artifact) == _model("llama")[1]
    assert len(loaded.state_variables) == 6
    for slot, variable in zip(artifact.signature.state, loaded.state_variables):
        torch.testing.assert_close(torch.tensor(variable.numpy()), artifact.state[slot.name], rtol=1e-4, atol=1e-4)


def _numpy(step: dict) -> dict:
    return {name: value.numpy() for name, value in step.items()}


def _jax_steps(model):
    """The recipe's step through a JAX model: torch tensors in, logits out."""
    return lambda **step: torch.from_numpy(np.array(model(**_numpy(step))))


def _served_steps(tf, loaded):
    """The recipe's step through a loaded SavedModel's serving_default (``tf``: the tensorflow module, imported
    by the test where installed): torch tensors in, logits out."""
    serve = loaded.signatures["serving_default"]
    return lambda **step: torch.from_numpy(serve(**{k: tf.constant(v) for k, v in _numpy(step).items()})["output_0"]
                                           .numpy())


def test_attention_reads_the_cache_from_before_the_write():
    """Without repeated key/value heads the attention's products take the cache as it was before the write
    and the written row apart (XLA CPU would otherwise fuse the write into each product's operand and copy the
    whole cache for it): the optimized HLO copies no cache, and the tokens are still generate's."""
    artifact = export_to_stablehlo(_exported("llama_mha", False))
    assert decode(artifact) == _model("llama_mha")[1]
    executable, = artifact._executables.values()
    hlo = executable.loaded.hlo_modules()[0].to_string()
    assert not re.findall(rf"f32\[1,4,{CACHE},16\]\S* copy\(", hlo)


class RingWrite(torch.nn.Module):
    """Writes one row of a cache at ``position`` (a lifted constant under strict=False), returns the cache sum."""

    def __init__(self):
        super().__init__()
        self.cache = torch.zeros(8, 2)

    def forward(self, row, position):
        self.cache.index_copy_(0, position, row)
        return self.cache.sum(0)


def test_an_out_of_range_write_is_never_clamped():
    """dynamic_update_slice clamps a start that does not fit; the write is guarded so that it lands where torch
    puts it, or nowhere (torch raises), never on the last row."""
    artifact = export_to_stablehlo(torch.export.export(RingWrite(), (torch.ones(1, 2), torch.tensor([0])),
                                                       strict=False))
    assert "stablehlo.dynamic_update_slice" in artifact.stablehlo_text
    artifact(torch.full((1, 2), 3.0), torch.tensor([7]))
    artifact(torch.full((1, 2), 5.0), torch.tensor([8]))  # out of range: torch raises; nothing is written
    artifact(torch.full((1, 2), 7.0), torch.tensor([-1]))
    cache, = artifact.state.values()
    expected = torch.zeros(8, 2)
    expected[7] = 3.0
    torch.testing.assert_close(cache, expected)


class PartialWrite(torch.nn.Module):
    """Writes part of its state in place: through a slice (which the walk scatters back) or through a reshape
    (which it cannot)."""

    def __init__(self, buffer: bool, through_reshape: bool = False):
        super().__init__()
        if buffer:
            self.register_buffer("total", torch.zeros(4), persistent=False)
        else:
            self.total = torch.zeros(4)
        self.through_reshape = through_reshape

    def forward(self, x):
        part = self.total.view(2, 2)[0] if self.through_reshape else self.total[:2]
        part.add_(x)
        return self.total * 2


@pytest.mark.parametrize("buffer", [True, False])
def test_a_write_to_part_of_the_state_is_carried(buffer):
    """A slice of a buffer or of a lifted constant written in place: scattered back into the state by the walk
    and carried from call to call as ep.module() carries it."""
    x = torch.ones(2)
    program = torch.export.export(PartialWrite(buffer), (x,), strict=False)
    artifact, eager = export_to_stablehlo(program), program.module()
    for _ in range(3):
        torch.testing.assert_close(artifact(x), eager(x))
    torch.testing.assert_close(artifact.state["total"], torch.tensor([3.0, 3.0, 0.0, 0.0]))


def test_a_write_the_walk_cannot_carry_is_an_error():
    """A write to a lifted constant through a reshape: the walk does not carry it and torch cannot
    functionalise it, so it is refused naming the op and the constant; the same write to a buffer is carried
    (run_decompositions)."""
    x = torch.ones(2)
    with pytest.raises(LoweringError, match="writes part of the lifted constant 'total'"):
        export_to_stablehlo(torch.export.export(PartialWrite(False, through_reshape=True), (x,), strict=False))
    artifact = export_to_stablehlo(torch.export.export(PartialWrite(True, through_reshape=True), (x,), strict=False))
    eager = PartialWrite(True, through_reshape=True)
    for _ in range(3):
        torch.testing.assert_close(artifact(x), eager(x))
    torch.testing.assert_close(artifact.state["total"], eager.total)


@functools.cache
def _dynamic_prompt_artifact():
    """The Llama recipe exported with a dynamic prompt length (up to 32), converted once for the three paths."""
    recipe = TorchExportableModuleForDecoderOnlyLM(_model("llama")[0], batch_size=1, max_cache_len=CACHE)
    seq = torch.export.Dim("seq", max=32)
    prompt = {"input_ids": PROMPT, "cache_position": torch.arange(PROMPT.shape[1])}
    return export_to_stablehlo(torch.export.export(
        recipe.model, (), prompt, dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}}, strict=False))


@pytest.mark.parametrize("path", ["artifact", "jax", "saved_model"])
def test_a_dynamic_prefill_then_decode(path, tmp_path):
    """The prompt in one call (its length a symbolic dim: the cache write is a scatter, shapes being unknown
    when lowered), then one call per token through the same artifact, its JAX model or its SavedModel: still
    generate's tokens."""
    _, expected = _model("llama")
    artifact = _dynamic_prompt_artifact().reset_state()  # each path starts from the exported (empty) cache
    assert artifact.stablehlo_text.count('"stablehlo.scatter"(') == 4
    prompt = {"input_ids": PROMPT, "cache_position": torch.arange(PROMPT.shape[1])}
    run = artifact
    if path == "jax":
        run = _jax_steps(artifact.to_jax())
    elif path == "saved_model":
        tf = pytest.importorskip("tensorflow")
        run = _served_steps(tf, tf.saved_model.load(str(artifact.save_tf_saved_model(tmp_path / "tf"))))
    logits = run(**prompt)
    tokens = PROMPT[0].tolist()
    for _ in range(NEW_TOKENS):
        tokens.append(int(logits[0, -1].argmax()))
        logits = run(input_ids=torch.tensor([[tokens[-1]]]), cache_position=torch.tensor([len(tokens) - 1]))
    assert tokens == expected
