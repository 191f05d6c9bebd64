"""Token ids to text as they are made: pieces that concatenate to exactly the decoding of all the tokens.

A token may end in the middle of a character (byte-level BPE splits UTF-8 sequences) and a decoder may change
the text of earlier tokens once later ones arrive. So each new token is decoded together with every token
before it, and a piece is released only while the text so far extends what was already released and does not
end in U+FFFD (an incomplete character); anything else is held back until it settles or the request ends,
when the rest of the full decoding is released. Decoding is ``skip_special_tokens=True`` (no eos in the text)
and ``clean_up_tokenization_spaces=False`` (that clean-up rewrites text behind the last token).
"""
from __future__ import annotations

from typing import Protocol, Sequence

INCOMPLETE = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], **options) -> str: ...


def decode(tokenizer: Decoder, token_ids: Sequence[int]) -> str:
    """The text of ``token_ids``: what a non-streamed response returns."""
    return tokenizer.decode(list(token_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


class IncrementalText:
    """Feed it tokens one by one (``push``); each call returns the text that is now settled (maybe ``""``);
    ``finish()`` returns the rest, so that the pieces add up to ``decode(tokenizer, tokens)``."""

    def __init__(self, tokenizer: Decoder):
        self._tokenizer = tokenizer
        self.tokens: list[int] = []
        self.released = ""

    def push(self, token: int) -> str:
        self.tokens.append(token)
        text = decode(self._tokenizer, self.tokens)
        if text.endswith(INCOMPLETE) or not text.startswith(self.released):
            return ""
        return self._release(text)

    def finish(self) -> str:
        text = decode(self._tokenizer, self.tokens)
        if not text.startswith(self.released):
            raise RuntimeError(f"the tokenizer's text changed behind released text: {self.released!r} is not a "
                               f"prefix of {text!r}")
        return self._release(text)

    def _release(self, text: str) -> str:
        piece, self.released = text[len(self.released):], text
        return piece
