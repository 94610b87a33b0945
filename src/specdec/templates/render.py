"""``render_chat``: a template rendered in the limited sandbox inside a worker process.

Its own module so that ``content`` (which renders) and the package (which re-exports it)
import it without importing each other: no file imports itself around a circle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specdec.templates.sandbox import TemplateLimits


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    variables: Mapping[str, Any] | None = None,
    *,
    limits: TemplateLimits | None = None,
) -> str:
    """The text of ``template`` for ``messages`` (plus variables such as bos_token,
    add_generation_prompt), rendered in the limited sandbox inside a worker process with
    memory and time limits (in this process where no worker can run). Raises TemplateError."""
    from specdec.templates.isolation import render_isolated

    return render_isolated(template, messages, variables, limits or TemplateLimits())
