"""Draft/target pairs: drafter references and pair loading, in one place above the models and
the drafters (the CLI, the bench, the certificate and the Python API all load pairs here).

A draft reference is one of
    none | ""          plain decoding (no drafter)
    ngram[:MAX_N]      prompt lookup over the context (no draft model)
    a ModelConfig      a draft model (checked to share the target's tokenizer)
    a Drafter object   used as it is
"""

from __future__ import annotations

from collections.abc import Callable

from specdec.decoding import context_limit
from specdec.drafters.base import Drafter
from specdec.drafters.ngram import NgramDrafter
from specdec.errors import ConfigError
from specdec.models.base import CausalLM, check_same_vocabulary
from specdec.models.loader import ModelConfig, load_model

DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DEFAULT_DRAFT_BACKEND = "llamacpp"
DEFAULT_TARGET_BACKEND = "hf"

Loader = Callable[[ModelConfig], CausalLM]
DraftRef = ModelConfig | Drafter | str | None


def is_model_free(ref: str) -> bool:
    """Whether a draft reference names no model (plain decoding or a model-free drafter)."""
    return ref in ("none", "") or ref == "ngram" or ref.startswith("ngram:")


def parse_drafter(ref: str) -> Drafter | None:
    """A model-free drafter from its reference (None for plain decoding)."""
    if ref in ("none", ""):
        return None
    if ref == "ngram" or ref.startswith("ngram:"):
        _, _, n = ref.partition(":")
        try:
            max_n = int(n) if n else 3
        except ValueError as e:
            raise ConfigError(f"bad n-gram drafter {ref!r}: use ngram or ngram:MAX_N") from e
        return NgramDrafter(max_n=max_n)
    raise ConfigError(f"unknown drafter {ref!r}: use a model, 'ngram[:MAX_N]' or 'none'")


def release(*models: object) -> None:
    """Free models early (backends with native memory expose ``close``)."""
    for m in models:
        close = getattr(m, "close", None)
        if callable(close):
            close()


def load_pair(
    draft: DraftRef, target: ModelConfig, *, loader: Loader = load_model
) -> tuple[CausalLM | Drafter | None, CausalLM]:
    """(draft model or drafter or None, target) ready for ``generate``.

    Model pairs are checked to share one tokenizer; on any failure the models loaded so far
    are released. ``loader`` turns a ModelConfig into a CausalLM (tests inject their own).
    """
    if isinstance(draft, str):
        draft = parse_drafter(draft)  # validate before loading anything
    target_lm = loader(target)
    if not isinstance(draft, ModelConfig):
        return draft, target_lm
    try:
        draft_lm = loader(draft)
    except BaseException:
        release(target_lm)
        raise
    try:
        check_same_vocabulary(draft_lm, target_lm)
    except BaseException:
        release(draft_lm, target_lm)
        raise
    return draft_lm, target_lm


def pair_context_limit(draft: CausalLM | Drafter | None, target: CausalLM) -> int:
    """The context window a generation with this pair may use (the smaller of the two)."""
    if isinstance(draft, CausalLM):
        return min(target.n_ctx, draft.n_ctx)
    return context_limit(target, draft)
