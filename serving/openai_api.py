"""An OpenAI-compatible HTTP app (FastAPI) over an ``Engine``: what ``torch-stablehlo serve`` runs.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (the tokenizer's chat template), both with
``stream: true`` as server-sent events ending in ``data: [DONE]``; ``GET /v1/models``, ``GET /health`` and
``GET /metrics`` (Prometheus text, ``metrics.py`` says what each series means). ``/health`` names the
serving process, which tells Ray Serve's replicas apart.

The engine is injected (``build_app(engine, tokenizer, model_name)``): anything with the Engine's ``submit``
and its ``slots``, ``slots_busy``, ``queue_depth`` and ``max_prompt_len`` attributes serves. Text is the
tokenizer's decoding of the generated tokens, cut before the first of the request's ``stop`` strings (which
ends the request); streamed or not, it is made by the same ``text.StoppingText``, so streamed pieces add up to
exactly the non-streamed text. Every error is an OpenAI-style body ``{"error": {"message", "type", "param",
"code"}}``: 400 for a malformed or invalid request (and what the engine refuses), 404 for an unknown model or
route, 429 when the engine's queue is full, 500 for a failure inside (logged; the server keeps serving). A
client that goes away, streamed or not, has its request cancelled, which frees its slot.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from torch_stablehlo.serving import QueueFull, RequestError

from .metrics import ServerMetrics
from .text import StoppingText

log = logging.getLogger(__name__)
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
DEFAULT_COMPLETION_TOKENS = 16
"""OpenAI's default ``max_tokens`` for ``/v1/completions``; chat's default is the app's ``chat_max_tokens``."""


# -- errors ---------------------------------------------------------------------------------------

class APIError(Exception):
    """An error answered as OpenAI answers it: an HTTP status and ``{"error": {...}}``."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status,
                            headers={"Retry-After": "1"} if self.status == 429 else None)


def _validation_error(error: RequestValidationError) -> APIError:
    """FastAPI's list of validation problems as one 400: where (``body.max_tokens``) and what."""
    problems = error.errors()
    if any(problem.get("type") == "json_invalid" for problem in problems):
        return APIError(400, "the request body is not valid JSON", code="invalid_json")
    first = problems[0] if problems else {}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    text = "; ".join(f"{'.'.join(str(p) for p in problem.get('loc', ()) if p != 'body') or 'body'}: "
                     f"{problem.get('msg')}" for problem in problems)
    return APIError(400, f"invalid request: {text}", param=location[0] if location else None)


# -- requests -------------------------------------------------------------------------------------

class StreamOptions(BaseModel):
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """The fields both endpoints share. Fields of the OpenAI API that this server cannot honour are refused
    (``refusals``), never ignored; unknown fields (``user``, ...) are ignored."""
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def refusals(self) -> list[tuple[str, str]]:
        """(field, why) for each requested feature this server does not have."""
        refused = []
        if self.n != 1:
            refused.append(("n", "this server makes one choice per request (n=1)"))
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                refused.append((name, f"{name} is not supported"))
        if self.logit_bias:
            refused.append(("logit_bias", "logit_bias is not supported"))
        return refused

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or ())

    def sampling(self) -> dict[str, Any]:
        """``Engine.submit``'s sampling arguments: None leaves the model's generation_config to decide;
        temperature 0 is greedy, as OpenAI's is."""
        if self.temperature == 0:  # greedy: OpenAI ignores the cuts there (the engine refuses them with greedy)
            return {"do_sample": False, "temperature": None, "top_k": None, "top_p": None, "seed": self.seed}
        return {"do_sample": None if self.temperature is None else True, "temperature": self.temperature,
                "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed}


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(DEFAULT_COMPLETION_TOKENS, ge=1)
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def refusals(self) -> list[tuple[str, str]]:
        refused = super().refusals()
        if isinstance(self.prompt, list) and len(self.prompt) != 1 and not all(isinstance(t, int) for t in self.prompt):
            refused.append(("prompt", "one prompt per request"))
        for name, present in (("echo", self.echo), ("logprobs", self.logprobs is not None),
                              ("best_of", (self.best_of or 1) > 1), ("suffix", self.suffix)):
            if present:
                refused.append((name, f"{name} is not supported"))
        return refused


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if not isinstance(self.content, list):
            return self.content or ""
        for part in self.content:
            if part.type != "text":
                raise APIError(400, f"message content of type {part.type!r}: only text is supported",
                               param="messages")
        return "".join(part.text or "" for part in self.content)


class ChatRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    tools: list[dict] | None = None

    def refusals(self) -> list[tuple[str, str]]:
        refused = super().refusals()
        for name, present in (("logprobs", self.logprobs), ("tools", self.tools)):
            if present:
                refused.append((name, f"{name} is not supported"))
        return refused


# -- responses ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    """One response's identity and shape: a text completion or a chat completion."""
    chat: bool
    id: str
    created: int
    model: str

    @classmethod
    def new(cls, chat: bool, model: str) -> "Reply":
        return cls(chat, f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()), model)

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: str, usage: dict) -> dict:
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}
                  if self.chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason})
        return {**self._head(False), "choices": [choice], "usage": usage}

    def chunk(self, piece: str | None, finish_reason: str | None = None) -> dict:
        """A streamed piece of text (``None``: the chat stream's opening, which names the role)."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if piece is None else {"content": piece} if piece else {}
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, usage: dict) -> dict:
        return {**self._head(True), "choices": [], "usage": usage}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _event(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


class EventStream(StreamingResponse):
    """Server-sent events that always notice a client going away: the body is streamed while the request's
    ``receive`` is watched for ``http.disconnect`` (whichever ASGI version the server speaks), and the event
    source is closed however the response ends, so its ``finally`` (cancelling the engine request) runs."""

    def __init__(self, events: AsyncIterator[str]):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as group:
                async def stream():
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away between two events
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()


async def _disconnected(request: Request) -> None:
    """Returns when the client of a request whose body was read goes away (or its response is complete)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# -- the app --------------------------------------------------------------------------------------

