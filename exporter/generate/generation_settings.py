"""What one generate program does: the arguments of ``export_generate`` and the model's ``generation_config``,
checked and resolved before anything is traced.

``model.generate`` reads its ``generation_config`` for everything not passed explicitly. Every setting there that
changes which tokens come out is either honoured here (``HONOURED``, and the sampling settings of
``resolve_sampling``) or refused with an error naming it (``REFUSED``); none is silently ignored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# generation_config settings that change the tokens, with the value that changes nothing (None: unset)
HONOURED = {"eos_token_id": None, "pad_token_id": None, "min_new_tokens": None, "min_length": None,
            "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "bad_words_ids": None, "suppress_tokens": None,
            "forced_bos_token_id": None, "forced_eos_token_id": None, "decoder_start_token_id": None}
REFUSED = {"num_beams": 1, "num_return_sequences": 1, "penalty_alpha": None, "dola_layers": None,
           "guidance_scale": 1.0, "sequence_bias": None, "encoder_repetition_penalty": 1.0,
           "encoder_no_repeat_ngram_size": 0, "begin_suppress_tokens": None, "exponential_decay_length_penalty": None,
           "watermarking_config": None, "stop_strings": None, "max_time": None, "force_words_ids": None,
           "constraints": None, "diversity_penalty": 0.0, "num_beam_groups": 1, "min_p": None, "typical_p": 1.0,
           "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None, "renormalize_logits": False,
           "remove_invalid_values": False, "prompt_lookup_num_tokens": None, "use_mtp": False, "token_healing": False}

# generate's own values for the sampling settings neither the call nor the generation_config sets
# (GenerationConfig._get_default_generation_params): top-k 50 included
SAMPLING_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0}

CACHE_ROUNDING = 64  # max_cache_len=None: the example prompt + max_new_tokens, rounded up to a multiple of this
TRACED_PROMPT_LEN = 2  # the shortest prompt the prefill is traced with (torch.export fixes a dim of size 1)
START_TOKENS = 1  # an encoder-decoder's decoder prompt: its start token, at column 0


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: greedy, or drawn from softmax(scores / temperature) cut to the top-k, then
    top-p, tokens (None: no cut)."""
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None


def resolve_sampling(generation_config, do_sample: bool | None = None, temperature: float | None = None,
                     top_k: int | None = None, top_p: float | None = None) -> Sampling:
    """The sampling ``model.generate`` does for these arguments: each one given (not None) wins, else
    ``generation_config``'s value, else generate's default (``SAMPLING_DEFAULTS``: greedy; when sampling,
    temperature 1.0, top-k 50, top-p 1.0). Greedy ignores the config's temperature, top-k and top-p (as
    ``generate``) but refuses them passed explicitly (other than generate's defaults); top-k 0 and top-p 1.0
    mean no cut. Raises ValueError naming a setting out of range. One rule for every program that chooses
    tokens (``export_generate`` and the serving engine)."""
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ValueError(f"do_sample must be True, False or None (the model's default), got {do_sample!r}")
    if any(isinstance(number, bool) for number in (temperature, top_k, top_p)):
        raise ValueError("temperature, top_k and top_p take numbers, not True or False")
    given = {"do_sample": do_sample, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    value = {name: next(v for v in (given[name], getattr(generation_config, name, None), default) if v is not None)
             for name, default in SAMPLING_DEFAULTS.items()}
    if not value["do_sample"]:
        changed = {k: v for k, v in given.items() if k != "do_sample" and v not in (None, SAMPLING_DEFAULTS[k])}
        if changed:
            raise ValueError(f"{', '.join(f'{k}={v!r}' for k, v in changed.items())} only apply when sampling: "
                             "pass do_sample=True, or leave them unset for greedy decoding")
        return Sampling()
    temperature, top_k, top_p = value["temperature"], value["top_k"], value["top_p"]
    if not (isinstance(temperature, (int, float)) and 0 < temperature < math.inf):
        raise ValueError(f"temperature must be a finite number > 0 when sampling, got {temperature!r}")
    if not (isinstance(top_k, int) and top_k >= 0):
        raise ValueError(f"top_k must be a non-negative int (0: no cut), got {top_k!r}")
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] (1: no cut), got {top_p!r}")
    return Sampling(True, float(temperature), int(top_k) or None, None if top_p == 1 else float(top_p))


@dataclass(frozen=True)
class GenerationSettings:
    """Everything the generate program's token choice needs, as plain Python values (baked into the program)."""
    max_new_tokens: int
    max_cache_len: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    min_new_tokens: int = 0
    min_length: int = 0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    suppress_tokens: tuple[int, ...] = ()
    forced_bos_token_id: int | None = None
    forced_eos_token_ids: tuple[int, ...] = ()
    decoder_start_token_id: int | None = None  # an encoder-decoder's first decoder token (None: decoder-only)
    sampling: Sampling = Sampling()

    @property
    def max_prompt_len(self) -> int:
        """The longest prompt (padding included) whose new tokens all fit in the cache."""
        return self.max_cache_len - self.max_new_tokens


