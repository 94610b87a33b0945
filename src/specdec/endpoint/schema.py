"""The shapes of an OpenAI server's replies, checked once, where they arrive.

Every reply is untrusted input: a broken or hostile server can answer valid JSON of any
shape (a logprob that is a string or null, a row that is a list, a choice that is a string).
Each kind of reply has one function here that reads it into plain Python values of known
types or raises ``ShapeError`` naming the first field that is wrong and what it holds
(``choices[0].logprobs.top_logprobs[2][' cat'] is a string ('-0.5'), not a number``); the
client adds the server and the request. Nothing past this module sees raw reply JSON.

Kinds: a completion or chat completion (``completion``), a streamed chunk of either
(``chunk``), a model list (``model_ids``), a ``/tokenize`` answer (``token_list``), a
completion's ``logprobs`` block (completions and chat styles) and vLLM's
``prompt_logprobs``; the speculative counters are read by ``counters.counters_from_body``
with the same checks, and ``/metrics`` text by ``counters.parse_prometheus``.

What is optional stays optional (a missing ``usage`` or ``logprobs`` is None, as before);
what is present must have its type. Log-probabilities must be numbers that are not NaN and
not above ``LOGPROB_MAX`` (-inf, a probability of 0, is allowed); token ids are integers in
``[0, MAX_TOKEN_ID]``; counts are non-negative integers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from specdec.util.printable import printable

Api = Literal["completions", "chat"]
TOKEN_ID_PREFIX = "token_id:"
MAX_TOKEN_ID = 2**31 - 1
# a log-probability above 0 is a probability above 1; float32 rounding of log-softmax stays
# far below this slack, so a larger value is a wrong reply, not rounding
LOGPROB_MAX = 1e-3
# one prompt position as vLLM reports it: token id -> (logprob, rank); the position's own
# token is always present, the others are the top-N by rank (rank 0: not given)
PromptRow = Mapping[int, tuple[float, int]]


class ShapeError(ValueError):
    """A field of a reply that is missing or of the wrong type; ``str`` is one line."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path} {problem}")
        self.path = path
        self.problem = problem


def describe(value: Any) -> str:
    """``value``'s JSON type with a short, printable rendering of it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"a string ({printable(repr(value), 40)})"
    if isinstance(value, int | float):
        return f"a number ({printable(repr(value), 40)})"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"an object of {len(value)} field{'s' * (len(value) != 1)}"
    return type(value).__name__


def _key(path: str, key: str) -> str:
    """``path['key']``: a key chosen by the server (a token), quoted and escaped."""
    return f"{path}[{printable(repr(key), 40)}]"


def obj(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ShapeError(path, f"is {describe(value)}, not an object")
    return value


def items(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise ShapeError(path, f"is {describe(value)}, not a list")
    return value


def text(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ShapeError(path, f"is {describe(value)}, not a string")
    return value


def opt_text(value: Any, path: str) -> str | None:
    return None if value is None else text(value, path)


def logprob(value: Any, path: str) -> float:
    """A log-probability: a number, not NaN, at most LOGPROB_MAX (-inf allowed)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ShapeError(path, f"is {describe(value)}, not a number")
    x = float(value)
    if math.isnan(x) or x > LOGPROB_MAX:
        raise ShapeError(path, f"is {describe(value)}, not a log-probability (<= 0)")
    return x


