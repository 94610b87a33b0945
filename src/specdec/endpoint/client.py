"""One OpenAI-compatible endpoint: completions and chat completions, streamed or not, with
the time to first token, decode speed and end-to-end latency of every request.

Requests go only to the configured base URL (``trust_env=False``: proxy variables from the
environment are not used). Transport errors, timeouts and HTTP 429 / 502 / 503 / 504 are
retried with exponential backoff (jittered by an explicit generator; ``Retry-After`` is
honoured up to a cap); every other refusal is an ``EndpointError`` with one line naming the
URL and the server's own message. ``RateLimiter`` bounds how many requests start per second.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import httpx

from specdec.endpoint.counters import SpecCounters, counters_from_body, parse_prometheus
from specdec.endpoint.errors import EndpointError

Api = Literal["completions", "chat"]
RETRY_STATUS = frozenset({429, 502, 503, 504})
MAX_BACKOFF_S = 30.0
EMPTY: Mapping[str, Any] = MappingProxyType({})
TOKEN_ID_PREFIX = "token_id:"
# one prompt position as vLLM reports it: token id -> (logprob, rank); the position's own
# token is always present, the others are the top-N by rank
PromptRow = Mapping[int, tuple[float, int]]


def normalise_url(url: str) -> str:
    """``http://host:port``, ``http://host:port/``, ``http://host:port/v1`` -> the base
    without ``/v1``; anything but an http(s) URL is an error."""
    u = url.strip().rstrip("/")
    if not (u.startswith("http://") or u.startswith("https://")) or u[-3:] == "://":
        raise EndpointError(f"{url!r} is not an http:// or https:// URL")
    if u.endswith("/v1"):
        u = u[: -len("/v1")]
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", normalise_url(self.url))
        timeouts = (self.timeout_s, self.connect_timeout_s)
        if not all(math.isfinite(t) and t > 0 for t in timeouts):
            raise EndpointError("timeouts must be finite and > 0 seconds")
        if self.retries < 0:
            raise EndpointError(f"retries must be >= 0, got {self.retries}")
        if self.max_rps is not None and not (math.isfinite(self.max_rps) and self.max_rps > 0):
            raise EndpointError(
                f"the request rate must be finite and > 0 per second, got {self.max_rps}"
            )
        if self.api not in ("completions", "chat"):
            raise EndpointError(f"api must be completions or chat, got {self.api!r}")


@dataclass(frozen=True)
class Request:
    """One generation request (the same body goes to the spec-on and the spec-off side).

    ``prompt`` is text, or token ids (completions API only; vLLM and llama.cpp take them).
    ``extra`` is merged into the body last (engine-specific fields such as vLLM's
    ``prompt_logprobs`` or ``return_tokens_as_token_ids``)."""

    prompt: str | tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    top_p: float = 1.0
    top_k: int = 0  # 0: off (specdec serve and llama.cpp both read 0 as "no top-k")
    logprobs: int | None = None  # top logprobs per token (non-streamed requests only)
    stream: bool = True
    extra: Mapping[str, Any] = field(default_factory=lambda: EMPTY)


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


def server_message(r: httpx.Response) -> str:
    """The server's own error text (OpenAI's error.message, FastAPI's detail, or the body)."""
    try:
        body = r.json()
    except ValueError:
        return r.text.strip()[:200] or r.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(err, str):
            return err[:300]
        if body.get("detail"):
            return str(body["detail"])[:300]
        if body.get("message"):
            return str(body["message"])[:300]
    return json.dumps(body)[:200]


def _retry_after(r: httpx.Response) -> float | None:
    try:
        return min(MAX_BACKOFF_S, max(0.0, float(r.headers.get("retry-after", ""))))
    except ValueError:
        return None


