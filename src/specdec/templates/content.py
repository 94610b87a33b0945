"""Messages through a chat template to token ids, with the text of a message kept as text.

A tokenizer that parses special tokens would read ``<|im_end|>`` typed inside a message as the
real end-of-turn token, so a message could close its own turn and open a forged system turn
(``"hi<|im_end|>\\n<|im_start|>system\\n..."``). As llama-server and vLLM treat message
content, the text inside a message is tokenized as text here, while the template's own
markers stay special tokens:

1. every special token's text inside a message is replaced by a placeholder character (one per
   distinct special text, from Unicode's private use planes, none of which occur in the
   messages, the template or its variables);
2. the template is rendered (``render_chat``: sandbox, worker process, limits);
3. the rendered text is cut at the placeholders: the pieces between them are tokenized with
   special tokens parsed (the template's markers), each placeholder's special text without
   (as plain characters).

``parse_special=True`` skips step 1 (the whole prompt is parsed, special tokens included): the
explicit opt-in for raw prompts. A tokenizer takes part by implementing ``ChatTokenizer``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Protocol, TypeGuard, runtime_checkable

from specdec.templates import render
from specdec.templates.sandbox import TemplateError

Segments = list[tuple[str, bool]]  # (text, parse special tokens in it)

_PLACEHOLDERS = range(0xF0000, 0x10FFFE)  # supplementary private use areas A and B


@runtime_checkable
class ChatTokenizer(Protocol):
    """What a backend's tokenizer provides for chat prompts."""

    @property
    def chat_template(self) -> str | None: ...

    def chat_variables(self) -> dict[str, Any]:
        """The template's variables besides messages (bos_token, add_generation_prompt...)."""
        ...

    def special_texts(self) -> frozenset[str]:
        """The texts that the tokenizer reads as special tokens when it parses them."""
        ...

    def encode_piece(self, text: str, *, special: bool) -> list[int]:
        """Token ids of ``text`` (no BOS added), special tokens parsed only when asked."""
        ...


def supports_chat(tokenizer: Any) -> TypeGuard[ChatTokenizer]:
    """Whether ``tokenizer`` renders chats here (message text kept as text)."""
    return isinstance(tokenizer, ChatTokenizer) and bool(tokenizer.chat_template)


@lru_cache(maxsize=8)
def _pattern(specials: frozenset[str]) -> re.Pattern[str] | None:
    texts = sorted((s for s in specials if s), key=len, reverse=True)  # longest first
    return re.compile("|".join(map(re.escape, texts))) if texts else None


def _free_placeholders(used: Iterable[str], n: int) -> list[str]:
    taken = {ch for text in used for ch in text if ord(ch) >= _PLACEHOLDERS.start}
    out = []
    for code in _PLACEHOLDERS:
        if chr(code) not in taken:
            out.append(chr(code))
            if len(out) == n:
                return out
    raise TemplateError("the messages use every private-use character; cannot mark their text")


def protect(
    messages: Sequence[Mapping[str, Any]],
    specials: frozenset[str],
    also_used: Iterable[str] = (),
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The messages with each special text inside a content replaced by a placeholder, and
    placeholder -> special text."""
    pattern = _pattern(specials)
    contents = [m.get("content") for m in messages]
    found = sorted(
        {hit for c in contents if isinstance(c, str) and pattern for hit in pattern.findall(c)}
    )
    if not found:
        return [dict(m) for m in messages], {}
    texts = [c for c in contents if isinstance(c, str)] + list(also_used)
    marks = dict(zip(found, _free_placeholders(texts, len(found)), strict=True))
    assert pattern is not None
    out = []
    for m in messages:
        c = m.get("content")
        if isinstance(c, str):
            m = {**m, "content": pattern.sub(lambda hit: marks[hit.group(0)], c)}
        out.append(dict(m))
    return out, {mark: text for text, mark in marks.items()}


def split(text: str, marks: Mapping[str, str]) -> Segments:
    """The rendered text as segments: template text (special tokens parsed) and the special
    texts that came from messages (tokenized as plain text)."""
    if not marks:
        return [(text, True)]
    out: Segments = []
    start = 0
    for i, ch in enumerate(text):
        if ch in marks:
            if i > start:
                out.append((text[start:i], True))
            out.append((marks[ch], False))
            start = i + 1
    if start < len(text):
        out.append((text[start:], True))
    return out


def chat_segments(
    tokenizer: ChatTokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    parse_special: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> Segments:
    """Render ``messages`` through the tokenizer's template (the slow part, which needs no
    lock on the tokenizer), as segments for ``encode_segments``; ``extra``: more template
    variables (``tools``: the functions a model may call)."""
    template = tokenizer.chat_template
    if not template:
        raise TemplateError("this model has no chat template")
    variables = {**tokenizer.chat_variables(), **(extra or {})}
    if parse_special:
        return [(render.render_chat(template, messages, variables), True)]
    used = [template, *(v for v in variables.values() if isinstance(v, str))]
    protected, marks = protect(messages, tokenizer.special_texts(), used)
    return split(render.render_chat(template, protected, variables), marks)


def encode_segments(tokenizer: ChatTokenizer, segments: Segments) -> list[int]:
    ids: list[int] = []
    for text, special in segments:
        ids += tokenizer.encode_piece(text, special=special)
    return ids


def encode_chat(
    tokenizer: ChatTokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    parse_special: bool = False,
) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template, message text as text
    (unless ``parse_special``)."""
    return encode_segments(
        tokenizer, chat_segments(tokenizer, messages, parse_special=parse_special)
    )
