"""The HTTP side: a FastAPI app with OpenAI's ``/v1/completions``, ``/v1/chat/completions``
(whole or streamed as server-sent events) and ``/v1/models``, plus ``/health`` and
``/metrics``; a guard for the API key and the request size; every error as OpenAI's
JSON error body.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ovspec.errors import BadRequestError, OvspecError
from ovspec.runtime.batching import BatchRequest
from ovspec.serve.engine import (
    Engine,
    EngineStats,
    OverloadedError,
    ShuttingDownError,
    Ticket,
)
from ovspec.serve.metrics import CONTENT_TYPE, metrics_text
from ovspec.serve.protocol import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    ErrorType,
    Reply,
    SamplingFields,
    error_document,
    finish_reason,
    usage,
)
from ovspec.serve.text import ModelText, StopText

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = ("/health", "/metrics")  # answered without the API key


@dataclass(frozen=True)
class ServerSettings:
    """What the app enforces: the served name, the key, the body size, the grace a
    stream gets at shutdown."""

    model_name: str
    api_key: str | None = None
    max_request_bytes: int = 1 << 20
    shutdown_grace_s: float = 10.0


def error_response(status: int, message: str, kind: ErrorType) -> JSONResponse:
    return JSONResponse(error_document(message, kind), status_code=status)


class RequestGuard:
    """ASGI middleware: the API key (``Authorization: Bearer``) on /v1 routes, and a
    body no larger than ``max_request_bytes`` (declared or streamed)."""

    def __init__(self, app: ASGIApp, settings: ServerSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limit = self.settings.max_request_bytes
        key = self.settings.api_key
        guarded = key is not None and not str(scope["path"]).startswith(OPEN_PATHS)
        if guarded and headers.get("authorization", "") != f"Bearer {key}":
            reply = error_response(401, "missing or wrong API key", "authentication_error")
            await reply(scope, receive, send)
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            too_big = error_response(
                413, f"the request body is over {limit} bytes", "invalid_request_error"
            )
            await too_big(scope, receive, send)
            return
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise HTTPException(413, f"the request body is over {limit} bytes")
            return message

        await self.app(scope, bounded, send)


def create_app(
    engine: Engine,
    text: ModelText,
    settings: ServerSettings,
    on_stopped: Callable[[EngineStats], None] | None = None,
) -> FastAPI:
    """The app over a started ``engine``; its shutdown closes the engine, then tells
    ``on_stopped`` what the engine did."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await run_in_threadpool(engine.close)
            if on_stopped is not None:
                on_stopped(engine.stats())

    app = FastAPI(title="ovspec", lifespan=lifespan)
    _error_handlers(app)
    served = _Completions(engine, text, settings)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Response:
        prompt_ids = await run_in_threadpool(text.prompt_ids, body.prompt)
        return await served.respond(body, prompt_ids, COMPLETIONS_DEFAULT_MAX_TOKENS, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> Response:
        prompt_ids = await run_in_threadpool(text.chat_ids, body.chat_messages())
        if body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        room = engine.batcher.ladder.top_tokens - len(prompt_ids) + 1
        return await served.respond(body, prompt_ids, max(room, 1), chat=True)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        model = {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "ovspec"}
        return {"object": "list", "data": [model]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(metrics_text(engine.stats), media_type=CONTENT_TYPE)

    app.add_middleware(RequestGuard, settings=settings)
    return app


def _error_handlers(app: FastAPI) -> None:
    async def invalid(_r: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        return error_response(400, message, "invalid_request_error")

    async def http(_r: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        kinds: dict[int, ErrorType] = {404: "not_found_error", 401: "authentication_error"}
        return error_response(
            exc.status_code, exc.detail, kinds.get(exc.status_code, "invalid_request_error")
        )

    async def ovspec_error(_r: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, OverloadedError):
            return error_response(429, str(exc), "rate_limit_error")
        if isinstance(exc, ShuttingDownError):
            return error_response(503, str(exc), "service_unavailable")
        if isinstance(exc, BadRequestError):
            return error_response(400, str(exc), "invalid_request_error")
        return error_response(500, str(exc), "server_error")

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http)
    app.add_exception_handler(OvspecError, ovspec_error)


class _Completions:
    """Runs one request through the engine and shapes the answer, whole or streamed."""

    def __init__(self, engine: Engine, text: ModelText, settings: ServerSettings) -> None:
        self.engine = engine
        self.text = text
        self.settings = settings

    async def respond(
        self, body: SamplingFields, prompt_ids: list[int], default_max_tokens: int, chat: bool
    ) -> Response:
        if body.model != self.settings.model_name:
            return error_response(
                404,
                f"model {body.model!r} is not served here; this server serves "
                f"{self.settings.model_name!r}",
                "not_found_error",
            )
        config = body.config(default_max_tokens, self.text.eos_token_ids)
        stops = body.stop_strings()
        request = BatchRequest(tuple(prompt_ids), config)
        ticket = self.engine.submit(request, asyncio.get_running_loop())
        reply = Reply(chat, self.settings.model_name)
        if body.stream:
            usage_too = body.stream_options is not None and body.stream_options.include_usage
            return EventSourceResponse(
                self._stream(ticket, reply, StopText(stops), usage_too),
                shutdown_grace_period=self.settings.shutdown_grace_s,
            )
        pieces: list[str] = []
        reason, count = None, 0
        try:
            async for piece, reason_now, count_now in self._texts(ticket, StopText(stops)):
                pieces.append(piece)
                reason, count = reason_now, count_now
        finally:
            self.engine.cancel(ticket)  # a no-op once finished; frees the slot otherwise
        return JSONResponse(reply.whole("".join(pieces), reason, usage(len(prompt_ids), count)))

    async def _texts(
        self, ticket: Ticket, stop: StopText
    ) -> AsyncIterator[tuple[str, str | None, int]]:
        """(text increment, finish reason or None, tokens so far), the last with its reason."""
        stream = self.text.stream()
        count = 0
        async for token in ticket.tokens():
            count += 1
            piece = stop.push(stream.push(token))
            if stop.matched:
                self.engine.cancel(ticket)
                yield piece, finish_reason(None, True), count
                return
            if piece:
                yield piece, None, count
        tail = stop.push(stream.finish())
        tail += stop.finish()
        yield tail, finish_reason(ticket.finish, stop.matched), count

    async def _stream(
        self, ticket: Ticket, reply: Reply, stop: StopText, usage_too: bool
    ) -> AsyncIterator[dict[str, str]]:
        def event(document: dict[str, Any]) -> dict[str, str]:
            return {"data": json.dumps(document)}

        count = 0
        try:
            if reply.chat:
                yield event(reply.chunk("", None, first=True))
            try:
                async for piece, reason, tokens in self._texts(ticket, stop):
                    count = tokens
                    if piece:
                        yield event(reply.chunk(piece, None))
                    if reason is not None:
                        yield event(reply.chunk(None, reason))
            except OvspecError as exc:
                yield event(error_document(str(exc), "server_error"))
                return
            if usage_too:
                yield event(reply.usage_chunk(usage(len(ticket.request.prompt_ids), count)))
            yield {"data": "[DONE]"}
        finally:
            self.engine.cancel(ticket)  # a client gone mid-stream frees its slot here
