"""The FastAPI app: OpenAI-compatible routes over one loaded pair.

    POST /v1/completions       text (or token ids) in, text out; ``stream: true`` for SSE
    POST /v1/chat/completions  messages through the target's chat template
    GET  /v1/models            the one served model
    GET  /health               liveness and queue depth (no API key needed)
    GET  /metrics              Prometheus text (docs/serve.md lists the series)

Every generation runs on the engine's worker thread (``engine.Engine``); handlers only
validate, queue, and relay. No endpoint reads or writes a file named by a request.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from specdec.api import Pair
from specdec.completion import Completion
from specdec.core.model import CausalLM
from specdec.core.result import GenerationResult
from specdec.errors import SpecdecError
from specdec.pairs import pair_context_limit
from specdec.request import GenerationRequest
from specdec.serve.admission import (
    Admission,
    ClientGone,
    Slots,
    Turn,
    longest_token_chars,
    text_bound,
    watched,
)
from specdec.serve.engine import Engine, Failed, Finished, Job, QueueFull, ShuttingDown
from specdec.serve.errors import APIError, error_response, validation_error
from specdec.serve.generation import (
    ServeSettings,
    chat_prompt,
    openai_finish_reason,
    plan,
    prediction_ids,
    text_prompt,
    timings,
    usage,
    work,
)
from specdec.serve.metrics import ServerMetrics
from specdec.serve.middleware import BodyLimit, CountRequests
from specdec.serve.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatDelta,
    ChatRequest,
    ChatResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    GenerationFields,
    ModelCard,
    ModelList,
    Timings,
    Usage,
)
from specdec.util.credentials import check_api_key

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is there
PING_S = 15.0  # a stream with nothing to send for this long sends a comment (kept alive)
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
SHUT_DOWN = "the server is shutting down; the request was cancelled"


@dataclass(frozen=True)
class ServeConfig:
    """Server options (``specdec serve`` flags)."""

    settings: ServeSettings
    api_key: str | None = None
    max_queue: int = 16
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout_s: float = 30.0  # the whole request body must arrive within this (else 408)

    def __post_init__(self) -> None:
        if self.api_key is not None:
            check_api_key(self.api_key)  # a key no client could send is refused at start


@dataclass
class _State:
    pair: Pair
    config: ServeConfig
    engine: Engine
    metrics: ServerMetrics
    created: int
    token_chars: int  # the most characters one token of the target decodes to
    tokenize_lock: threading.Lock = field(default_factory=threading.Lock)

    def completion_ids(self, req: CompletionRequest, turn: Turn) -> list[int]:
        """A prompt's ids; tokenizer calls one request at a time (a transformers tokenizer may
        reconfigure itself inside a call; decoding on the worker thread only reads it)."""
        return text_prompt(self.pair, req, turn, self.config.settings.parse_special)

    def chat_ids(self, req: ChatRequest, turn: Turn) -> list[int]:
        """The messages' ids: the template renders outside the lock (in a worker process),
        the tokenizer's calls inside it."""
        special = self.config.settings.parse_special
        return chat_prompt(self.pair, req, turn, special)

    def prediction_ids(self, req: GenerationFields, turn: Turn) -> list[int]:
        """The request's prediction as ids ([] without one), tokenized under the lock."""
        special = self.config.settings.parse_special
        return prediction_ids(self.pair, req, turn, special)

    def check_sizes(self, req: GenerationFields) -> None:
        """Text that cannot fit the window whatever it tokenizes to: a 400 before the
        tokenizer sees it (``admission.text_bound``)."""
        n_ctx = pair_context_limit(self.pair.draft, self.pair.target)
        if isinstance(req, ChatRequest):
            chars = sum(len(m.text()) for m in req.messages)
            text_bound(chars, n_ctx, self.token_chars, "messages")
        elif isinstance(req, CompletionRequest) and isinstance(req.prompt, str):
            text_bound(len(req.prompt), n_ctx, self.token_chars, "prompt")
        if req.prediction is not None:  # more than any output could be
            text_bound(len(req.prediction.text()), n_ctx, self.token_chars, "prediction")

    async def prepared(
        self, req: GenerationFields, request: Request, encode: Callable[[Turn], list[int]]
    ) -> tuple[list[int], list[int]] | None:
        """(prompt ids, prediction ids), tokenized off the event loop in the tokenizer's
        turn; None when the client left before either was tokenized or before queueing."""
        self.check_sizes(req)
        async with watched(request.is_disconnected) as gone:
            turn = Turn(self.tokenize_lock, gone)
            try:
                ids = await asyncio.to_thread(encode, turn)
                pred = await asyncio.to_thread(self.prediction_ids, req, turn)
            except ClientGone:
                return None
            return None if gone.is_set() else (ids, pred)


def _reset_caches(pair: Pair) -> None:
    """After a job that raised mid-round: empty the caches so the next prefill starts clean."""
    for model in (pair.target, getattr(pair.draft, "model", pair.draft)):
        n_cached: int = getattr(model, "n_cached", 0)
        if n_cached and isinstance(model, CausalLM):
            model.truncate(0)


