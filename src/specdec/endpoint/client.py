"""One OpenAI-compatible endpoint: completions and chat completions, streamed or not, with
the time to first token, decode speed and end-to-end latency of every request.

Requests go only to the configured base URL (``trust_env=False``: proxy variables from the
environment are not used). Transport errors, read timeouts and HTTP 429 / 502 / 503 / 504
are retried with exponential backoff (jittered by an explicit generator; ``Retry-After`` is
honoured up to a cap); every other refusal is an ``EndpointError`` with one line naming the
URL, the request and the server's own message. ``RateLimiter`` bounds how many requests
start per second.

Every reply is untrusted and bounded (``docs/endpoint-results.md``, "What is bounded"):

- **time**: ``timeout_s`` between two chunks (httpx's read timeout, retried), and the whole
  of one attempt within ``request_s``: ``timeout_s`` plus ``PER_TOKEN_S`` per requested token
  for a generation (``timeout_s`` for the other routes), or ``request_timeout_s`` when set;
  not retried (a server that trickles would trickle again);
- **size**: ``wire.reply_limit`` (from ``max_tokens`` and the logprobs asked for), 16 MiB for
  the model list and ``/metrics``, 64 KiB of a refusal's body; not retried;
- **shape**: ``schema`` (one function per kind of reply); JSON depth: ``jsonbound``.

The pool holds as many connections as the caller will have requests in flight
(``connections``), spread over several httpx clients of at most ``SHARD`` connections each:
httpcore's pool does work quadratic in its size on every request, which at 3,000
connections in one pool kept a core busy and sent ~200 requests in 250 s. ``in_flight``
measures how many requests were on the wire at once (``inflight``).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import httpx

from specdec.endpoint import schema, wire
from specdec.endpoint.counters import SpecCounters, counters_from_body, parse_prometheus
from specdec.endpoint.errors import BadReply, EndpointError
from specdec.endpoint.inflight import InFlight
from specdec.endpoint.schema import TOKEN_ID_PREFIX, PromptRow
from specdec.util import jsonbound
from specdec.util.credentials import check_api_key
from specdec.util.printable import printable, quoted_list

__all__ = ["TOKEN_ID_PREFIX", "PromptRow"]

Api = Literal["completions", "chat"]
RETRY_STATUS = frozenset({429, 502, 503, 504})
MAX_BACKOFF_S = 30.0
PER_TOKEN_S = 1.0  # a generation's time bound: timeout_s plus this per requested token
SHARD = 64  # connections per httpx client (see the module docstring)
MIN_RPS = 0.01  # the slowest request rate accepted: one request every 100 s
EMPTY: Mapping[str, Any] = MappingProxyType({})


def normalise_url(url: str) -> str:
    """``http://host:port``, ``http://host:port/``, ``http://host:port/v1`` -> the base
    without ``/v1``; anything but an http(s) URL is an error."""
    u = url.strip().rstrip("/")
    if not (u.startswith("http://") or u.startswith("https://")) or u[-3:] == "://":
        raise EndpointError(f"{printable(repr(url), 200)} is not an http:// or https:// URL")
    if u.endswith("/v1"):
        u = u[: -len("/v1")]
    shown = printable(repr(url), 200)
    if not u.isprintable() or " " in u:
        raise EndpointError(f"{shown} is not a URL: it holds a space or a control character")
    try:  # what httpx would refuse at the first request, refused here in one line
        parsed = httpx.URL(u)
        port = parsed.port
    except (httpx.InvalidURL, ValueError, TypeError) as e:
        raise EndpointError(f"{shown} is not a valid URL: {printable(e, 200)}") from e
    if port is not None and not 0 < port < 65536:
        raise EndpointError(f"{shown}: the port must be in 1..65535")
    if not parsed.host:
        raise EndpointError(f"{shown} names no host")
    return u


@dataclass(frozen=True)
class EndpointConfig:
    """Where and how to send requests."""

    url: str
    model: str | None = None  # None: the one model the server lists
    api_key: str | None = None
    api: Api = "completions"
    timeout_s: float = 120.0  # per request, between bytes
    connect_timeout_s: float = 5.0
    retries: int = 2
    backoff_s: float = 0.5
    max_rps: float | None = None  # request starts per second (None: no bound)
    extra_body: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
    # the whole of one attempt; None: timeout_s + PER_TOKEN_S per requested token
    request_timeout_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", normalise_url(self.url))
        timeouts = [self.timeout_s, self.connect_timeout_s]
        if self.request_timeout_s is not None:
            timeouts.append(self.request_timeout_s)
        if not all(math.isfinite(t) and t > 0 for t in timeouts):
            raise EndpointError("timeouts must be finite and > 0 seconds")
        if self.retries < 0:
            raise EndpointError(f"retries must be >= 0, got {self.retries}")
        if self.max_rps is not None and not (
            math.isfinite(self.max_rps) and self.max_rps >= MIN_RPS
        ):
            raise EndpointError(  # 1e-9 per second waited 30 years for its second request
                f"the request rate must be finite and at least {MIN_RPS:g} per second (one "
                f"request in {1 / MIN_RPS:g} s), got {self.max_rps}"
            )
        if self.api not in ("completions", "chat"):
            raise EndpointError(f"api must be completions or chat, got {self.api!r}")
        if self.api_key is not None:
            check_api_key(self.api_key)  # httpx would fail with UnicodeEncodeError on 'é'

    def request_s(self, tokens: int | None) -> float:
        """The bound on one attempt's whole time: ``request_timeout_s``, else ``timeout_s``
        plus PER_TOKEN_S per requested token (``tokens`` None: not a generation)."""
        if self.request_timeout_s is not None:
            return self.request_timeout_s
        return self.timeout_s + PER_TOKEN_S * max(0, tokens or 0)


@dataclass(frozen=True)
class Request:
    """One generation request (the same body goes to the spec-on and the spec-off side).

    ``prompt`` is text, or token ids (completions API only; vLLM and llama.cpp take them).
    ``extra`` is merged into the body last (engine-specific fields such as vLLM's
    ``prompt_logprobs`` or ``return_tokens_as_token_ids``). ``label`` names the request in
    error messages (``greedy prompt 2``); it is not sent."""

    prompt: str | tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    top_p: float = 1.0
    top_k: int = 0  # 0: off (specdec serve and llama.cpp both read 0 as "no top-k")
    logprobs: int | None = None  # top logprobs per token (non-streamed requests only)
    stream: bool = True
    extra: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
    label: str = ""

    def reply_limit(self) -> int:
        """The byte bound of this request's reply (``wire.reply_limit``)."""
        scored = self.extra.get("prompt_logprobs")
        prompt_tokens = (
            len(self.prompt) if scored is not None and not isinstance(self.prompt, str) else 0
        )
        n_logprobs = max(self.logprobs or 0, _as_int(scored))
        return wire.reply_limit(self.max_tokens, n_logprobs, prompt_tokens)


