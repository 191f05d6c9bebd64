"""What the server tests share: a tiny Llama and a byte-level BPE tokenizer trained here (no hub), a checkpoint
folder of both, HF ``generate`` as the reference, a uvicorn server in a thread on 127.0.0.1, and
``GreedyHFEngineDouble``: a TEST DOUBLE of ``serving.Engine`` (the contract the server drives: ``submit``,
blocking and async iteration, ``cancel``, ``finish_reason``, bounded queue, slots) decoding greedily with the HF
model in a thread, so the HTTP behaviour is tested without the exported engine. It is not the engine."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import threading
import time
from pathlib import Path

import torch
import uvicorn
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from torch_stablehlo.serving import QueueFull, RequestError

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Serving engines batch requests continuously.",
          "Café, naïve, über: accents are bytes too.", "日本語のテキストも少し。", "Emoji travel in four bytes: 🦊🐶.",
          "Prompts of different lengths arrive one at a time.", "StableHLO runs on PJRT, on CPUs and GPUs."]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIAL = ["<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]


def train_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE of ~300 tokens: characters outside ASCII span several tokens, so streamed text must
    hold back incomplete characters."""
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(CORPUS * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>", pad_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_llama(vocab_size: int, eos_token_id: int, max_positions: int = 256) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         bos_token_id=0, eos_token_id=eos_token_id, pad_token_id=eos_token_id)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.do_sample = False
    return model


def save_checkpoint(folder: Path, model, tokenizer) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def reference_tokens(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """HF ``generate``'s greedy tokens for the prompt alone (ending at eos or ``max_new_tokens``)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


@contextlib.contextmanager
def running(app):
    """``app`` served by uvicorn in a thread on 127.0.0.1 (a free port); yields ``http://127.0.0.1:PORT``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


class _DoubleRequest:
    """One request of the double: tokens handed from the decode thread to blocking or async readers."""

    def __init__(self, prompt_ids: list[int], max_new_tokens: int):
        self.prompt_ids, self.max_new_tokens = prompt_ids, max_new_tokens
        self.prompt_tokens = len(prompt_ids)
        self.finish_reason: str | None = None
        self.cancelled = False
        self.tokens: list[int] = []
        self.past = None
        self._changed = threading.Condition()
        self._wakers: list = []  # (loop, asyncio.Event) of async readers

    def cancel(self) -> None:
        self.cancelled = True

    def _publish(self, token: int | None = None, finish_reason: str | None = None) -> None:
        with self._changed:
            if token is not None:
                self.tokens.append(token)
            if finish_reason is not None:
                self.finish_reason = finish_reason
            self._changed.notify_all()
            for loop, event in self._wakers:
                loop.call_soon_threadsafe(event.set)

    def __iter__(self):
        index = 0
        while True:
            with self._changed:
                self._changed.wait_for(lambda: index < len(self.tokens) or self.finish_reason is not None)
                if index >= len(self.tokens):
                    return
                token = self.tokens[index]
            index += 1
            yield token

    async def __aiter__(self):
        index, event = 0, asyncio.Event()
        with self._changed:
            self._wakers.append((asyncio.get_running_loop(), event))
        while True:
            with self._changed:
                ready = index < len(self.tokens)
                token = self.tokens[index] if ready else None
                if not ready and self.finish_reason is not None:
                    return
                if not ready:
                    event.clear()
            if ready:
                index += 1
                yield token
            else:
                await event.wait()


class GreedyHFEngineDouble:
    """TEST DOUBLE of ``serving.Engine`` for the server tests: at most ``slots`` requests decode at once (one HF
    forward per request per step, with its own KV cache), the rest wait in a queue of ``max_queue``;
    ``step_seconds`` slows each step so that tests can act mid-generation."""

    def __init__(self, model, *, slots: int = 2, max_queue: int = 16, max_prompt_len: int = 48,
                 step_seconds: float = 0.0):
        self.model, self.slots, self.max_queue, self.max_prompt_len = model, slots, max_queue, max_prompt_len
        self.vocab_size = model.config.vocab_size
        self.eos_token_ids = {model.generation_config.eos_token_id}
        self.step_seconds = step_seconds
        self.cancelled: list[_DoubleRequest] = []
        self._waiting: collections.deque = collections.deque()
        self._active: list[_DoubleRequest] = []
        self._lock = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def slots_busy(self) -> int:
        return len(self._active)

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        self._thread.join(30)

    def submit(self, prompt_ids, max_new_tokens=64, do_sample=None, temperature=None, top_k=None, top_p=None,
               seed=None) -> _DoubleRequest:
        if do_sample:
            raise RequestError("the test double decodes greedily only")
        if not prompt_ids:
            raise RequestError("the prompt is empty")
        if len(prompt_ids) > self.max_prompt_len:
            raise RequestError(f"the prompt is {len(prompt_ids)} tokens; at most {self.max_prompt_len}")
        if any(not 0 <= token < self.vocab_size for token in prompt_ids):
            raise RequestError(f"a token id is outside the vocabulary of {self.vocab_size}")
        if max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        request = _DoubleRequest(list(prompt_ids), max_new_tokens)
        with self._lock:
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests wait")
            self._waiting.append(request)
            self._lock.notify_all()
        return request

    def _run(self) -> None:
        while True:
            with self._lock:
                while len(self._active) < self.slots and self._waiting:
                    self._active.append(self._waiting.popleft())
                if self._stop:
                    return
                if not self._active:
                    self._lock.wait(0.05)
                    continue
            for request in list(self._active):
                self._step(request)
            time.sleep(self.step_seconds)

    def _step(self, request: _DoubleRequest) -> None:
        if request.cancelled:
            self._retire(request, "cancelled")
            self.cancelled.append(request)
            return
        with torch.no_grad():
            fed = request.prompt_ids if request.past is None else request.tokens[-1:]
            out = self.model(input_ids=torch.tensor([fed]), past_key_values=request.past, use_cache=True)
        request.past = out.past_key_values
        token = int(out.logits[0, -1].argmax())
        done = ("stop" if token in self.eos_token_ids
                else "length" if len(request.tokens) + 1 >= request.max_new_tokens else None)
        request._publish(token)
        if done:
            self._retire(request, done)

    def _retire(self, request: _DoubleRequest, reason: str) -> None:
        with self._lock:
            self._active.remove(request)
        request._publish(finish_reason=reason)


if __name__ == "__main__":  # README's checkpoint folder for tests/test_documented_commands.py: FOLDER
    import sys

    _tokenizer = train_tokenizer()
    save_checkpoint(Path(sys.argv[1]), tiny_llama(len(_tokenizer), _tokenizer.eos_token_id), _tokenizer)
