"""Log-probabilities in OpenAI's and vLLM's wire shapes.

The worker thread turns a generation's ``TokenLogprob`` entries (``core.logprobs``) into
``WireToken`` tokens (their texts read from the tokenizer there, where decoding runs); the app
writes them in the shape of the endpoint:

- completions: ``{tokens, token_logprobs, top_logprobs, text_offset}``, the alternatives as
  ``{token text: logprob}`` (an echoed prompt's first token has null logprob and null
  alternatives: no row precedes it);
- chat: ``{content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}``;
- vLLM's ``prompt_logprobs``: per prompt token null (the first) or
  ``{"<id>": {"logprob", "rank", "decoded_token"}}`` for the token there and the top ones.

With ``return_tokens_as_token_ids`` (vLLM's) every token text is written ``token_id:<id>``,
so distinct tokens whose texts coincide (two halves of one UTF-8 character) stay apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec.core.logprobs import TokenLogprob, finite

TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids


@dataclass(frozen=True)
class WireToken:
    """One token as the wire shows it: its text, UTF-8 bytes, log-probability (None for the
    first token of an echoed prompt), alternatives as (text, logprob, bytes), and the
    characters its text takes in the output (``token`` may be ``token_id:<id>``)."""

    token: str
    bytes: list[int]
    logprob: float | None
    top: tuple[tuple[str, float, list[int]], ...] | None
    chars: int


class TokenTexts:
    """Token id -> (text, bytes), cached; ``as_ids`` writes ``token_id:<id>`` instead."""

    def __init__(self, tokenizer: Any, as_ids: bool = False) -> None:
        self.tokenizer = tokenizer
        self.as_ids = as_ids
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, tid: int) -> tuple[str, list[int]]:
        got = self._cache.get(tid)
        if got is None:
            raw = token_bytes(self.tokenizer, tid)
            text = raw.decode("utf-8", errors="replace")
            got = (f"{TOKEN_ID_PREFIX}{tid}" if self.as_ids else text, list(raw))
            self._cache[tid] = got
        return got

    def chars(self, tid: int) -> int:
        """How many characters the token's text takes (its bytes decoded)."""
        return len(bytes(self(tid)[1]).decode("utf-8", errors="replace"))


def token_bytes(tokenizer: Any, tid: int) -> bytes:
    """The bytes token ``tid`` stands for: llama.cpp's own piece where the tokenizer has one
    (a part of a UTF-8 character stays that part), else its decoded text."""
    llm = getattr(tokenizer, "llm", None)
    if llm is not None and callable(getattr(llm, "detokenize", None)):
        raw: bytes = llm.detokenize([int(tid)], special=True)
        return raw
    text: str = tokenizer.decode([int(tid)])
    return text.encode("utf-8", errors="replace")


def scored(entries: Sequence[TokenLogprob | None], texts: TokenTexts) -> list[WireToken]:
    """The entries with their texts (None: the first token of a prompt, whose id is not in
    the entry: its text is given by ``scored_prompt``)."""
    out = []
    for e in entries:
        assert e is not None, "prompt entries go through scored_prompt"
        text, raw = texts(e.token)
        top = tuple((*texts(i), lp) for i, lp in e.top)
        alternatives = tuple((t, finite(lp), b) for t, b, lp in top)
        out.append(WireToken(text, raw, finite(e.logprob), alternatives, texts.chars(e.token)))
    return out


def scored_prompt(
    prompt_ids: Sequence[int], entries: Sequence[TokenLogprob | None], texts: TokenTexts
) -> list[WireToken]:
    """The prompt's tokens as scored tokens (the first, and any without an entry, with null
    log-probability and alternatives)."""
    out = []
    for tid, e in zip(prompt_ids, entries, strict=True):
        if e is None:
            text, raw = texts(int(tid))
            out.append(WireToken(text, raw, None, None, texts.chars(int(tid))))
        else:
            out += scored([e], texts)
    return out


def completion_shape(tokens: Sequence[WireToken], offset: int = 0) -> dict[str, Any]:
    """OpenAI's completions ``logprobs`` block; offsets count characters from ``offset``."""
    offsets = []
    at = offset
    for t in tokens:
        offsets.append(at)
        at += t.chars
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [
            None if t.top is None else {text: lp for text, lp, _ in t.top} for t in tokens
        ],
        "text_offset": offsets,
    }


def chat_shape(tokens: Sequence[WireToken]) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` block."""
    return {
        "content": [
            {
                "token": t.token,
                "logprob": t.logprob if t.logprob is not None else 0.0,
                "bytes": t.bytes,
                "top_logprobs": [
                    {"token": text, "logprob": lp, "bytes": raw} for text, lp, raw in t.top or ()
                ],
            }
            for t in tokens
        ]
    }


def prompt_logprobs_shape(
    prompt_ids: Sequence[int], entries: Sequence[TokenLogprob | None], texts: TokenTexts
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: null for the first token, then the token there and the
    top alternatives keyed by id, each with its logprob, rank and decoded text."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for tid, e in zip(prompt_ids, entries, strict=True):
        if e is None:
            out.append(None)
            continue
        row: dict[str, dict[str, Any]] = {}
        for j, (alt, lp) in enumerate(e.top):
            better = sum(1 for _, other in e.top[:j] if other > lp)
            row[str(alt)] = {
                "logprob": finite(lp),
                "rank": better + 1,
                "decoded_token": texts(alt)[0],
            }
        row.setdefault(
            str(int(tid)),
            {"logprob": finite(e.logprob), "rank": e.rank, "decoded_token": texts(int(tid))[0]},
        )
        out.append(row)
    return out


def trim_to_text(tokens: list[WireToken], text_len: int, offset: int = 0) -> list[WireToken]:
    """The tokens whose text starts before ``text_len`` characters (from ``offset``): those a
    stop string cut from the text are dropped with it."""
    out = []
    at = offset
    for t in tokens:
        if at >= text_len:
            break
        out.append(t)
        at += t.chars
    return out
