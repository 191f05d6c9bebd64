"""What every generate program shares, causal LM or encoder-decoder: the artifact it is (``GenerateArtifact``),
``@main``'s calling convention (``generate_signature``) and the example its first step is traced with."""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from torch_stablehlo.exported_program import USER_INPUT, USER_OUTPUT
from torch_stablehlo.stablehlo_ir.specs import TensorSpec

from ..conversion.signature import RNG_SEED_SLOT, InputSlot, OutputSlot, Signature
from ..errors import InputError
from ..formats.artifact import StableHLOArtifact
from .generation_settings import TRACED_PROMPT_LEN, GenerationSettings

INPUT_NAMES = ("input_ids", "attention_mask")  # @main's user inputs, [batch, the symbolic dim]


class GenerateArtifact(StableHLOArtifact):
    """A causal LM's generate program: ``art(input_ids, attention_mask=None)`` returns ``[batch, prompt +
    max_new_tokens]`` tokens like ``model.generate`` (the pad token after a row's eos, and after every row once all
    are done). ``Seq2SeqGenerateArtifact`` is an encoder-decoder's.

    A bundle of it (``save``) loads as a plain artifact, called ``loaded(input_ids, attention_mask=mask)``. Where it
    samples, its SavedModel and JAX model take a ``seed`` (see ``formats.saved_model`` and ``formats.jax_handoff``).
    Every entry point but the SavedModel (whose signatures take every input) defaults ``attention_mask`` to ones,
    as ``model.generate`` does: the signature says so (``InputSlot.ones_like``)."""

    def __init__(self, stablehlo_text: str, signature: Signature, weights: dict, settings: GenerationSettings,
                 *, platform: str = "cpu", sharding_plan=None):
        super().__init__(stablehlo_text, signature, weights, platform=platform, sharding_plan=sharding_plan)
        self.settings = settings

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        check_tokens(input_ids, attention_mask)
        self.check_inputs(input_ids, attention_mask)
        mask = {} if attention_mask is None else {"attention_mask": attention_mask.to(torch.int64)}
        return super().__call__(input_ids, **mask)

    def check_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        """Raises InputError unless the prompt fits the cache and ``attention_mask`` left-pads it."""
        check_left_padding(attention_mask)
        settings = self.settings
        if input_ids.shape[1] > settings.max_prompt_len:
            raise InputError(f"a prompt of {input_ids.shape[1]} tokens does not fit: this program's cache holds "
                             f"{settings.max_cache_len} tokens, {settings.max_new_tokens} of them for new ones, so "
                             f"prompts of 1 to {settings.max_prompt_len} tokens (padding included); export with a "
                             "larger max_cache_len for longer ones")


def check_tokens(input_ids, attention_mask) -> None:
    """Raises InputError unless ``input_ids`` is int64 [batch, length] (length >= 1) and ``attention_mask`` (where
    given) is zeros and ones of its shape."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.int64:
        got = getattr(input_ids, "dtype", type(input_ids).__name__)
        raise InputError(f"input_ids must be an int64 tensor [batch, length], got {got} "
                         f"{list(getattr(input_ids, 'shape', []))}")
    if input_ids.shape[1] == 0:
        raise InputError("input_ids holds no tokens (0 columns)")
    if attention_mask is None:
        return
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        raise InputError(f"attention_mask must be a tensor of input_ids' shape {list(input_ids.shape)}, got "
                         f"{list(getattr(attention_mask, 'shape', []))}")
    mask = attention_mask.to(torch.int64)
    if ((mask != 0) & (mask != 1)).any():
        raise InputError("attention_mask must hold only zeros (padding) and ones (tokens)")


def check_left_padding(attention_mask) -> None:
    """Raises InputError unless each row of ``attention_mask`` (where given) is zeros, then ones, ending with a one."""
    if attention_mask is None:
        return
    mask = attention_mask.to(torch.int64)
    if (mask[:, 1:] < mask[:, :-1]).any() or (mask[:, -1] == 0).any():
        raise InputError("attention_mask must left-pad each row (zeros, then ones, ending with a one): new tokens "
                         "follow the last column, as model.generate needs for decoder-only models")


def traced_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple:
    """The inputs the first step is traced with: the example, repeated up to ``TRACED_PROMPT_LEN`` columns
    (torch.export would fix a dim of 1; only the shapes matter)."""
    repeats = -(-TRACED_PROMPT_LEN // input_ids.shape[1])
    return input_ids.repeat(1, repeats), attention_mask.to(torch.int64).repeat(1, repeats)


def generate_signature(weight_slots: list[InputSlot], batch: int, settings: GenerationSettings, dim: str,
                       max_len: int, sequences) -> Signature:
    """``@main``'s calling convention: the weights, ``input_ids`` and ``attention_mask`` [batch, ``dim``] (int64,
    ``dim`` from 1 to ``max_len``; a call may leave out the mask: ones), ``rng_seed`` where it samples; one
    output, ``sequences`` [batch, ``sequences``] (a column count, or an expression of ``dim``)."""
    example = torch.zeros(batch, 1, dtype=torch.int64)
    ids, mask = INPUT_NAMES
    inputs = [*weight_slots, InputSlot(ids, USER_INPUT, ids, TensorSpec(ids, "int64", (batch, dim))),
              InputSlot(mask, USER_INPUT, mask, TensorSpec(mask, "int64", (batch, dim)), ones_like=ids)]
    if settings.sampling.do_sample:
        inputs.append(RNG_SEED_SLOT)
    output = TensorSpec("sequences", "int64", (batch, sequences))
    in_spec = pytree.tree_flatten(((example,), {"attention_mask": example}))[1]
    out_spec = pytree.tree_flatten(example)[1]
    return Signature(inputs, [OutputSlot(USER_OUTPUT, None, output)], pytree.treespec_dumps(in_spec),
                     pytree.treespec_dumps(out_spec), {dim: [1, max_len]}, arg_names=["input_ids"])
