"""Building a ``llama_cpp.Llama`` with settings its constructor does not expose, and without
what it does on its own that specdec must not let a model file trigger.

* Model params: ``Llama()`` starts from ``llama_model_default_params()`` (looked up in
  ``llama_cpp.llama_cpp`` at call time) and sets only the fields it knows, so a load that
  needs others (``use_extra_bufts``, ``tensor_buft_overrides``) runs with that function
  wrapped to set them, under a lock, restored right after.
* Chat templates: ``Llama()`` compiles every ``tokenizer.chat_template*`` string of the GGUF
  with Jinja2 in this process, whatever chat format is asked for; Jinja2 folds constant
  expressions while compiling, so a template holding ``7 ** 77777777`` hangs the load and one
  holding ``'a' * 10**9`` allocates gigabytes, before any sandbox could see it. During the
  load the formatter class is replaced by one that keeps the text and compiles nothing
  (specdec renders templates itself, in a bounded worker: ``specdec.templates``); a chat
  handler built from it refuses to run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specdec.llama_trust.ggml_bufts import Choice

# Serialises loads that temporarily replace llama-cpp-python's module attributes. Code outside
# specdec that builds a Llama() on another thread during such a load would see them too;
# specdec itself loads models from one thread.
_LOAD_LOCK = threading.Lock()


class UncompiledTemplate:
    """Stands in for ``llama_chat_format.Jinja2ChatFormatter`` during a load: the template
    text is kept, never compiled."""

    def __init__(self, template: str, *args: Any, **kwargs: Any) -> None:
        self.template = template

    def to_chat_handler(self) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                "specdec loads models without llama-cpp-python's chat templates; "
                "render chats with specdec.templates"
            )

        return refuse


def has_param_field(llama_cpp: Any, name: str) -> bool:
    fields = getattr(llama_cpp.llama_cpp.llama_model_params, "_fields_", [])
    return any(f[0] == name for f in fields)


@contextmanager
def loading(llama_cpp: Any, *, templates: bool = False, **fields: Any) -> Iterator[None]:
    """While active, ``llama_model_default_params()`` returns params with ``fields`` set and
    ``Llama()`` compiles no chat template (unless ``templates``: llama-cpp-python's own
    server, which renders chats with them)."""
    low = llama_cpp.llama_cpp
    llama_chat_format: Any = llama_cpp.llama_chat_format

    with _LOAD_LOCK:
        original = low.llama_model_default_params
        formatter = llama_chat_format.Jinja2ChatFormatter

        def with_fields() -> Any:
            params = original()
            for name, value in fields.items():
                setattr(params, name, value)
            return params

        if fields:
            low.llama_model_default_params = with_fields
        if not templates:
            llama_chat_format.Jinja2ChatFormatter = UncompiledTemplate
        try:
            yield
        finally:
            low.llama_model_default_params = original
            llama_chat_format.Jinja2ChatFormatter = formatter


def buffer_fields(llama_cpp: Any, path: str | Path, choice: Choice) -> tuple[dict[str, Any], Any]:
    """The model-param fields for ``choice`` of optional kernels, and the object that must
    stay alive while llama.cpp loads (the override array), or None."""
    if not choice.extras:
        return {"use_extra_bufts": False}, None
    if not choice.avoid:
        return {}, None
    from specdec.hub.gguf import check_gguf_header
    from specdec.llama_trust.ggml_bufts import OverrideArray, ggml, group_patterns, moved_tensors

    g = ggml(llama_cpp)
    header = check_gguf_header(path)
    overrides = group_patterns(moved_tensors(g, header.tensors, frozenset(choice.avoid)))
    if not overrides:
        return {}, None
    array = OverrideArray(g, overrides)
    return {"tensor_buft_overrides": array.address}, array


def load_llama(llama_cpp: Any, path: str | Path, choice: Choice, **kwargs: Any) -> Any:
    """``llama_cpp.Llama(model_path=path, **kwargs)`` with ``choice`` of optional kernels and
    no chat template compiled."""
    fields, keep_alive = buffer_fields(llama_cpp, path, choice)
    with loading(llama_cpp, **fields):
        llm = llama_cpp.Llama(model_path=str(path), **kwargs)
    del keep_alive  # llama.cpp reads the overrides only while loading
    return llm
