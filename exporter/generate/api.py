"""``export_generate``: a transformers causal LM's whole generate loop as one StableHLO program."""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch.export import Dim

from torch_stablehlo.stablehlo_ir.specs import TensorSpec

from ..api import export_to_stablehlo
from ..conversion.signature import InputSlot, OutputSlot, Signature
from ..errors import InputError
from ..formats.artifact import StableHLOArtifact
from .compose import compose
from .settings import TRACED_PROMPT_LEN, GenerationSettings, resolve_settings
from .steps import Decode, Prefill, cache_shapes

PROMPT_DIM = "prompt"


class GenerateArtifact(StableHLOArtifact):
    """A generate program: ``art(input_ids, attention_mask=None)`` returns ``[batch, prompt + max_new_tokens]``
    tokens like ``model.generate`` (the pad token after a row's eos, and after every row once all are done).

    A bundle of it (``save``) loads as a plain artifact, called ``loaded(input_ids, attention_mask=mask)``. Where it
    samples, its SavedModel and JAX model take a ``seed`` (see ``formats.saved_model`` and ``formats.jax_handoff``)."""

    def __init__(self, stablehlo_text: str, signature: Signature, weights: dict, settings: GenerationSettings,
                 *, platform: str = "cpu"):
        super().__init__(stablehlo_text, signature, weights, platform=platform)
        self.settings = settings

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        check_prompt(input_ids, attention_mask)
        settings = self.settings
        if input_ids.shape[1] > settings.max_prompt_len:
            raise InputError(f"a prompt of {input_ids.shape[1]} tokens does not fit: this program's cache holds "
                             f"{settings.max_cache_len} tokens, {settings.max_new_tokens} of them for new ones, so "
                             f"prompts of 1 to {settings.max_prompt_len} tokens (padding included); export with a "
                             "larger max_cache_len for longer ones")
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(torch.int64)
        return super().__call__(input_ids, attention_mask=mask)


def check_prompt(input_ids, attention_mask) -> None:
    """Raises InputError unless ``input_ids`` is an int64 prompt [batch, prompt] (prompt >= 1) and
    ``attention_mask`` (where given) left-pads it: per row zeros, then ones, ending with a one."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.int64:
        got = getattr(input_ids, "dtype", type(input_ids).__name__)
        raise InputError(f"input_ids must be an int64 tensor [batch, prompt], got {got} "
                         f"{list(getattr(input_ids, 'shape', []))}")
    if input_ids.shape[1] == 0:
        raise InputError("input_ids holds no prompt (0 columns)")
    if attention_mask is None:
        return
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        raise InputError(f"attention_mask must be a tensor of input_ids' shape {list(input_ids.shape)}, got "
                         f"{list(getattr(attention_mask, 'shape', []))}")
    mask = attention_mask.to(torch.int64)
    if ((mask != 0) & (mask != 1)).any() or (mask[:, 1:] < mask[:, :-1]).any() or (mask[:, -1] == 0).any():
        raise InputError("attention_mask must left-pad each row (zeros, then ones, ending with a one): new tokens "
                         "follow the last column, as model.generate needs for decoder-only models")


def export_generate(model, input_ids: torch.Tensor, max_new_tokens: int = 64, max_cache_len: int | None = None,
                    attention_mask: torch.Tensor | None = None, do_sample: bool = False, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = None, eos_token_id=None,
                    pad_token_id: int | None = None) -> GenerateArtifact:
    """``model.generate`` (a transformers causal LM in eval mode, every layer full attention) as one program: the
    prompt through the model, then one ``stablehlo.while`` over the new tokens that stops once every row has
    produced an eos, the KV cache made and updated inside. Prompts of any length up to ``max_cache_len -
    max_new_tokens`` (``max_cache_len=None``: the example's length plus ``max_new_tokens``, rounded up to a
    multiple of 64) run through it, at the example's batch size. Greedy unless ``do_sample``; sampling draws
    from the artifact's seed (``art.manual_seed``). ``eos_token_id`` (an id or a list) and ``pad_token_id``
    default to ``model.generation_config``'s, whose other settings are honoured or refused (``settings.py``)."""
    if model.training:
        raise ValueError("export_generate takes a model in eval mode (call model.eval() first)")
    check_prompt(input_ids, attention_mask)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    settings = resolve_settings(model.generation_config, input_ids.shape[1], vocab_size, max_new_tokens=max_new_tokens,
                                max_cache_len=max_cache_len, do_sample=do_sample, temperature=temperature,
                                top_k=top_k, top_p=top_p, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    batch = input_ids.shape[0]
    shapes = cache_shapes(model, batch, settings.max_cache_len)
    prompt = Dim(PROMPT_DIM, min=1, max=settings.max_prompt_len)
    prefill = export_to_stablehlo(Prefill(model, settings, shapes), _traced_prompt(input_ids, attention_mask),
                                  dynamic_shapes=({1: prompt}, {1: prompt}))
    decode = export_to_stablehlo(Decode(model, settings), _decode_example(model, settings, shapes, batch))
    program = compose(prefill, decode, settings.max_new_tokens)
    return GenerateArtifact(program.stablehlo_text, _signature(program.weight_slots, batch, settings),
                            program.weights, settings)


def _traced_prompt(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple:
    """The prompt the prefill is traced with: the example, repeated up to ``TRACED_PROMPT_LEN`` tokens (torch.export
    would fix a prompt dim of 1; only the shapes matter)."""
    repeats = -(-TRACED_PROMPT_LEN // input_ids.shape[1])
    return input_ids.repeat(1, repeats), attention_mask.to(torch.int64).repeat(1, repeats)


def _decode_example(model, settings: GenerationSettings, shapes: list, batch: int) -> tuple:
    """Inputs of ``Decode`` with the shapes and dtypes the loop carries (the values do not matter, but no two may
    be one tensor: torch.export would make them one input)."""
    size = settings.max_cache_len
    return (torch.zeros(batch, size, dtype=torch.int64), torch.tensor(0), torch.zeros(batch, dtype=torch.bool),
            [torch.zeros(shape, dtype=model.dtype) for shape in shapes], torch.ones(batch, size, dtype=torch.int64),
            torch.tensor(0))


def _signature(weight_slots: list[InputSlot], batch: int, settings: GenerationSettings) -> Signature:
    """``@main``'s calling convention: the weights, ``input_ids`` and ``attention_mask`` [batch, prompt] (int64),
    ``rng_seed`` where it samples; one output, ``sequences`` [batch, prompt + max_new_tokens]."""
    example = torch.zeros(batch, 1, dtype=torch.int64)
    inputs = [*weight_slots] + [InputSlot(name, "user_input", name, TensorSpec(name, "int64", (batch, PROMPT_DIM)))
                                for name in ("input_ids", "attention_mask")]
    if settings.do_sample:
        inputs.append(InputSlot("rng_seed", "rng_seed", None, TensorSpec("rng_seed", "int64", ())))
    sequences = TensorSpec("sequences", "int64", (batch, f"{PROMPT_DIM} + {settings.max_new_tokens}"))
    in_spec = pytree.tree_flatten(((example,), {"attention_mask": example}))[1]
    out_spec = pytree.tree_flatten(example)[1]
    return Signature(inputs, [OutputSlot("user_output", None, sequences)], pytree.treespec_dumps(in_spec),
                     pytree.treespec_dumps(out_spec), {PROMPT_DIM: [1, settings.max_prompt_len]})