class OpenAIServer:
    """The routes' state: the engine, the tokenizer, the served model's name and the metrics."""

    def __init__(self, engine, tokenizer, model_name: str, *, chat_max_tokens: int = 256):
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.chat_max_tokens = chat_max_tokens
        self.metrics = ServerMetrics(engine)

    # routes
    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        self._accept(body)
        prompt = body.prompt[0] if isinstance(body.prompt, list) and len(body.prompt) == 1 \
            and not isinstance(body.prompt[0], int) else body.prompt
        ids = list(prompt) if isinstance(prompt, list) else self.tokenizer(prompt)["input_ids"]
        max_tokens = DEFAULT_COMPLETION_TOKENS if body.max_tokens is None else body.max_tokens
        return await self._answer(Reply.new(False, self.model_name), body, ids, max_tokens, request, "prompt")

    async def chat_completions(self, body: ChatRequest, request: Request) -> Response:
        self._accept(body)
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError(400, f"model {self.model_name!r} has no chat template in its tokenizer: "
                                "use /v1/completions", param="messages")
        messages = [{"role": message.role, "content": message.text()} for message in body.messages]
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as error:  # noqa: BLE001  (a template's own checks: roles must alternate, ...)
            raise APIError(400, f"the chat template refused the messages: {error}", param="messages") from error
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        max_tokens = body.max_completion_tokens or body.max_tokens or self.chat_max_tokens
        return await self._answer(Reply.new(True, self.model_name), body, ids, max_tokens, request, "messages")

    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "torch-stablehlo"}]}

    async def health(self) -> dict:
        return {"status": "ok", "slots": self.engine.slots, "slots_busy": self.engine.slots_busy,
                "queue_depth": self.engine.queue_depth, "process": os.getpid()}

    async def prometheus(self) -> Response:
        return Response(self.metrics.exposition(), media_type=self.metrics.content_type)

    # the work
    def _accept(self, body: GenerationRequest) -> None:
        if body.model != self.model_name:
            raise APIError(404, f"the model {body.model!r} does not exist; this server serves "
                                f"{self.model_name!r}", param="model", code="model_not_found")
        for name, why in body.refusals():
            raise APIError(400, why, param=name, code="unsupported_parameter")

    def _submit(self, ids: list[int], max_tokens: int, body: GenerationRequest, param: str):
        if len(ids) > self.engine.max_prompt_len:
            raise APIError(400, f"the prompt is {len(ids)} tokens; this engine takes at most "
                                f"{self.engine.max_prompt_len}", param=param, code="context_length_exceeded")
        try:
            handle = self.engine.submit(ids, max_new_tokens=max_tokens, **body.sampling())
        except QueueFull as error:
            raise APIError(429, f"the engine's queue is full ({error}); try again shortly",
                           kind="rate_limit_exceeded", code="queue_full") from error
        except RequestError as error:
            raise APIError(400, str(error), param=param) from error
        self.metrics.prompt_tokens.inc(len(ids))
        return handle

    async def _answer(self, reply: Reply, body: GenerationRequest, ids: list[int], max_tokens: int,
                      request: Request, param: str) -> Response:
        arrived = time.perf_counter()
        handle = self._submit(ids, max_tokens, body, param)
        generation = Generation(self, handle, arrived, request.url.path, body.stop_strings())
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return EventStream(self._events(reply, generation, len(ids), usage))
        text = await self._collect(generation, request)
        if text is None:  # the client went away: nobody reads this
            return Response(status_code=499)
        return JSONResponse(reply.whole(text, generation.finish_reason, _usage(len(ids), generation.tokens)))

    async def _collect(self, generation: Generation, request: Request) -> str | None:
        """The whole text, or None if the client went away first (the request is then cancelled)."""
        pieces: list[str] = []

        async def consume():
            async for piece in generation.pieces():
                pieces.append(piece)

        consumer, watcher = asyncio.ensure_future(consume()), asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not consumer.done():
                consumer.cancel()
                await asyncio.gather(consumer, return_exceptions=True)
                return None
        consumer.result()
        return "".join(pieces)

    async def _events(self, reply: Reply, generation: Generation, prompt_tokens: int,
                      include_usage: bool) -> AsyncIterator[str]:
        pieces = generation.pieces()
        try:
            if reply.chat:
                yield _event(reply.chunk(None))
            async for piece in pieces:
                yield _event(reply.chunk(piece))
            yield _event(reply.chunk("", generation.finish_reason))
            if include_usage:
                yield _event(reply.usage_chunk(_usage(prompt_tokens, generation.tokens)))
        except Exception as error:  # noqa: BLE001  (the stream is open: the error becomes its last event)
            log.exception("a streamed request failed")
            self.metrics.count(generation.endpoint, "error")
            yield _event(APIError(500, f"generation failed: {error}", kind="server_error").body())
        finally:
            await pieces.aclose()
        yield _event("[DONE]")


