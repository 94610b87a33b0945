"""The FastAPI app: OpenAI-compatible routes over one loaded pair.

    POST /v1/completions       text (or token ids) in, text out; ``stream: true`` for SSE
    POST /v1/chat/completions  messages through the target's chat template
    POST /v1/responses         OpenAI's Responses API, read as the chat request it stands for
                               (``serve.responses``): text, function tools, text.format,
                               typed SSE events with ``stream: true``; nothing is stored
    POST /tokenize, /detokenize  text <-> token ids (vLLM's shapes, llama-server's names too)
    GET  /tokenizer_info       the end and start tokens, chat template, window (vLLM's)
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
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from specdec.api import Pair
from specdec.core.model import CausalLM
from specdec.core.result import GenerationResult
from specdec.errors import SpecdecError
from specdec.pairs import pair_context_limit
from specdec.prompting import check_text, encode_text
from specdec.request import GenerationRequest
from specdec.serve.admission import (
    TOKENIZER_PATHS,
    Admission,
    ClientGone,
    Slots,
    Turn,
    longest_token_chars,
    text_bound,
    watched,
)
from specdec.serve.engine import Engine, Failed, Finished, Job, QueueFull, ShuttingDown
from specdec.serve.errors import APIError, FieldError, error_response, validation_error
from specdec.serve.generation import (
    ChoiceResult,
    Piece,
    ServeSettings,
    Wire,
    chat_constraint,
    chat_prompt,
    check_constraint,
    merged,
    openai_finish_reason,
    plan_choices,
    prediction_ids,
    text_prompt,
    timings,
    usage,
    work,
)
from specdec.serve.logprobs import WireToken, chat_shape, completion_shape
from specdec.serve.metrics import ServerMetrics
from specdec.serve.middleware import BodyLimit, CountRequests
from specdec.serve.responses import (
    ResponseFrame,
    chat_request,
    response_body,
    response_events,
    responses_names,
)
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
    DetokenizeRequest,
    GenerationFields,
    ModelCard,
    ModelList,
    ResponsesRequest,
    Timings,
    TokenizeRequest,
    Usage,
)
from specdec.serve.tools import CallSplitter, parse_calls, template_tools
from specdec.util.credentials import check_api_key

ENDPOINTS = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/models",
    "/health",
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/tokenizer_info",
)
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

    def completion_ids(self, req: CompletionRequest, turn: Turn) -> list[list[int]]:
        """The prompts' ids; tokenizer calls one request at a time (a transformers tokenizer
        may reconfigure itself inside a call; decoding on the worker thread only reads it)."""
        special = self.config.settings.parse_special
        return [text_prompt(self.pair, req, turn, special, p) for p in req.prompts()]

    def tokenize(self, text: str, add_special: bool, turn: Turn) -> list[int]:
        """``/tokenize``: the ids a completions prompt of ``text`` gets (special-token text
        is text unless the server parses it), in the tokenizer's turn."""
        try:
            check_text(text, "the prompt")
        except SpecdecError as e:
            raise FieldError("prompt", str(e)) from e
        with turn:
            return encode_text(
                self.pair.target,
                text,
                add_special_tokens=add_special,
                parse_special=self.config.settings.parse_special,
            )

    def tokenizer_info(self) -> dict[str, Any]:
        """vLLM's ``/tokenizer_info`` fields that clients read (lm-eval's remote tokenizer):
        the end and start tokens' texts, the chat template, the context window."""
        target = self.pair.target
        tok = target.tokenizer
        with self.tokenize_lock:
            names: dict[str, Any] = getattr(tok, "chat_variables", dict)()
            eos = names.get("eos_token") or tok.decode([min(target.eos_token_ids)])
            bos = names.get("bos_token") or None
        return {
            "eos_token": eos,
            "bos_token": bos,
            "pad_token": None,
            "chat_template": getattr(tok, "chat_template", None),
            "model_max_length": pair_context_limit(self.pair.draft, target),
        }

    def detokenize(self, ids: list[int], turn: Turn) -> str:
        vocab = self.pair.target.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise FieldError("tokens", f"token id {bad} is outside the vocabulary (0..{vocab - 1})")
        with turn:
            text: str = self.pair.target.tokenizer.decode(ids)
        return text

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
        elif isinstance(req, CompletionRequest):
            for one in req.prompts():  # each prompt is a choice group's own context
                if isinstance(one, str):
                    text_bound(len(one), n_ctx, self.token_chars, "prompt")
        if req.prediction is not None:  # more than any output could be
            text_bound(len(req.prediction.text()), n_ctx, self.token_chars, "prediction")

    async def prepared(
        self,
        req: GenerationFields,
        request: Request,
        encode: Callable[[Turn], list[list[int]]],
    ) -> tuple[list[list[int]], list[int]] | None:
        """(each prompt's ids, prediction ids), tokenized off the event loop in the
        tokenizer's turn; None when the client left before either was tokenized or before
        queueing."""
        self.check_sizes(req)
        async with watched(request.is_disconnected) as gone:
            turn = Turn(self.tokenize_lock, gone)
            try:
                ids = await asyncio.to_thread(encode, turn)
                pred = await asyncio.to_thread(self.prediction_ids, req, turn)
            except ClientGone:
                return None
            return None if gone.is_set() else (ids, pred)

    async def in_turn(self, request: Request, work: Callable[[Turn], Any]) -> Any:
        """``work(turn)`` off the event loop in the tokenizer's turn; raises ClientGone when
        the client left before its turn came (its text is then never tokenized)."""
        async with watched(request.is_disconnected) as gone:
            return await asyncio.to_thread(work, Turn(self.tokenize_lock, gone))


