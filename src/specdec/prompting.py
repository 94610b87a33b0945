"""Prompt text -> token ids (raw, or through the model's chat template)."""

from __future__ import annotations

from specdec.errors import EmptyPromptError
from specdec.models.base import CausalLM


def encode_prompt(model: CausalLM, text: str, *, chat: bool = False) -> list[int]:
    """Token ids for ``text``; with chat=True the text is the user turn of a chat and the
    model's chat template (with the assistant header) is applied."""
    if not text.strip():
        raise EmptyPromptError("the prompt is empty")
    tok = model.tokenizer
    if chat:
        apply = getattr(tok, "apply_chat", None)
        if apply is None:
            raise EmptyPromptError("this model has no chat template; drop --chat")
        ids: list[int] = apply([{"role": "user", "content": text}])
    else:
        ids = tok.encode(text, add_special_tokens=True)
    if not ids:
        raise EmptyPromptError("the prompt encodes to zero tokens")
    return ids