def count(value: Any, path: str) -> int | None:
    """A count: None when null or absent, else a non-negative integer."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ShapeError(path, f"is {describe(value)}, not a count")
    if not (math.isfinite(value) and value >= 0 and float(value).is_integer()):
        raise ShapeError(path, f"is {describe(value)}, not a count (an integer >= 0)")
    if value > 2**53:
        raise ShapeError(path, f"is {describe(value)}, far more than any count")
    return int(value)


def token_id(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_ID:
        raise ShapeError(path, f"is {describe(value)}, not a token id (0..{MAX_TOKEN_ID})")
    return value


# -- logprobs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Logprobs:
    """A completion's ``logprobs`` block: token texts, the top logprobs of each position
    (token text -> logprob), and token ids where the server gives them."""

    tokens: tuple[str, ...]
    top: tuple[Mapping[str, float], ...]
    ids: tuple[int, ...] | None


def _row(value: Any, path: str) -> dict[str, float]:
    """A completions-style top-logprobs row: token text -> logprob (null: an empty row)."""
    if value is None:
        return {}
    return {str(k): logprob(v, _key(path, str(k))) for k, v in obj(value, path).items()}


def token_ids_of(tokens: Sequence[str]) -> tuple[int, ...] | None:
    """Ids from tokens written as ``token_id:N`` (vLLM's ``return_tokens_as_token_ids``);
    None unless every token is written so."""
    out = []
    for t in tokens:
        digits = t[len(TOKEN_ID_PREFIX) :]
        if not t.startswith(TOKEN_ID_PREFIX) or not digits.isdigit():
            return None
        tid = int(digits)
        if tid > MAX_TOKEN_ID:
            return None
        out.append(tid)
    return tuple(out) if out else None


def logprobs(value: Any, path: str) -> Logprobs | None:
    """A completions-style block (``tokens``, ``top_logprobs``) or a chat-style one
    (``content: [{token, logprob, top_logprobs: [{token, logprob}], id?}]``); None when
    absent or null, or when it holds neither list."""
    if value is None:
        return None
    block = obj(value, path)
    content = block.get("content")
    if content is not None:
        toks: list[str] = []
        tops: list[Mapping[str, float]] = []
        ids: list[int] = []
        for j, entry in enumerate(items(content, f"{path}.content")):
            at = f"{path}.content[{j}]"
            item = obj(entry, at)
            toks.append(text(item.get("token"), f"{at}.token"))
            row: dict[str, float] = {}
            for i, cand in enumerate(items(item.get("top_logprobs") or [], f"{at}.top_logprobs")):
                c_at = f"{at}.top_logprobs[{i}]"
                c = obj(cand, c_at)
                row[text(c.get("token"), f"{c_at}.token")] = logprob(
                    c.get("logprob"), f"{c_at}.logprob"
                )
            tops.append(row)
            if "id" in item and item["id"] is not None:
                ids.append(token_id(item["id"], f"{at}.id"))
        got_ids = tuple(ids) if ids and len(ids) == len(toks) else None
        return Logprobs(tuple(toks), tuple(tops), got_ids or token_ids_of(toks))
    if block.get("tokens") is None:
        return None
    tokens = tuple(
        text(t, f"{path}.tokens[{j}]")
        for j, t in enumerate(items(block["tokens"], f"{path}.tokens"))
    )
    raw = block.get("top_logprobs")
    rows = (
        tuple(
            _row(r, f"{path}.top_logprobs[{j}]")
            for j, r in enumerate(items(raw, f"{path}.top_logprobs"))
        )
        if raw is not None
        else tuple({} for _ in tokens)
    )
    return Logprobs(tokens, rows, token_ids_of(tokens))


def prompt_logprobs(value: Any, path: str) -> tuple[PromptRow | None, ...] | None:
    """vLLM's ``prompt_logprobs``: one entry per prompt token, null for the first, else
    ``{"<id>": {"logprob": x, "rank": r, ...}}`` or ``{"<id>": x}``; None when absent."""
    if value is None:
        return None
    rows: list[PromptRow | None] = []
    for j, entry in enumerate(items(value, path)):
        at = f"{path}[{j}]"
        if entry is None:
            rows.append(None)
            continue
        row: dict[int, tuple[float, int]] = {}
        for key, val in obj(entry, at).items():
            k_at = _key(at, key)
            digits = key.removeprefix(TOKEN_ID_PREFIX)
            if not digits.isdigit():
                raise ShapeError(k_at, "is not a token id (a key of digits)")
            if len(digits) > len(str(MAX_TOKEN_ID)):  # int() of a long string is slow, or fails
                raise ShapeError(k_at, f"is not a token id (0..{MAX_TOKEN_ID})")
            tid = token_id(int(digits), k_at)
            if isinstance(val, dict):
                lp = logprob(val.get("logprob"), f"{k_at}.logprob")
                rank = count(val.get("rank"), f"{k_at}.rank") or 0
            else:  # a bare logprob: no rank
                lp, rank = logprob(val, k_at), 0
            row[tid] = (lp, rank)
        rows.append(row)
    return tuple(rows)


# -- completions and chunks --------------------------------------------------------------------


@dataclass(frozen=True)
class CompletionBody:
    """A non-streamed reply's first choice and what comes with it."""

    text: str
    finish_reason: str | None
    logprobs: Logprobs | None
    prompt_logprobs: tuple[PromptRow | None, ...] | None
    completion_tokens: int | None  # usage.completion_tokens


class NoText(ValueError):
    """A reply without choices or without text (the server is not an OpenAI API)."""


def completion_tokens(body: Mapping[str, Any]) -> int | None:
    usage = body.get("usage")
    if usage is None:
        return None
    return count(obj(usage, "usage").get("completion_tokens"), "usage.completion_tokens")


def first_choice(body: Mapping[str, Any], *, required: bool) -> Mapping[str, Any] | None:
    """``choices[0]`` as an object; None (or NoText when ``required``) when there are none."""
    raw = body.get("choices")
    if raw is None or raw == []:
        if required:
            raise NoText("answered without choices: not an OpenAI API?")
        return None
    return obj(items(raw, "choices")[0], "choices[0]")


def completion(value: Any, api: Api) -> CompletionBody:
    body = obj(value, "the reply")
    choice = first_choice(body, required=True)
    assert choice is not None
    if api == "chat":
        message = choice.get("message")
        content = None if message is None else obj(message, "choices[0].message").get("content")
        if content is None:
            raise NoText("answered without text (message.content)")
        got = text(content, "choices[0].message.content")
    else:
        if choice.get("text") is None:
            raise NoText("answered without text (choices[0].text)")
        got = text(choice["text"], "choices[0].text")
    return CompletionBody(
        text=got,
        finish_reason=opt_text(choice.get("finish_reason"), "choices[0].finish_reason"),
        logprobs=logprobs(choice.get("logprobs"), "choices[0].logprobs"),
        prompt_logprobs=prompt_logprobs(
            choice.get("prompt_logprobs"), "choices[0].prompt_logprobs"
        ),
        completion_tokens=completion_tokens(body),
    )


@dataclass(frozen=True)
class Chunk:
    """One streamed chunk: its text piece (may be empty), finish reason and token count."""

    piece: str
    finish_reason: str | None
    completion_tokens: int | None


def chunk(value: Any, api: Api) -> Chunk:
    body = obj(value, "a streamed chunk")
    choice = first_choice(body, required=False)
    piece: str | None = None
    finish = None
    if choice is not None:
        if api == "chat":
            delta = choice.get("delta")
            if delta is not None:
                piece = opt_text(
                    obj(delta, "choices[0].delta").get("content"), "choices[0].delta.content"
                )
        else:
            piece = opt_text(choice.get("text"), "choices[0].text")
        finish = opt_text(choice.get("finish_reason"), "choices[0].finish_reason")
    return Chunk(piece or "", finish, completion_tokens(body))


def stream_error(value: Any) -> str | None:
    """The message of an ``{"error": ...}`` chunk (a server failing mid-stream), else None."""
    if not isinstance(value, dict) or "error" not in value:
        return None
    err = value["error"]
    msg = err.get("message") if isinstance(err, dict) else err
    return printable(msg, 300)


# -- models and tokenize -----------------------------------------------------------------------


def model_ids(value: Any) -> list[str]:
    """The ids of a ``/v1/models`` answer (``{"data": [{"id": ...}, ...]}``)."""
    body = obj(value, "the model list")
    data = body.get("data")
    if data is None:
        raise ShapeError("the model list", "has no data field")
    return [
        text(obj(m, f"data[{i}]").get("id"), f"data[{i}].id")
        for i, m in enumerate(items(data, "data"))
    ]


def token_list(value: Any) -> list[int] | None:
    """The ids of a ``/tokenize`` answer (``{"tokens": [...]}``); None when it has none (a
    server whose /tokenize is another API)."""
    if not isinstance(value, dict) or value.get("tokens") is None:
        return None
    return [token_id(t, f"tokens[{i}]") for i, t in enumerate(items(value["tokens"], "tokens"))]