class EndpointClient:
    """An async client for one endpoint; use as ``async with EndpointClient(cfg) as c``."""

    def __init__(
        self, config: EndpointConfig, *, rng: random.Random, limiter: RateLimiter | None = None
    ) -> None:
        self.config = config
        self.model: str | None = config.model
        self._rng = rng
        self._limiter = limiter or RateLimiter(config.max_rps)
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._http = httpx.AsyncClient(
            base_url=config.url,
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            follow_redirects=False,
            trust_env=False,
        )

    async def __aenter__(self) -> EndpointClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    # -- errors and retries --------------------------------------------------------------
    def _refused(self, r: httpx.Response, path: str) -> EndpointError:
        msg = server_message(r)
        where = f"{self.config.url}{path}"
        if r.status_code in (401, 403):
            return EndpointError(
                f"{where} refused the request (HTTP {r.status_code}: {msg}); pass the server's "
                "key with --api-key"
            )
        if r.status_code == 404 and "model" in msg.lower():
            return EndpointError(f"{where}: {msg} (choose the model with --endpoint-model)")
        if r.status_code == 404:
            return EndpointError(f"{where} does not exist (HTTP 404): is this an OpenAI API?")
        return EndpointError(f"{where} refused the request (HTTP {r.status_code}): {msg}")

    def _transport(self, e: httpx.TransportError, path: str) -> _Retry:
        where = f"{self.config.url}{path}"
        if isinstance(e, httpx.ConnectTimeout):
            return _Retry(f"cannot reach {where}: no connection within the connect timeout")
        if isinstance(e, httpx.ConnectError):
            return _Retry(f"cannot reach {where}: {e or 'connection refused'}")
        if isinstance(e, httpx.TimeoutException):
            return _Retry(f"{where} sent nothing for {self.config.timeout_s:g} s (timeout)")
        return _Retry(f"{where}: the connection failed ({type(e).__name__}: {e})")

    async def _with_retries(self, path: str, attempt_fn: Any) -> tuple[Any, int]:
        last: _Retry | None = None
        for attempt in range(self.config.retries + 1):
            if attempt:
                assert last is not None
                backoff = min(MAX_BACKOFF_S, self.config.backoff_s * 2 ** (attempt - 1))
                delay = last.retry_after if last.retry_after is not None else backoff
                await asyncio.sleep(delay * (0.5 + self._rng.random()))
            try:
                return await attempt_fn(), attempt + 1
            except httpx.TransportError as e:
                last = self._transport(e, path)
            except _Retry as e:
                last = e
        assert last is not None
        tries = self.config.retries + 1
        raise EndpointError(f"{last.message} (after {tries} attempt{'s' * (tries > 1)})")

    # -- model discovery -----------------------------------------------------------------
    async def list_models(self) -> list[str] | None:
        """The ids of ``/v1/models``; None when the server has no such route."""

        async def once() -> list[str] | None:
            r = await self._http.get("/v1/models")
            if r.status_code in RETRY_STATUS:
                raise _Retry(f"{self.config.url}/v1/models: HTTP {r.status_code}", _retry_after(r))
            if r.status_code in (404, 405):
                return None
            if r.status_code != 200:
                raise self._refused(r, "/v1/models")
            try:
                data = r.json().get("data", [])
                return [str(m["id"]) for m in data]
            except (ValueError, AttributeError, KeyError, TypeError) as e:
                raise EndpointError(
                    f"{self.config.url}/v1/models did not answer with an OpenAI model list"
                ) from e

        models, _ = await self._with_retries("/v1/models", once)
        return models

    async def resolve_model(self) -> str:
        """Check the configured model against the server's list, or pick the only one."""
        served = await self.list_models()
        wanted = self.config.model
        if served is None:
            if wanted is None:
                raise EndpointError(
                    f"{self.config.url} lists no models (no /v1/models): name one with "
                    "--endpoint-model"
                )
            self.model = wanted
            return wanted
        if wanted is not None:
            if wanted not in served:
                raise EndpointError(
                    f"{self.config.url} does not serve the model {wanted!r}; it serves: "
                    + (", ".join(repr(m) for m in served) or "nothing")
                )
            self.model = wanted
            return wanted
        if len(served) != 1:
            raise EndpointError(
                f"{self.config.url} serves {len(served)} models ("
                + ", ".join(repr(m) for m in served)
                + "): choose one with --endpoint-model"
            )
        self.model = served[0]
        return served[0]

    async def tokenize(self, text: str) -> list[int] | None:
        """The token ids the server makes of ``text`` (vLLM's and llama.cpp's ``/tokenize``;
        special tokens added as a completion request adds them); None when there is no such
        route or the answer has no token list. No retries."""
        body: dict[str, Any] = {"prompt": text, "content": text}
        body |= {"add_special_tokens": True, "add_special": True}  # vLLM's, llama.cpp's name
        if self.model is not None:
            body["model"] = self.model
        try:
            r = await self._http.post("/tokenize", json=body)
        except httpx.TransportError:
            return None
        if r.status_code != 200:
            return None
        try:
            toks = r.json().get("tokens")
        except (ValueError, AttributeError):
            return None
        if not isinstance(toks, list) or not all(isinstance(t, int) for t in toks):
            return None
        return [int(t) for t in toks]

    async def scrape_metrics(self) -> dict[str, float] | None:
        """``/metrics`` as name -> value, or None when the server has none (no retries)."""
        try:
            r = await self._http.get("/metrics")
        except httpx.TransportError:
            return None
        if r.status_code != 200:
            return None
        return parse_prometheus(r.text)

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
            return await self._streamed(body)
        return await self._whole(body)

    async def _whole(self, body: dict[str, Any]) -> Reply:
        async def once() -> tuple[dict[str, Any], float]:
            t0 = time.monotonic()
            r = await self._http.post(self.path, json=body)
            elapsed = time.monotonic() - t0
            if r.status_code in RETRY_STATUS:
                raise _Retry(
                    f"{self.config.url}{self.path}: HTTP {r.status_code} ({server_message(r)})",
                    _retry_after(r),
                )
            if r.status_code != 200:
                raise self._refused(r, self.path)
            try:
                obj = r.json()
            except ValueError as e:
                raise EndpointError(f"{self.config.url}{self.path} did not answer JSON") from e
            return obj, elapsed

        (obj, elapsed), attempts = await self._with_retries(self.path, once)
        choice = self._choice(obj)
        text = self._text(choice, delta=False)
        tokens, top = parse_logprobs(choice.get("logprobs"))
        n_tokens, source = _usage_tokens(obj)
        if n_tokens is None and tokens is not None:
            n_tokens, source = len(tokens), "logprobs"
        ids = token_ids_of(tokens) or logprob_ids(choice.get("logprobs"))
        return Reply(
            text=text,
            finish_reason=choice.get("finish_reason"),
            e2e_s=elapsed,
            ttft_s=None,
            n_tokens=n_tokens,
            tokens_source=source,
            n_chunks=0,
            counters=counters_from_body(obj),
            tokens=tokens,
            top_logprobs=top,
            attempts=attempts,
            token_ids=ids,
            prompt_logprobs=parse_prompt_logprobs(choice.get("prompt_logprobs")),
        )

    async def _streamed(self, body: dict[str, Any]) -> Reply:
        async def once() -> Reply:
            t0 = time.monotonic()
            pieces: list[str] = []
            ttft: float | None = None
            finish: str | None = None
            n_tokens: int | None = None
            source = "chunks"
            counters: SpecCounters | None = None
            async with self._http.stream("POST", self.path, json=body) as r:
                if r.status_code in RETRY_STATUS:
                    await r.aread()
                    raise _Retry(
                        f"{self.config.url}{self.path}: HTTP {r.status_code}", _retry_after(r)
                    )
                if r.status_code != 200:
                    await r.aread()
                    raise self._refused(r, self.path)
                async for obj in _sse_objects(r.aiter_lines(), f"{self.config.url}{self.path}"):
                    found = counters_from_body(obj)
                    counters = found or counters
                    used, how = _usage_tokens(obj)
                    if used is not None:
                        n_tokens, source = used, how
                    choices = obj.get("choices") or []
                    if not choices:
                        continue
                    choice = choices[0]
                    piece = self._text(choice, delta=True)
                    if piece:
                        if ttft is None:
                            ttft = time.monotonic() - t0
                        pieces.append(piece)
                    finish = choice.get("finish_reason") or finish
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

        reply, attempts = await self._with_retries(self.path, once)
        assert isinstance(reply, Reply)
        return Reply(**{**reply.__dict__, "attempts": attempts})

    def _choice(self, obj: Any) -> dict[str, Any]:
        choices = obj.get("choices") if isinstance(obj, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise EndpointError(
                f"{self.config.url}{self.path} answered without choices: not an OpenAI API?"
            )
        return choices[0]

    def _text(self, choice: Mapping[str, Any], *, delta: bool) -> str:
        if self.config.api == "chat":
            part = choice.get("delta" if delta else "message") or {}
            content = part.get("content") if isinstance(part, Mapping) else None
        else:
            content = choice.get("text")
        if content is None:
            if delta:
                return ""
            raise EndpointError(
                f"{self.config.url}{self.path} answered without text "
                f"({'message.content' if self.config.api == 'chat' else 'choices[0].text'})"
            )
        return str(content)


async def _sse_objects(lines: AsyncIterator[str], where: str) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an OpenAI server-sent event stream, up to ``[DONE]``."""
    async for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            obj = json.loads(payload)
        except ValueError as e:
            raise EndpointError(f"{where} streamed something that is not JSON") from e
        if isinstance(obj, dict) and "error" in obj:
            err = obj["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            raise EndpointError(f"{where} failed mid-stream: {msg}")
        if isinstance(obj, dict):
            yield obj


def _usage_tokens(obj: Mapping[str, Any]) -> tuple[int | None, str]:
    usage = obj.get("usage")
    if isinstance(usage, Mapping) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"]), "usage"
    return None, "none"


def parse_logprobs(
    block: Any,
) -> tuple[tuple[str, ...] | None, tuple[Mapping[str, float], ...] | None]:
    """(token texts, top logprobs per token) from a completions ``logprobs`` block
    (``tokens`` / ``top_logprobs``) or a chat one (``content[{token, top_logprobs}]``)."""
    if not isinstance(block, Mapping):
        return None, None
    if isinstance(block.get("content"), list):
        toks: list[str] = []
        tops: list[Mapping[str, float]] = []
        for item in block["content"]:
            if not isinstance(item, Mapping):
                return None, None
            toks.append(str(item.get("token", "")))
            row = {
                str(t.get("token")): float(t.get("logprob")) for t in item.get("top_logprobs") or []
            }
            tops.append(row)
        return tuple(toks), tuple(tops)
    tokens = block.get("tokens")
    if not isinstance(tokens, list):
        return None, None
    raw = block.get("top_logprobs") or [None] * len(tokens)
    rows = tuple({str(k): float(v) for k, v in (r or {}).items()} for r in raw)
    return tuple(str(t) for t in tokens), rows


def token_ids_of(tokens: Sequence[str] | None) -> tuple[int, ...] | None:
    """Token ids from tokens written as ``token_id:N`` (vLLM's ``return_tokens_as_token_ids``);
    None unless every token is written so."""
    if not tokens:
        return None
    out = []
    for t in tokens:
        if not t.startswith(TOKEN_ID_PREFIX) or not t[len(TOKEN_ID_PREFIX) :].isdigit():
            return None
        out.append(int(t[len(TOKEN_ID_PREFIX) :]))
    return tuple(out)


def parse_prompt_logprobs(block: Any) -> tuple[PromptRow | None, ...] | None:
    """vLLM's ``prompt_logprobs``: one entry per prompt token, None for the first, else
    ``{"<id>": {"logprob": x, "rank": r, ...}}``; None when absent or malformed."""
    if not isinstance(block, list):
        return None
    rows: list[PromptRow | None] = []
    for entry in block:
        if entry is None:
            rows.append(None)
            continue
        if not isinstance(entry, Mapping):
            return None
        row: dict[int, tuple[float, int]] = {}
        for key, val in entry.items():
            try:
                tid = int(str(key).removeprefix(TOKEN_ID_PREFIX))
                if isinstance(val, Mapping):
                    lp, rank = float(val["logprob"]), int(val.get("rank") or 0)
                else:  # a bare logprob: no rank
                    lp, rank = float(val), 0
            except (KeyError, TypeError, ValueError):
                return None
            row[tid] = (lp, rank)
        rows.append(row)
    return tuple(rows)


def logprob_ids(block: Any) -> tuple[int, ...] | None:
    """Token ids from a chat-style logprobs block whose items carry ``id`` (llama-server)."""
    content = block.get("content") if isinstance(block, Mapping) else None
    if not isinstance(content, list) or not content:
        return None
    ids = [item.get("id") if isinstance(item, Mapping) else None for item in content]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return None
    return tuple(int(i) for i in ids)  # type: ignore[arg-type]
