"""Chat templates: data from a model file, rendered with bounded time and memory, and message
text that stays text.

A chat template comes from a model file (GGUF metadata or tokenizer_config.json): it is data
written by whoever made the file, not code we trust. Three layers bound what it can cost:

- ``sandbox``: Jinja's immutable sandbox, with a size check before every operation that can
  build a large string, list or integer in one step (repetition, powers, concatenation,
  formatting, ``join``, ``replace``, ``center``, ...), and a time limit on template code;
- ``isolation``: the rendering runs in a separate worker process with a hard memory limit
  (``RLIMIT_AS``) and a wall-clock limit after which the worker is killed, so even an
  operation that no check names ends in one clear error, and a server's other requests go
  on meanwhile (each render takes its own worker);
- ``content``: special-token text inside a message (``<|im_end|>``) is tokenized as text,
  so a message cannot close its turn or open a system turn; the template's own markers stay
  special tokens. ``parse_special=True`` opts out (raw prompts).

The globals and filters match what transformers gives templates (``raise_exception``,
``strftime_now``, ``tojson``, loop controls), so the same template gives the same text on
both backends.
"""

from __future__ import annotations

from specdec.templates.content import (
    ChatTokenizer,
    Segments,
    chat_segments,
    encode_chat,
    encode_segments,
    supports_chat,
)
from specdec.templates.render import render_chat
from specdec.templates.sandbox import TemplateError, TemplateLimits, render_here

__all__ = [
    "ChatTokenizer",
    "Segments",
    "TemplateError",
    "TemplateLimits",
    "chat_segments",
    "encode_chat",
    "encode_segments",
    "render_chat",
    "render_here",
    "supports_chat",
]
