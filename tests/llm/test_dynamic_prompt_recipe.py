"""transformers' static-cache recipe exported with a dynamic prompt dim (``Dim("seq")`` on ``input_ids`` and
``cache_position``), as its own ``.export()`` and ExecuTorch/optimum do: called one token at a time (each call's
module refined to size 1), it decodes as the static one-token program does, logits within 1e-5 and the same
greedy tokens, and its compiled size-1 module has the static program's decode forms: attention over the live
prefix of the cache (a ``stablehlo.case``, chosen from the cache's static length), no copy of the cache, and the
same products, branches, copies and cache writes, of the same shapes, as the static program's compiled module
(bench/decode_speed.py's ``dynamic prompt`` row times the two)."""
import collections
import re

import torch
from torch.export import Dim
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

from torch_stablehlo import export_to_stablehlo

CACHE = 256  # buckets of 64, 128 and 256 keys


def _compiled_hlo(artifact) -> str:
    executable, = artifact._executables.values()
    return executable.loaded.hlo_modules()[0].to_string()


def _costly_ops(hlo: str) -> collections.Counter:
    """The compiled module's products, branches, copies and in-place writes, by result type."""
    return collections.Counter(re.findall(r"= (\S+) (dot|conditional|copy|dynamic-update-slice|scatter)\(", hlo))


def test_dynamic_prompt_recipe_decodes_as_the_static_one():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=512, initializer_range=0.5)).eval()
    model.generation_config.cache_implementation = "static"
    recipe = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=CACHE).model
    one = {"input_ids": torch.tensor([[0]]), "cache_position": torch.tensor([0])}
    static = export_to_stablehlo(torch.export.export(recipe, (), one, strict=False))
    seq = Dim("seq", min=1, max=32)
    dynamic = export_to_stablehlo(torch.export.export(
        recipe, (), {"input_ids": torch.tensor([[0, 0]]), "cache_position": torch.tensor([0, 1])}, strict=False,
        dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}}))
    # the attention's decomposition (one function, the layers' composites share it) holds the live-prefix case
    assert dynamic.stablehlo_text.count("stablehlo.case") == static.stablehlo_text.count("stablehlo.case") == 1
    token, tokens = 3, []
    for position in range(12):
        step = {"input_ids": torch.tensor([[token]]), "cache_position": torch.tensor([position])}
        expected = static(**step)
        torch.testing.assert_close(dynamic(**step), expected, rtol=0, atol=1e-5)
        token = int(expected[0, -1].argmax())
        tokens.append(token)
    assert len(set(tokens)) > 3, "greedy decoding should not settle on one token"
    for artifact in (static, dynamic):
        hlo = _compiled_hlo(artifact)
        assert "conditional(" in hlo
        assert not re.findall(rf"f32\[1,2,{CACHE},16\]\S* copy\(", hlo)
    assert _costly_ops(_compiled_hlo(dynamic)) == _costly_ops(_compiled_hlo(static))