class Generation:
    """An accepted request on its way out: its tokens, timed into the metrics, become settled pieces of text
    (``text.StoppingText``), cut at the first stop string, which ends the request (``finish_reason`` 'stop').
    A reader that goes away before the end cancels the request, freeing its slot."""

    def __init__(self, server: OpenAIServer, handle, arrived: float, endpoint: str, stop: list[str]):
        self.handle, self.arrived, self.endpoint = handle, arrived, endpoint
        self._metrics, self._text = server.metrics, StoppingText(server.tokenizer, stop)
        self.tokens = 0
        self.finish_reason: str | None = None

    async def pieces(self) -> AsyncIterator[str]:
        metrics, last = self._metrics, None
        try:
            async for token in self.handle:
                now = time.perf_counter()
                (metrics.time_to_first_token.observe(now - self.arrived) if last is None
                 else metrics.inter_token_latency.observe(now - last))
                last = now
                metrics.generation_tokens.inc()
                self.tokens += 1
                piece = self._text.push(token)
                if piece:
                    yield piece
                if self._text.stopped:
                    break
        except (GeneratorExit, asyncio.CancelledError):  # its reader went away
            self.handle.cancel()
            metrics.count(self.endpoint, "cancelled")
            raise
        except Exception:
            self.handle.cancel()
            raise
        if self._text.stopped:
            self.handle.cancel()
        rest = self._text.finish()
        self.finish_reason = "stop" if self._text.stopped else self.handle.finish_reason
        metrics.request_duration.observe(time.perf_counter() - self.arrived)
        metrics.count(self.endpoint, self.finish_reason)
        if rest:
            yield rest


def build_app(engine, tokenizer, model_name: str, *, chat_max_tokens: int = 256) -> FastAPI:
    """The FastAPI app serving ``engine`` as ``model_name``; ``tokenizer`` is a transformers tokenizer."""
    server = OpenAIServer(engine, tokenizer, model_name, chat_max_tokens=chat_max_tokens)
    app = FastAPI(title=f"torch-stablehlo: {model_name}", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.post(COMPLETIONS)(server.completions)
    app.post(CHAT)(server.chat_completions)
    app.get("/v1/models")(server.models)
    app.get("/health")(server.health)
    app.get("/metrics")(server.prometheus)

    def counted(request: Request, error: APIError) -> JSONResponse:
        if request.url.path in (COMPLETIONS, CHAT):
            server.metrics.count(request.url.path, "rejected" if error.status < 500 else "error")
        return error.response()

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        return counted(request, error)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        return counted(request, _validation_error(error))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return counted(request, APIError(error.status_code, f"{request.method} {request.url.path}: {error.detail}",
                                         kind=kind))

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception):
        log.exception("request %s %s failed", request.method, request.url.path)
        return counted(request, APIError(500, f"the server failed on this request: {type(error).__name__}: "
                                              f"{error}", kind="server_error"))

    return app