def create_app(pair: Pair, config: ServeConfig) -> FastAPI:
    """An app serving ``pair``; the caller owns the pair (and releases it after shutdown)."""
    state = _State(
        pair=pair,
        config=config,
        engine=Engine(config.max_queue, on_failure=lambda: _reset_caches(pair)),
        metrics=ServerMetrics(),
        created=int(time.time()),
        token_chars=longest_token_chars(pair.target.tokenizer, pair.target.vocab_size),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await state.engine.shutdown()  # in-flight generations stop at their next round

    app = FastAPI(
        title="specdec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.specdec = state
    _install_error_handlers(app)
    auth = _auth_dependency(config.api_key)

    @app.get("/health")
    async def health() -> Response:
        eng = state.engine
        body = {
            "status": "shutting_down" if eng.closing else "ok",
            "running": eng.running,
            "waiting": eng.waiting,
        }
        return JSONResponse(body, status_code=503 if eng.closing else 200)

    @app.get("/v1/models", dependencies=[Depends(auth)])
    async def models() -> ModelList:
        name = config.settings.model_name
        return ModelList(data=[ModelCard(id=name, created=state.created)])

    @app.get("/metrics", dependencies=[Depends(auth)])
    async def metrics() -> Response:
        text = state.metrics.render(queued=state.engine.waiting, running=state.engine.running)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions", dependencies=[Depends(auth)], response_model=None)
    async def completions(req: CompletionRequest, request: Request) -> Response:
        _check_model(req, config)
        got = await state.prepared(req, request, lambda turn: state.completion_ids(req, turn))
        if got is None:
            return Response(status_code=499)  # the client left: nothing tokenized or queued
        ids, pred = got
        params = plan(pair, req, ids, config.settings, pred)
        return await _respond(state, req, params, request, chat=False)

    @app.post("/v1/chat/completions", dependencies=[Depends(auth)], response_model=None)
    async def chat_completions(req: ChatRequest, request: Request) -> Response:
        _check_model(req, config)
        got = await state.prepared(req, request, lambda turn: state.chat_ids(req, turn))
        if got is None:
            return Response(status_code=499)
        ids, pred = got
        params = plan(pair, req, ids, config.settings, pred)
        return await _respond(state, req, params, request, chat=True)

    def record(path: str, status: int) -> None:
        state.metrics.request(path if path in ENDPOINTS else "other", status)

    app.add_middleware(
        BodyLimit, max_bytes=config.max_body_bytes, max_seconds=config.body_timeout_s
    )
    app.add_middleware(  # a slot before the body is read (``admission``)
        Admission,
        slots=Slots(config.max_queue + 1),
        closing=lambda: state.engine.closing,
        retry_after=state.engine.retry_after,
    )
    app.add_middleware(CountRequests, record=record)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def invalid(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_error(exc.errors()))

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = "not_found" if exc.status_code == 404 else None
        return error_response(APIError(exc.status_code, str(exc.detail), code=code))

    async def user_error(_: Request, exc: Exception) -> Response:
        return error_response(APIError(400, str(exc), code="invalid_value"))

    async def internal(_: Request, exc: Exception) -> Response:
        return error_response(APIError(500, "internal error", code="internal_error"))

    app.add_exception_handler(SpecdecError, user_error)
    app.add_exception_handler(Exception, internal)
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)


def _auth_dependency(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    async def check(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        ok = scheme.lower() == "bearer" and secrets.compare_digest(
            token.strip().encode(), api_key.encode()
        )
        if not ok:
            raise APIError(
                401,
                "missing or wrong API key (send 'Authorization: Bearer KEY')",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check


def _check_model(req: GenerationFields, config: ServeConfig) -> None:
    name = config.settings.model_name
    if req.model not in (None, "", name):
        raise APIError(
            404,
            f"the model {req.model!r} does not exist here; this server serves {name!r}",
            param="model",
            code="model_not_found",
        )


def _submit(state: _State, params: GenerationRequest, stream: bool) -> Job:
    job_work = work(
        state.pair,
        params,
        stream_text=stream,
        on_result=state.metrics.generation,
    )
    try:
        return state.engine.submit(job_work)
    except QueueFull as e:
        raise APIError(
            429,
            f"the server is busy (queue full); retry in {e.retry_after} s",
            code="queue_full",
            headers={"Retry-After": str(e.retry_after)},
        ) from e
    except ShuttingDown as e:
        raise APIError(503, str(e), code="shutting_down") from e


async def _respond(
    state: _State, req: GenerationFields, params: GenerationRequest, request: Request, *, chat: bool
) -> Response:
    job = _submit(state, params, req.stream)
    ids = _Ids(
        id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=state.config.settings.model_name,
    )
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        events = _sse(job, ids, chat=chat, include_usage=include_usage)
        # Starlette's own streaming response: it stops the stream when the client leaves, and
        # nothing else (sse-starlette's cut every stream at a shutdown signal, without [DONE])
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        while True:
            try:
                message = await asyncio.wait_for(job.next(), DISCONNECT_POLL_S)
            except TimeoutError:
                if await request.is_disconnected():
                    return Response(status_code=499)  # nobody reads it
                continue
            if isinstance(message, Failed):
                raise message.error
            if isinstance(message, Finished):
                break
    finally:
        job.cancel()  # no-op when finished; stops the generation when the client left
    completion: Completion | None = message.value
    if completion is None:  # cancelled by a shutdown
        raise APIError(503, SHUT_DOWN, code="shutting_down")
    return JSONResponse(_final_body(completion, ids, chat=chat))


@dataclass(frozen=True)
class _Ids:
    id: str
    created: int
    model: str


def _final_body(c: Completion, ids: _Ids, *, chat: bool) -> dict[str, Any]:
    res = c.result
    reason = openai_finish_reason(res.finish_reason)
    u, t = _stats(res)
    if chat:
        choice = ChatChoice(message=AssistantMessage(content=c.text), finish_reason=reason)
        return ChatResponse(
            id=ids.id, created=ids.created, model=ids.model, choices=[choice], usage=u, timings=t
        ).model_dump()
    text = CompletionChoice(text=c.text, finish_reason=reason)
    return CompletionResponse(
        id=ids.id, created=ids.created, model=ids.model, choices=[text], usage=u, timings=t
    ).model_dump()


def _chunk(
    ids: _Ids,
    *,
    chat: bool,
    text: str | None,
    role: Literal["assistant"] | None = None,
    finish_reason: str | None = None,
    result: GenerationResult | None = None,
    with_choice: bool = True,
) -> str:
    """One SSE data payload in OpenAI's chunk format (statistics on the last chunks)."""
    u, t = _stats(result) if result is not None else (None, None)
    envelope: ChatChunk | CompletionResponse
    if chat:
        delta = ChatDelta(role=role, content=text)
        choices = [ChatChunkChoice(delta=delta, finish_reason=finish_reason)]
        envelope = ChatChunk(
            id=ids.id,
            created=ids.created,
            model=ids.model,
            choices=choices if with_choice else [],
            usage=u,
            timings=t,
        )
    else:
        texts = [CompletionChoice(text=text or "", finish_reason=finish_reason)]
        envelope = CompletionResponse(
            id=ids.id,
            created=ids.created,
            model=ids.model,
            choices=texts if with_choice else [],
            usage=u,
            timings=t,
        )
    body = envelope.model_dump(exclude_none=True)
    for choice in body["choices"]:
        choice.setdefault("finish_reason", None)
    return json.dumps(body)


def _stats(result: GenerationResult) -> tuple[Usage, Timings]:
    return Usage.model_validate(usage(result)), Timings.model_validate(timings(result))


def _event(data: str) -> str:
    """One server-sent event (``data`` is one line: JSON or [DONE])."""
    return f"data: {data}\n\n"


def _error_event(message: str, *, status: int, code: str | None = None) -> str:
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error" if status == 400 else "server_error",
            "param": None,
            "code": code,
        }
    }
    return _event(json.dumps(body))


async def _sse(job: Job, ids: _Ids, *, chat: bool, include_usage: bool) -> AsyncIterator[str]:
    """OpenAI chunks: a role chunk (chat), text chunks as rounds are accepted, a final chunk
    with the finish reason (and the statistics), then ``[DONE]``; a failure or a shutdown
    ends it with an error event, then ``[DONE]``. A client that goes away cancels the
    generation (Starlette cancels this generator; ``finally`` tells the job)."""
    try:
        if chat:
            yield _event(_chunk(ids, chat=True, text="", role="assistant"))
        while True:
            try:
                message = await asyncio.wait_for(job.next(), PING_S)
            except TimeoutError:
                yield ": ping\n\n"  # a comment: clients skip it, proxies see traffic
                continue
            if isinstance(message, str):
                yield _event(_chunk(ids, chat=chat, text=message))
                continue
            if isinstance(message, Failed):
                err = message.error
                if isinstance(err, ValueError):
                    yield _error_event(str(err), status=400)
                else:
                    yield _error_event("internal error during generation", status=500)
                yield _event("[DONE]")
                return
            assert isinstance(message, Finished)
            completion: Completion | None = message.value
            if completion is None:  # cancelled by a shutdown (queued, or past the drain)
                yield _error_event(SHUT_DOWN, status=503, code="shutting_down")
                yield _event("[DONE]")
                return
            res = completion.result
            reason = openai_finish_reason(res.finish_reason)
            yield _event(_chunk(ids, chat=chat, text=None, finish_reason=reason, result=res))
            if include_usage:  # OpenAI's usage-only chunk
                yield _event(_chunk(ids, chat=chat, text=None, result=res, with_choice=False))
            yield _event("[DONE]")
            return
    finally:
        job.cancel()