def resolve_settings(generation_config, prompt_len: int, vocab_size: int, *, max_new_tokens: int, max_cache_len,
                     do_sample: bool | None, temperature: float | None, top_k, top_p, eos_token_id, pad_token_id,
                     encoder_decoder: bool = False) -> GenerationSettings:
    """The settings of one generate program; raises ValueError naming each refused or impossible setting.
    ``encoder_decoder``: the decoder starts from ``decoder_start_token_id`` alone (``prompt_len`` is the source's).
    The sampling arguments: ``resolve_sampling``'s."""
    refused = [f"{name}={getattr(generation_config, name)!r}" for name, neutral in REFUSED.items()
               if getattr(generation_config, name, None) not in (None, neutral)]
    if refused:
        raise ValueError(f"export_generate does not implement the generation_config setting(s) {', '.join(refused)}; "
                         f"set them to None on model.generation_config (it honours {', '.join(HONOURED)})")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    max_cache_len = _cache_len(prompt_len, max_new_tokens, max_cache_len, encoder_decoder)
    eos = _token_ids(eos_token_id if eos_token_id is not None else generation_config.eos_token_id)
    pad = pad_token_id if pad_token_id is not None else generation_config.pad_token_id
    if pad is None:  # as model.generate: the first eos pads the rows that have finished
        pad = eos[0] if eos else 0
    sampling = resolve_sampling(generation_config, do_sample, temperature, top_k, top_p)
    start = _decoder_start(generation_config) if encoder_decoder else None
    bad_words = tuple(tuple(int(t) for t in word) for word in (generation_config.bad_words_ids or ())
                      if list(word) not in [[e] for e in eos])  # as transformers: a lone eos is never banned
    forced_bos, forced_eos = generation_config.forced_bos_token_id, _token_ids(generation_config.forced_eos_token_id)
    ids = [*eos, int(pad), *(t for word in bad_words for t in word), *(generation_config.suppress_tokens or ()),
           *([] if forced_bos is None else [forced_bos]), *forced_eos, *([] if start is None else [start])]
    outside = sorted({t for t in ids if not 0 <= t < vocab_size})
    if outside:
        raise ValueError(f"token id(s) {outside} (eos, pad, bad words, suppressed, forced or decoder start tokens) "
                         f"are outside the vocabulary of {vocab_size}")
    return GenerationSettings(
        max_new_tokens=max_new_tokens, max_cache_len=max_cache_len, eos_token_ids=eos, pad_token_id=int(pad),
        min_new_tokens=int(generation_config.min_new_tokens or 0), min_length=int(generation_config.min_length or 0),
        repetition_penalty=float(generation_config.repetition_penalty or 1.0),
        no_repeat_ngram_size=int(generation_config.no_repeat_ngram_size or 0), bad_words_ids=bad_words,
        suppress_tokens=tuple(int(t) for t in generation_config.suppress_tokens or ()),
        forced_bos_token_id=None if forced_bos is None else int(forced_bos), forced_eos_token_ids=forced_eos,
        decoder_start_token_id=start, sampling=sampling)


def _cache_len(prompt_len: int, max_new_tokens: int, max_cache_len, encoder_decoder: bool) -> int:
    """The decoder cache's columns: the decoder's prompt (a decoder-only model's prompt, at least the traced one;
    an encoder-decoder's start token) and the new tokens; ``None``: that, rounded up to a multiple of
    ``CACHE_ROUNDING`` for decoder-only models (their prompts vary), exactly that for encoder-decoders."""
    prompt = START_TOKENS if encoder_decoder else max(prompt_len, TRACED_PROMPT_LEN)
    room = prompt + max_new_tokens
    if max_cache_len is None:
        return room if encoder_decoder else math.ceil(room / CACHE_ROUNDING) * CACHE_ROUNDING
    if max_cache_len < room:
        held = ("the decoder start token" if encoder_decoder
                else f"a prompt of {prompt} tokens (the example's, and at least {TRACED_PROMPT_LEN})")
        raise ValueError(f"max_cache_len={max_cache_len} cannot hold {held} and max_new_tokens={max_new_tokens}; "
                         f"give at least {room}")
    return int(max_cache_len)


def _decoder_start(generation_config) -> int:
    """An encoder-decoder's first decoder token, as ``model.generate`` picks it."""
    start = generation_config.decoder_start_token_id
    if start is None:
        start = generation_config.bos_token_id
    if start is None:
        raise ValueError("an encoder-decoder needs generation_config.decoder_start_token_id (or bos_token_id): the "
                         "token its decoder starts from")
    if isinstance(start, (list, tuple)):
        raise ValueError(f"decoder_start_token_id={start!r}: one start token per row is not implemented; give one id")
    return int(start)


def _token_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
