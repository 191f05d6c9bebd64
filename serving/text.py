"""Token ids to text as they are made: pieces that concatenate to exactly the decoding of all the tokens.

A token may end in the middle of a character (byte-level BPE splits UTF-8 sequences) and a decoder may change
the text of earlier tokens once later ones arrive. So each new token is decoded together with every token
before it, and a piece is released only while the text so far extends what was already released and does not
end in U+FFFD (an incomplete character); anything else is held back until it settles or the request ends,
when the rest of the full decoding is released. Decoding is ``skip_special_tokens=True`` (no eos in the text)
and ``clean_up_tokenization_spaces=False`` (that clean-up rewrites text behind the last token).
``StoppingText`` cuts that text at the first of a request's stop strings, holding back what could begin one.
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


class StoppingText:
    """``IncrementalText`` cut at the first of some stop strings (OpenAI's ``stop``): the stop string and what
    follows are never released; ``stopped`` turns True when one appears (the request should end there). Text
    that could be the start of a stop string is held back until it is not, or the request ends."""

    def __init__(self, tokenizer: Decoder, stop: Sequence[str] = ()):
        self._text = IncrementalText(tokenizer)
        self._stop = [string for string in stop if string]
        self._released, self._pending = "", ""
        self.stopped = False

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self._pending += self._text.push(token)
        return self._release(final=False)

    def finish(self) -> str:
        if not self.stopped:
            self._pending += self._text.finish()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        text = self._released + self._pending
        # no stop string starts inside released text: a possible start is always held back
        found = [at for string in self._stop if (at := text.find(string, len(self._released))) >= 0]
        if found:
            self.stopped = True
            end = min(found)
        else:
            held = 0 if final else max((k for string in self._stop for k in range(1, len(string))
                                        if text.endswith(string[:k])), default=0)
            end = len(text) - min(held, len(self._pending))
        piece = text[len(self._released):end]
        self._released, self._pending = text[:end], text[end:]
        return piece
