"""Prompt text or chat messages -> token ids (raw, or through the model's chat template).

Two entry points:
- ``encode_prompt(model, text, chat=...)``: the explicit form the measurement tools use (the
  bench, the certificate and the profile keep their own chat settings, so their results do
  not change with the defaults below).
- ``encode_request(model, text, messages=..., system=..., chat=...)``: what ``specdec
  generate`` and the Python API use. Chat by default: a model with a chat template gets its
  template (the text is the last user turn, after an optional system prompt and earlier
  turns); a model without one gets the raw text, silently, unless a system prompt or
  messages were given, which need a template and are an error there.

One rule for every text a user supplies (a raw prompt, chat messages, a prediction): it is
text. A special token's text typed inside it (``<|im_end|>``) is tokenized as plain
characters, so a message cannot end its turn or open another one (``specdec.templates``), a
raw prompt cannot forge a turn either, and a prediction drafts the characters it shows;
``parse_special=True`` (``--parse-special``) is the one opt-in, for all of them at once. The
tokenizer's own additions (BOS) and a chat template's markers are special tokens as ever.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdec.core.model import CausalLM
from specdec.errors import ConfigError, EmptyPromptError
from specdec.util.textfiles import parse_json, read_text

ROLES = ("system", "user", "assistant", "tool")

Message = dict[str, str]


def has_chat_template(model: CausalLM) -> bool:
    """Whether the model's tokenizer can apply a chat template."""
    tok = model.tokenizer
    return callable(getattr(tok, "apply_chat", None)) and bool(getattr(tok, "chat_template", None))


def encode_text(
    model: CausalLM, text: str, *, add_special_tokens: bool, parse_special: bool = False
) -> list[int]:
    """Token ids of user text outside a chat template (a raw prompt, a prediction): special-
    token text in it is text unless ``parse_special`` (the module docstring's rule);
    ``add_special_tokens``: the tokenizer's own additions (BOS). A tokenizer without
    ``encode_piece`` (``templates.ChatTokenizer``) is taken to parse no special text."""
    tok = model.tokenizer
    piece = getattr(tok, "encode_piece", None)
    if parse_special or piece is None:
        return list(tok.encode(text, add_special_tokens=add_special_tokens))
    prefix = list(tok.encode("", add_special_tokens=True)) if add_special_tokens else []
    return prefix + list(piece(text, special=False))


def encode_prompt(
    model: CausalLM, text: str, *, chat: bool = False, parse_special: bool = False
) -> list[int]:
    """Token ids for ``text``; with chat=True the text is the user turn of a chat and the
    model's chat template (with the assistant header) is applied. Special-token text in it
    is text unless ``parse_special``."""
    if not text.strip():
        raise EmptyPromptError("the prompt is empty")
    check_text(text, "the prompt")
    if chat:
        return _apply_chat(model, [{"role": "user", "content": text}], parse_special)
    ids = encode_text(model, text, add_special_tokens=True, parse_special=parse_special)
    if not ids:
        raise EmptyPromptError("the prompt encodes to zero tokens")
    return ids


def check_messages(obj: Any, *, source: str = "messages") -> list[Message]:
    """A chat as a list of {"role", "content"} dicts, checked (ConfigError names the first
    bad entry): roles from ROLES, string content, at least one message."""
    if not isinstance(obj, list) or not obj:
        raise ConfigError(f"{source} must be a non-empty JSON list of {{role, content}} objects")
    out: list[Message] = []
    for i, m in enumerate(obj):
        if not isinstance(m, dict):
            raise ConfigError(f"{source}[{i}] is not an object with role and content")
        missing = [k for k in ("role", "content") if k not in m]
        if missing:
            raise ConfigError(f"{source}[{i}] has no {' or '.join(missing)}")
        role, content = m["role"], m["content"]
        if role not in ROLES:
            raise ConfigError(f"{source}[{i}] has role {role!r}: use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ConfigError(
                f"{source}[{i}] content must be a string, got {type(content).__name__}"
            )
        check_text(content, f"{source}[{i}] content")
        out.append({**m, "role": role, "content": content})
    return out


def read_messages(path: str | Path) -> list[Message]:
    """The messages of a JSON file (a list of {role, content}), checked; the file is read up
    to MAX_TEXT_BYTES (a device or an endless pipe is an error, not a hang)."""
    raw = read_text(path, "the messages file")
    return check_messages(parse_json(raw, f"the messages file {path}"), source=str(path))


def check_text(text: str, what: str) -> None:
    """Text a tokenizer can take: no lone surrogates (the form bytes that are not UTF-8 take
    in argv and in JSON's \\udXXX escapes), which no tokenizer can encode."""
    bad = next((i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF), None)
    if bad is not None:
        raise ConfigError(f"{what} is not valid UTF-8 at character {bad}")


def build_messages(
    text: str | None, messages: Sequence[Message] | None, system: str | None
) -> list[Message]:
    """The chat: the system prompt, then the messages, then ``text`` as the last user turn."""
    msgs = check_messages(list(messages)) if messages is not None else []
    if system is not None:
        check_text(system, "the system prompt")
        if any(m["role"] == "system" for m in msgs):
            raise ConfigError("give the system prompt once: --system or in the messages")
        msgs.insert(0, {"role": "system", "content": system})
    if text is not None:
        check_text(text, "the prompt")
        msgs.append({"role": "user", "content": text})
    if not any(m["content"].strip() for m in msgs if m["role"] != "system"):
        raise EmptyPromptError("the prompt is empty")
    return msgs


def encode_request(
    model: CausalLM,
    text: str | None,
    *,
    messages: Sequence[Message] | None = None,
    system: str | None = None,
    chat: bool | None = None,
    parse_special: bool = False,
) -> list[int]:
    """Token ids for a generation request, chat by default.

    chat=None: the chat template when the model has one, else the raw text (silently);
    chat=True: the template, an error without one; chat=False: raw text only (a system
    prompt or messages are then an error). ``messages`` are earlier turns, ``text`` (when
    given) the last user turn. ``parse_special``: special-token text inside the messages and
    the prompt is read as special tokens (off: it is text).
    """
    wants_chat = messages is not None or system is not None
    if chat is False:
        if wants_chat:
            raise ConfigError("a raw prompt takes no system prompt or messages: drop --raw")
        if text is None:
            raise EmptyPromptError("the prompt is empty")
        return encode_prompt(model, text, parse_special=parse_special)
    if not has_chat_template(model):
        if chat or wants_chat:
            what = "--system / --messages need" if wants_chat else "--chat needs"
            raise ConfigError(f"this model has no chat template: {what} one")
        if text is None:
            raise EmptyPromptError("the prompt is empty")
        return encode_prompt(model, text, parse_special=parse_special)
    return _apply_chat(model, build_messages(text, messages, system), parse_special)


def _apply_chat(model: CausalLM, messages: list[Message], parse_special: bool) -> list[int]:
    apply = getattr(model.tokenizer, "apply_chat", None)
    if apply is None:
        raise EmptyPromptError("this model has no chat template; drop --chat")
    ids: list[int] = apply(messages, parse_special=True) if parse_special else apply(messages)
    if not ids:
        raise EmptyPromptError("the prompt encodes to zero tokens")
    return ids