def _as_int(x: Any) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 1 << 16 else 0


@dataclass(frozen=True)
class Reply:
    """What one request returned, with its timing (seconds, monotonic clock)."""

    text: str
    finish_reason: str | None
    e2e_s: float
    ttft_s: float | None  # first non-empty text; None when not streamed
    n_tokens: int | None
    tokens_source: str  # "usage" | "chunks" | "logprobs" | "none"
    n_chunks: int
    counters: SpecCounters | None
    tokens: tuple[str, ...] | None = None  # token texts, when logprobs were returned
    top_logprobs: tuple[Mapping[str, float], ...] | None = None
    attempts: int = 1
    token_ids: tuple[int, ...] | None = None  # from "token_id:N" tokens (vLLM's option)
    prompt_logprobs: tuple[PromptRow | None, ...] | None = None  # vLLM's prompt_logprobs

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first one per second after the first one arrived."""
        if self.ttft_s is None or self.n_tokens is None or self.n_tokens < 2:
            return None
        span = self.e2e_s - self.ttft_s
        return (self.n_tokens - 1) / span if span > 0 else None


class RateLimiter:
    """At most ``rate`` request starts per second across all tasks sharing it (``clock`` and
    ``sleep``: the monotonic clock and asyncio's sleep; tests pass their own)."""

    def __init__(
        self,
        rate: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._interval = 1.0 / rate if rate else 0.0
        self._next = 0.0
        self._lock = asyncio.Lock()
        self._clock = clock
        self._sleep = sleep

    async def wait(self) -> None:
        if not self._interval:
            return
        async with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self._interval
        if start > now:
            await self._sleep(start - now)


class _Retry(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


def server_message(body: bytes, reason: str) -> str:
    """The server's own error text (OpenAI's error.message, FastAPI's detail, or the body),
    printable and at most 300 characters."""
    try:
        obj = wire.decode_json(body, "")
    except EndpointError:
        return printable(body.decode("utf-8", errors="replace").strip() or reason, 200)
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and err.get("message"):
            return printable(err["message"], 300)
        if isinstance(err, str) and err:
            return printable(err, 300)
        for key in ("detail", "message"):
            if obj.get(key):
                return printable(obj[key], 300)
    return printable(body.decode("utf-8", errors="replace").strip() or reason, 200)


def _retry_after(r: httpx.Response) -> float | None:
    try:
        value = float(r.headers.get("retry-after", ""))
    except ValueError:
        return None
    return min(MAX_BACKOFF_S, max(0.0, value)) if math.isfinite(value) else None


class EndpointClient:
    """An async client for one endpoint; use as ``async with EndpointClient(cfg) as c``.
    ``connections``: requests the caller will have in flight at once (the pool's size);
    ``name``: the side it serves in messages (``spec-on``)."""

    def __init__(
        self,
        config: EndpointConfig,
        *,
        rng: random.Random,
        limiter: RateLimiter | None = None,
        connections: int = 1,
        name: str = "",
    ) -> None:
        if connections < 1:
            raise EndpointError(f"connections must be >= 1, got {connections}")
        self.config = config
        self.model: str | None = config.model
        self.name = name
        self.in_flight = InFlight()
        self._rng = rng
        self._limiter = limiter or RateLimiter(config.max_rps)
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        n_shards = -(-connections // SHARD)
        per_shard = -(-connections // n_shards)
        limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
        self._shards = [
            httpx.AsyncClient(
                base_url=config.url,
                headers=headers,
                timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
                limits=limits,
                follow_redirects=False,
                trust_env=False,
            )
            for _ in range(n_shards)
        ]
        self._busy = [0] * n_shards
        self.connections = n_shards * per_shard

    async def __aenter__(self) -> EndpointClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for http in self._shards:
            await http.aclose()

    # -- where a request goes, and its errors ---------------------------------------------------
    def where(self, path: str, label: str = "") -> str:
        """``URL/path (side, request)``: how every message names a request."""
        about = ", ".join(x for x in (self.name, label) if x)
        return f"{self.config.url}{path}" + (f" ({printable(about, 200)})" if about else "")

    def _refused(self, status: int, body: bytes, reason: str, where: str) -> EndpointError:
        msg = server_message(body, reason)
        if status in (401, 403):
            return EndpointError(
                f"{where} refused the request (HTTP {status}: {msg}); pass the server's key "
                "with --api-key"
            )
        if status == 404 and "model" in msg.lower():
            return EndpointError(f"{where}: {msg} (choose the model with --endpoint-model)")
        if status == 404:
            return EndpointError(f"{where} does not exist (HTTP 404): is this an OpenAI API?")
        return EndpointError(f"{where} refused the request (HTTP {status}): {msg}")

    def _transport(self, e: httpx.TransportError, where: str) -> _Retry:
        if isinstance(e, httpx.ConnectTimeout):
            return _Retry(f"cannot reach {where}: no connection within the connect timeout")
        if isinstance(e, httpx.ConnectError):
            return _Retry(f"cannot reach {where}: {printable(e, 300) or 'connection refused'}")
        if isinstance(e, httpx.TimeoutException):
            return _Retry(f"{where} sent nothing for {self.config.timeout_s:g} s (timeout)")
        return _Retry(f"{where}: the connection failed ({type(e).__name__}: {printable(e, 300)})")

    async def _with_retries(
        self,
        path: str,
        label: str,
        attempt_fn: Callable[[httpx.AsyncClient], Awaitable[Any]],
        total_s: float,
    ) -> tuple[Any, int]:
        """``attempt_fn`` on the least busy shard, each attempt within ``total_s`` seconds,
        retried after transport errors and _Retry; (its result, the attempts made)."""
        where = self.where(path, label)
        last: _Retry | None = None
        for attempt in range(self.config.retries + 1):
            if attempt:
                assert last is not None
                backoff = min(MAX_BACKOFF_S, self.config.backoff_s * 2 ** (attempt - 1))
                delay = last.retry_after if last.retry_after is not None else backoff
                await asyncio.sleep(delay * (0.5 + self._rng.random()))
            shard = min(range(len(self._shards)), key=self._busy.__getitem__)
            self._busy[shard] += 1
            try:
                async with asyncio.timeout(total_s):
                    return await attempt_fn(self._shards[shard]), attempt + 1
            except TimeoutError as e:
                raise BadReply(
                    f"{where} did not finish its reply within {total_s:g} s (the bound of one "
                    "request: --timeout plus 1 s per requested token, or --request-timeout)"
                ) from e
            except httpx.TransportError as e:
                last = self._transport(e, where)
            except _Retry as e:
                last = e
            finally:
                self._busy[shard] -= 1
        assert last is not None
        tries = self.config.retries + 1
        raise EndpointError(f"{last.message} (after {tries} attempt{'s' * (tries > 1)})")

    async def _get_json(
        self, http: httpx.AsyncClient, method: str, path: str, limit: int, where: str, **kw: Any
    ) -> tuple[int, Any]:
        """(status, the JSON body of a 200 reply, else None) of a bounded request; a
        retryable status is a _Retry, a refusal other than 404/405 an EndpointError."""
        trace = {"trace": self.in_flight.trace()}
        async with http.stream(method, path, extensions=trace, **kw) as r:
            if r.status_code in RETRY_STATUS:
                raise _Retry(f"{where}: HTTP {r.status_code}", _retry_after(r))
            if r.status_code in (404, 405):
                return r.status_code, None
            if r.status_code != 200:
                body = await wire.read_prefix(r, wire.ERROR_BODY_BYTES)
                raise self._refused(r.status_code, body, r.reason_phrase, where)
            return 200, wire.decode_json(await wire.read_body(r, limit, where), where)

    # -- model discovery -----------------------------------------------------------------
    async def list_models(self) -> list[str] | None:
        """The ids of ``/v1/models``; None when the server has no such route."""
        path = "/v1/models"
        where = self.where(path)

        async def once(http: httpx.AsyncClient) -> list[str] | None:
            status, body = await self._get_json(http, "GET", path, wire.LIST_BYTES, where)
            if status != 200:
                return None
            try:
                return schema.model_ids(body)
            except schema.ShapeError as e:
                raise BadReply(f"{where} did not answer with an OpenAI model list ({e})") from e

        models, _ = await self._with_retries(path, "", once, self.config.request_s(None))
        return models

    async def resolve_model(self) -> str:
        """Check the configured model against the server's list, or pick the only one."""
        served = await self.list_models()
        wanted = self.config.model
        url = self.config.url
        if served is None:
            if wanted is None:
                raise EndpointError(
                    f"{url} lists no models (no /v1/models): name one with --endpoint-model"
                )
            self.model = wanted
            return wanted
        if wanted is not None:
            if wanted not in served:
                raise EndpointError(
                    f"{url} does not serve the model {printable(repr(wanted), 200)}; it serves: "
                    + (quoted_list(served) or "nothing")
                )
            self.model = wanted
            return wanted
        if len(served) != 1:
            raise EndpointError(
                f"{url} serves {len(served):,} models ({quoted_list(served)}): choose one with "
                "--endpoint-model"
            )
        self.model = served[0]
        return served[0]

    async def tokenize(self, text: str) -> list[int] | None:
        """The token ids the server makes of ``text`` (vLLM's and llama.cpp's ``/tokenize``;
        special tokens added as a completion request adds them); None when there is no such
        route, the request fails, or the answer has no token list (a wrong shape of one is an
        EndpointError). No retries."""
        body: dict[str, Any] = {"prompt": text, "content": text}
        body |= {"add_special_tokens": True, "add_special": True}  # vLLM's, llama.cpp's name
        if self.model is not None:
            body["model"] = self.model
        path = "/tokenize"
        where = self.where(path)
        limit = wire.BASE_BYTES + 16 * len(text.encode("utf-8"))  # an id per byte, at most
        try:
            async with asyncio.timeout(self.config.request_s(None)):
                status, got = await self._get_json(
                    self._shards[0], "POST", path, limit, where, json=body
                )
        except (httpx.TransportError, _Retry, TimeoutError):
            return None
        except BadReply:
            raise
        except EndpointError:
            return None  # a refusal: no usable /tokenize
        if status != 200:
            return None
        try:
            return schema.token_list(got)
        except schema.ShapeError as e:
            raise BadReply(f"{where} answered a token list of the wrong shape: {e}") from e

    async def scrape_metrics(self) -> dict[str, float] | None:
        """``/metrics`` as name -> value, or None when the server has none or the scrape
        fails (no retries; bounded in time and size like every reply)."""
        path = "/metrics"
        where = self.where(path)
        try:
            async with asyncio.timeout(self.config.request_s(None)):
                async with self._shards[0].stream(
                    "GET", path, extensions={"trace": self.in_flight.trace()}
                ) as r:
                    if r.status_code != 200:
                        return None
                    data = await wire.read_body(r, wire.LIST_BYTES, where)
        except (httpx.TransportError, TimeoutError):
            return None
        return parse_prometheus(data.decode("utf-8", errors="replace"))

    # -- generation ----------------------------------------------------------------------
    def body(self, req: Request) -> dict[str, Any]:
        b: dict[str, Any] = {
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "min_p": 0.0,  # llama.cpp's defaults truncate; the same body goes to both sides
            "repeat_penalty": 1.0,
            "stream": req.stream,
        }
        if self.model is not None:
            b["model"] = self.model
        if req.seed is not None:
            b["seed"] = req.seed
        if self.config.api == "chat":
            if not isinstance(req.prompt, str):
                raise EndpointError("token-id prompts need the completions API")
            b["messages"] = [{"role": "user", "content": req.prompt}]
        else:
            b["prompt"] = req.prompt if isinstance(req.prompt, str) else list(req.prompt)
        if req.stream:
            b["stream_options"] = {"include_usage": True}
        if req.logprobs:
            if self.config.api == "chat":
                b["logprobs"] = True
                b["top_logprobs"] = req.logprobs
            else:
                b["logprobs"] = req.logprobs
        b.update(self.config.extra_body)
        b.update(req.extra)
        return b

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.config.api == "chat" else "/v1/completions"

    async def generate(self, req: Request) -> Reply:
        """Send one request (retried as configured) and time it."""
        await self._limiter.wait()
        body = self.body(req)
        if req.stream:
            return await self._streamed(body, req)
        return await self._whole(body, req)

    def _shape(self, e: schema.ShapeError | schema.NoText, where: str) -> BadReply:
        if isinstance(e, schema.NoText):
            return BadReply(f"{where} {e}")
        return BadReply(f"{where} answered a reply of the wrong shape: {e}")

    async def _whole(self, body: dict[str, Any], req: Request) -> Reply:
        where = self.where(self.path, req.label)
        limit = req.reply_limit()

        async def once(http: httpx.AsyncClient) -> tuple[Any, float]:
            t0 = time.monotonic()
            trace = {"trace": self.in_flight.trace()}
            async with http.stream("POST", self.path, json=body, extensions=trace) as r:
                if r.status_code in RETRY_STATUS:
                    msg = server_message(await wire.read_prefix(r, wire.ERROR_BODY_BYTES), "")
                    raise _Retry(f"{where}: HTTP {r.status_code} ({msg})", _retry_after(r))
                if r.status_code != 200:
                    err = await wire.read_prefix(r, wire.ERROR_BODY_BYTES)
                    raise self._refused(r.status_code, err, r.reason_phrase, where)
                data = await wire.read_body(r, limit, where)
            return wire.decode_json(data, where), time.monotonic() - t0

        total = self.config.request_s(req.max_tokens)
        (obj, elapsed), attempts = await self._with_retries(self.path, req.label, once, total)
        try:
            got = schema.completion(obj, self.config.api)
            counters = counters_from_body(obj)
        except (schema.ShapeError, schema.NoText) as e:
            raise self._shape(e, where) from e
        lp = got.logprobs
        n_tokens, source = got.completion_tokens, "usage"
        if n_tokens is None:
            n_tokens, source = (len(lp.tokens), "logprobs") if lp is not None else (None, "none")
        return Reply(
            text=got.text,
            finish_reason=got.finish_reason,
            e2e_s=elapsed,
            ttft_s=None,
            n_tokens=n_tokens,
            tokens_source=source,
            n_chunks=0,
            counters=counters,
            tokens=lp.tokens if lp is not None else None,
            top_logprobs=lp.top if lp is not None else None,
            attempts=attempts,
            token_ids=lp.ids if lp is not None else None,
            prompt_logprobs=got.prompt_logprobs,
        )

    async def _streamed(self, body: dict[str, Any], req: Request) -> Reply:
        where = self.where(self.path, req.label)
        limit = req.reply_limit()

        async def once(http: httpx.AsyncClient) -> Reply:
            t0 = time.monotonic()
            pieces: list[str] = []
            ttft: float | None = None
            finish: str | None = None
            n_tokens: int | None = None
            source = "chunks"
            counters: SpecCounters | None = None
            trace = {"trace": self.in_flight.trace()}
            async with http.stream("POST", self.path, json=body, extensions=trace) as r:
                if r.status_code in RETRY_STATUS:
                    raise _Retry(f"{where}: HTTP {r.status_code}", _retry_after(r))
                if r.status_code != 200:
                    err = await wire.read_prefix(r, wire.ERROR_BODY_BYTES)
                    raise self._refused(r.status_code, err, r.reason_phrase, where)
                async for obj in _sse_objects(wire.sse_lines(r, limit, where), where):
                    try:
                        part = schema.chunk(obj, self.config.api)
                        found = counters_from_body(obj)
                    except schema.ShapeError as e:
                        raise self._shape(e, where) from e
                    counters = found or counters
                    if part.completion_tokens is not None:
                        n_tokens, source = part.completion_tokens, "usage"
                    if part.piece:
                        if ttft is None:
                            ttft = time.monotonic() - t0
                        pieces.append(part.piece)
                    finish = part.finish_reason or finish
            e2e = time.monotonic() - t0
            if n_tokens is None:
                n_tokens = len(pieces)
            return Reply(
                text="".join(pieces),
                finish_reason=finish,
                e2e_s=e2e,
                ttft_s=ttft,
                n_tokens=n_tokens,
                tokens_source=source,
                n_chunks=len(pieces),
                counters=counters,
            )

        total = self.config.request_s(req.max_tokens)
        reply, attempts = await self._with_retries(self.path, req.label, once, total)
        assert isinstance(reply, Reply)
        return Reply(**{**reply.__dict__, "attempts": attempts})


async def _sse_objects(lines: Any, where: str) -> Any:
    """The JSON values of an OpenAI server-sent event stream, up to ``[DONE]``; comment and
    other field lines are skipped (their bytes still count against the reply's bound). A
    stream that ends without ``[DONE]`` was cut short: BadReply (it was counted complete)."""
    async for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            obj = jsonbound.loads(payload)
        except jsonbound.JsonError as e:
            raise BadReply(f"{where} streamed something that is not JSON ({e})") from e
        msg = schema.stream_error(obj)
        if msg is not None:
            raise EndpointError(f"{where} failed mid-stream: {msg}")
        yield obj
    raise BadReply(
        f"{where} ended its stream without [DONE]: the reply was cut short (not counted)"
    )


def token_ids_of(tokens: Sequence[str] | None) -> tuple[int, ...] | None:
    """Token ids from tokens written as ``token_id:N``; None unless every token is."""
    return schema.token_ids_of(tokens) if tokens else None