def _reset_caches(pair: Pair) -> None:
    """After a job that raised mid-round: empty the caches so the next prefill starts clean."""
    for model in (pair.target, getattr(pair.draft, "model", pair.draft)):
        n_cached: int = getattr(model, "n_cached", 0)
        if n_cached and isinstance(model, CausalLM):
            model.truncate(0)


def create_app(
    pair: Pair, config: ServeConfig, worker: ThreadPoolExecutor | None = None
) -> FastAPI:
    """An app serving ``pair``; the caller owns the pair (and releases it after shutdown).
    ``worker``: the thread the pair was loaded on (``engine.worker_thread``), which then runs
    every generation."""
    state = _State(
        pair=pair,
        config=config,
        engine=Engine(config.max_queue, on_failure=lambda: _reset_caches(pair), worker=worker),
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
        req.check()  # before any tokenizing
        got = await state.prepared(req, request, lambda turn: state.completion_ids(req, turn))
        if got is None:
            return Response(status_code=499)  # the client left: nothing tokenized or queued
        ids, pred = got
        params = plan_choices(pair, req, ids, config.settings, pred)
        await asyncio.to_thread(check_constraint, pair, params[0])
        wire = Wire(req.echo, req.return_tokens_as_token_ids, req.prompt_logprobs)
        return await _respond(state, req, params, request, chat=False, wire=wire)

    async def chat_plan(req: ChatRequest, request: Request) -> list[GenerationRequest] | None:
        """A chat request's generations (the path of /v1/chat/completions and
        /v1/responses): size bounds, the messages tokenized in the tokenizer's turn, the
        constraint tried; None when the client left before they were tokenized or queued."""
        _check_model(req, config)
        req.check()
        got = await state.prepared(req, request, lambda turn: [state.chat_ids(req, turn)])
        if got is None:
            return None
        ids, pred = got
        constraint = chat_constraint(pair, req)
        params = plan_choices(pair, req, ids, config.settings, pred, constraint)
        await asyncio.to_thread(check_constraint, pair, params[0])
        return params

    @app.post("/v1/chat/completions", dependencies=[Depends(auth)], response_model=None)
    async def chat_completions(req: ChatRequest, request: Request) -> Response:
        params = await chat_plan(req, request)
        if params is None:
            return Response(status_code=499)
        wire = Wire(False, req.return_tokens_as_token_ids, req.prompt_logprobs)
        tools = template_tools(req) is not None
        return await _respond(state, req, params, request, chat=True, wire=wire, tools=tools)

    @app.post("/v1/responses", dependencies=[Depends(auth)], response_model=None)
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        with responses_names():  # errors name the Responses API's fields
            req = chat_request(body)
            params = await chat_plan(req, request)
        if params is None:
            return Response(status_code=499)
        model = config.settings.model_name
        reply = ResponseFrame.of(body, req, model, n_prompt=_prompt_tokens(params, 1))
        job = _submit(state, params, req.stream, Wire(False, req.return_tokens_as_token_ids))
        if req.stream:
            events = response_events(job, reply, ping_s=PING_S, shut_down=SHUT_DOWN)
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        choices = await _finished(job, request)
        if choices is None:
            return Response(status_code=499)  # nobody reads it
        return JSONResponse(response_body(reply, choices[0]))

    @app.post("/tokenize", dependencies=[Depends(auth)], response_model=None)
    async def tokenize(req: TokenizeRequest, request: Request) -> Response:
        _check_model(req, config)
        text, special = req.text(), req.special()
        n_ctx = pair_context_limit(pair.draft, pair.target)
        text_bound(len(text), n_ctx, state.token_chars, "prompt")  # before the tokenizer
        try:
            ids = await state.in_turn(request, lambda turn: state.tokenize(text, special, turn))
        except ClientGone:
            return Response(status_code=499)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": n_ctx})

    @app.get("/tokenizer_info", dependencies=[Depends(auth)], response_model=None)
    async def tokenizer_info() -> Response:
        return JSONResponse(await asyncio.to_thread(state.tokenizer_info))

    @app.post("/detokenize", dependencies=[Depends(auth)], response_model=None)
    async def detokenize(req: DetokenizeRequest, request: Request) -> Response:
        _check_model(req, config)
        try:
            text = await state.in_turn(request, lambda turn: state.detokenize(req.tokens, turn))
        except ClientGone:
            return Response(status_code=499)
        return JSONResponse({"prompt": text, "content": text})

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
    app.add_middleware(  # the tokenizer routes: a pool of their own, the same size
        Admission,
        slots=Slots(config.max_queue + 1),
        closing=lambda: False,  # they answer while the server drains
        retry_after=state.engine.retry_after,
        paths=TOKENIZER_PATHS,
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


def _check_model(
    req: GenerationFields | TokenizeRequest | DetokenizeRequest, config: ServeConfig
) -> None:
    name = config.settings.model_name
    if req.model not in (None, "", name):
        raise APIError(
            404,
            f"the model {req.model!r} does not exist here; this server serves {name!r}",
            param="model",
            code="model_not_found",
        )


def _submit(state: _State, params: list[GenerationRequest], stream: bool, wire: Wire) -> Job:
    job_work = work(
        state.pair,
        params,
        stream_text=stream,
        on_result=state.metrics.generation,
        wire=wire,
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
    state: _State,
    req: GenerationFields,
    params: list[GenerationRequest],
    request: Request,
    *,
    chat: bool,
    wire: Wire,
    tools: bool = False,
) -> Response:
    """The response to a request: SSE chunks when it streams, else one body; ``tools``: each
    choice's output is read for tool calls (``serve.tools``)."""
    job = _submit(state, params, req.stream, wire)
    ids = _Ids(
        id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=state.config.settings.model_name,
    )
    n_prompt = _prompt_tokens(params, req.n)
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        events = _sse(
            job, ids, chat=chat, include_usage=include_usage, n_prompt=n_prompt, tools=tools
        )
        # Starlette's own streaming response: it stops the stream when the client leaves, and
        # nothing else (sse-starlette's cut every stream at a shutdown signal, without [DONE])
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    choices = await _finished(job, request)
    if choices is None:
        return Response(status_code=499)  # nobody reads it
    return JSONResponse(_final_body(choices, ids, chat=chat, n_prompt=n_prompt, tools=tools))


async def _finished(job: Job, request: Request) -> list[ChoiceResult] | None:
    """A non-streamed job's choices once it has finished; None when the client left first
    (noticed within DISCONNECT_POLL_S; the generation stops at its next round). The job's
    error is raised; a shutdown that cancelled it is a 503."""
    try:
        while True:
            try:
                message = await asyncio.wait_for(job.next(), DISCONNECT_POLL_S)
            except TimeoutError:
                if await request.is_disconnected():
                    return None
                continue
            if isinstance(message, Failed):
                raise message.error
            if isinstance(message, Finished):
                break
    finally:
        job.cancel()  # no-op when finished; stops the generation when the client left
    choices: list[ChoiceResult] | None = message.value
    if choices is None:  # cancelled by a shutdown
        raise APIError(503, SHUT_DOWN, code="shutting_down")
    return choices


def _prompt_tokens(params: list[GenerationRequest], n: int) -> int:
    """Prompt tokens of a request: each prompt once, however many choices it has."""
    return sum(len(p.prompt) for p in params[::n] if isinstance(p.prompt, tuple))


@dataclass(frozen=True)
class _Ids:
    id: str
    created: int
    model: str


def _logprobs_block(tokens: list[WireToken] | None, *, chat: bool) -> dict[str, Any] | None:
    if tokens is None:
        return None
    return chat_shape(tokens) if chat else completion_shape(tokens)


def _final_body(
    choices: list[ChoiceResult], ids: _Ids, *, chat: bool, n_prompt: int, tools: bool = False
) -> dict[str, Any]:
    results = [c.completion.result for c in choices]
    u, t = _stats(merged(results), n_prompt)
    envelope: ChatResponse | CompletionResponse
    if chat:
        envelope = ChatResponse(
            id=ids.id,
            created=ids.created,
            model=ids.model,
            choices=[_chat_choice(c, tools=tools) for c in choices],
            usage=u,
            timings=t,
        )
    else:
        envelope = CompletionResponse(
            id=ids.id,
            created=ids.created,
            model=ids.model,
            choices=[
                CompletionChoice(
                    index=c.index,
                    text=c.text,
                    logprobs=_logprobs_block(c.logprobs, chat=False),  # type: ignore[arg-type]
                    finish_reason=openai_finish_reason(c.completion.finish_reason),
                    prompt_logprobs=c.prompt_logprobs,
                )
                for c in choices
            ],
            usage=u,
            timings=t,
        )
    body = envelope.model_dump()
    for choice in body["choices"]:  # vLLM's field only where it was asked for
        if choice.get("prompt_logprobs", 0) is None:
            del choice["prompt_logprobs"]
    return body


def _chat_choice(c: ChoiceResult, *, tools: bool) -> ChatChoice:
    """One chat choice; with ``tools``, its text read for tool calls (content before them)."""
    content, calls = parse_calls(c.text) if tools else (c.text, [])
    return ChatChoice(
        index=c.index,
        message=AssistantMessage(
            content=content, tool_calls=[call.as_openai() for call in calls] or None
        ),
        logprobs=_logprobs_block(c.logprobs, chat=True),  # type: ignore[arg-type]
        finish_reason="tool_calls" if calls else openai_finish_reason(c.completion.finish_reason),
    )


def _chunk(
    ids: _Ids,
    *,
    chat: bool,
    text: str | None,
    index: int = 0,
    role: Literal["assistant"] | None = None,
    finish_reason: str | None = None,
    result: GenerationResult | None = None,
    n_prompt: int | None = None,
    with_choice: bool = True,
    logprobs: list[WireToken] | None = None,
    calls: list[dict[str, Any]] | None = None,
) -> str:
    """One SSE data payload in OpenAI's chunk format (statistics on the last chunks)."""
    u, t = _stats(result, n_prompt) if result is not None else (None, None)
    block = _logprobs_block(logprobs, chat=chat)
    envelope: ChatChunk | CompletionResponse
    if chat:
        delta = ChatDelta(role=role, content=text, tool_calls=calls)
        choices = [
            ChatChunkChoice(
                index=index,
                delta=delta,
                logprobs=block,  # type: ignore[arg-type]
                finish_reason=finish_reason,
            )
        ]
        envelope = ChatChunk(
            id=ids.id,
            created=ids.created,
            model=ids.model,
            choices=choices if with_choice else [],
            usage=u,
            timings=t,
        )
    else:
        texts = [
            CompletionChoice(
                index=index,
                text=text or "",
                logprobs=block,  # type: ignore[arg-type]
                finish_reason=finish_reason,
            )
        ]
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


def _stats(result: GenerationResult, n_prompt: int | None = None) -> tuple[Usage, Timings]:
    return Usage.model_validate(usage(result, n_prompt)), Timings.model_validate(timings(result))


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


async def _sse(
    job: Job, ids: _Ids, *, chat: bool, include_usage: bool, n_prompt: int, tools: bool = False
) -> AsyncIterator[str]:
    """OpenAI chunks: a role chunk per choice (chat), text chunks as rounds are accepted,
    a chunk with each choice's finish reason (the last with the statistics of all), then
    ``[DONE]``; choices come one after another, each chunk naming its index. With ``tools``,
    a choice's text from ``<tool_call>`` on is held back and sent as ``tool_calls`` deltas
    when the choice ends. A failure or a shutdown ends it with an error event, then
    ``[DONE]``. A client that goes away cancels the generation (Starlette cancels this
    generator; ``finally`` tells the job)."""
    try:
        started: set[int] = set()
        done: list[ChoiceResult] = []
        splitters: dict[int, CallSplitter] = {}  # with tools, per choice
        called: set[int] = set()  # choices that ended in tool calls
        while True:
            try:
                message = await asyncio.wait_for(job.next(), PING_S)
            except TimeoutError:
                yield ": ping\n\n"  # a comment: clients skip it, proxies see traffic
                continue
            if isinstance(message, Piece):
                if chat and message.index not in started:
                    started.add(message.index)
                    yield _event(
                        _chunk(ids, chat=True, text="", role="assistant", index=message.index)
                    )
                text = message.text
                if tools:  # (no logprobs with tools: ChatRequest.check)
                    text = splitters.setdefault(message.index, CallSplitter()).feed(text)
                    if not text:
                        continue
                yield _event(
                    _chunk(
                        ids,
                        chat=chat,
                        text=text,
                        index=message.index,
                        logprobs=message.logprobs,
                    )
                )
                continue
            if isinstance(message, ChoiceResult):
                if chat and message.index not in started:  # a choice without any text
                    started.add(message.index)
                    yield _event(
                        _chunk(ids, chat=True, text="", role="assistant", index=message.index)
                    )
                if tools:
                    rest, calls = splitters.pop(message.index, CallSplitter()).finish()
                    if rest:
                        yield _event(_chunk(ids, chat=chat, text=rest, index=message.index))
                    if calls:
                        deltas = [call.as_openai(i) for i, call in enumerate(calls)]
                        yield _event(
                            _chunk(ids, chat=chat, text=None, index=message.index, calls=deltas)
                        )
                        called.add(message.index)
                done.append(message)
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
            if message.value is None:  # cancelled by a shutdown (queued, or past the drain)
                yield _error_event(SHUT_DOWN, status=503, code="shutting_down")
                yield _event("[DONE]")
                return
            res = merged([c.completion.result for c in done])
            for j, c in enumerate(done):
                reason = (
                    "tool_calls"
                    if c.index in called
                    else openai_finish_reason(c.completion.finish_reason)
                )
                last = j == len(done) - 1
                yield _event(
                    _chunk(
                        ids,
                        chat=chat,
                        text=None,
                        index=c.index,
                        finish_reason=reason,
                        result=res if last else None,
                        n_prompt=n_prompt,
                    )
                )
            if include_usage:  # OpenAI's usage-only chunk
                yield _event(
                    _chunk(
                        ids, chat=chat, text=None, result=res, n_prompt=n_prompt, with_choice=False
                    )
                )
            yield _event("[DONE]")
            return
    finally:
        job.cancel()
