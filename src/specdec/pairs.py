"""Draft/target pairs: drafter references and pair loading, in one place above the models and
the drafters (the CLI, the bench, the certificate and the Python API all load pairs here).

A draft reference is one of
    none | ""          plain decoding (no drafter)
    ngram[:MAX_N]      prompt lookup over the context (no draft model)
    suffix[:OPTS]      suffix matching over prompt and output, drafts sized by the match;
                       OPTS like "max_draft=16,min_match=3" (``drafters.suffix``)
    planned[:OPTS]     the suffix drafter with cost-aware draft lengths: each draft is cut
                       to the length with the best expected tokens per second given the
                       target's measured verify curve (``drafters.planned``); loading it
                       needs a cost provider (``load_pair(..., costs=...)``)
    a ModelConfig      a draft model (checked to share the target's tokenizer)
    a HybridRef        suffix drafts where they match, the draft model elsewhere
    a Drafter object   used as it is
On the command line, ``hybrid:MODEL`` names a hybrid with that draft model.

A draft window (``load_pair(..., draft_window=W)``) makes the draft model (alone or behind a
hybrid) see only the last W tokens of the context (``core.model_drafter``): its prefill stops
costing a long prompt's length, and the pair's context is bounded by the target alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specdec.core.drafter import Drafter
from specdec.core.loop import context_limit
from specdec.core.model import CausalLM
from specdec.core.model_drafter import ModelDrafter, check_window
from specdec.core.vocab import check_same_vocabulary
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.planned import PlannedSuffixDrafter, planned_suffix
from specdec.drafters.suffix import SuffixDrafter, parse_suffix_options
from specdec.errors import ConfigError
from specdec.models.loader import ModelConfig, load_model
from specdec.theory import Costs

DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
# "auto": llama.cpp for GGUF files and store names (what a user would otherwise run on the
# same file, and the fastest plain decoder measured here), transformers for model directories
DEFAULT_DRAFT_BACKEND = "auto"
DEFAULT_TARGET_BACKEND = "auto"

Loader = Callable[[ModelConfig], CausalLM]
# the target's measured costs, for drafters that size their drafts by them
CostProvider = Callable[[ModelConfig, CausalLM], Costs]
HYBRID_PREFIX = "hybrid:"
PLANNED = "planned"
PLANNED_K = 64  # the default cap on a planned draft (the planner picks the length below it)
DEFAULT_K = 6  # drafts per round when a drafter is named but no K


@dataclass(frozen=True)
class ModelOptions:
    """How the models are run: the model keywords of ``specdec.load`` and the command line's
    model flags, written once. ``draft_device`` / ``draft_dtype`` None: the target's.
    ``exact`` None: the profile decides, which ``configuration.resolve`` settles before the
    models are named (``model_refs`` takes a decided one)."""

    target_backend: str = DEFAULT_TARGET_BACKEND
    draft_backend: str = DEFAULT_DRAFT_BACKEND
    device: str = "auto"
    dtype: str = "auto"
    draft_device: str | None = None
    draft_dtype: str | None = None
    n_ctx: int = 4096
    n_threads: int | None = None
    exact: bool | None = None


@dataclass(frozen=True)
class HybridRef:
    """A suffix drafter backed by a draft model where the suffix drafter has no match."""

    model: ModelConfig
    suffix: str = ""  # suffix options, "NAME=VALUE,..."


DraftRef = ModelConfig | HybridRef | Drafter | str | None


def _named(ref: str, name: str) -> bool:
    return ref == name or ref.startswith(name + ":")


def is_model_free(ref: str) -> bool:
    """Whether a draft reference names no model (plain decoding or a model-free drafter)."""
    return (
        ref in ("none", "") or _named(ref, "ngram") or _named(ref, "suffix") or _named(ref, PLANNED)
    )


def is_planned(ref: object) -> bool:
    """Whether a draft reference names the cost-aware suffix drafter."""
    return isinstance(ref, str) and _named(ref, PLANNED)


def model_refs(
    target: str, draft: str | None, options: ModelOptions
) -> tuple[DraftRef, ModelConfig]:
    """(draft reference, target config) from model references: a model-free drafter stays a
    string ("none" for None), ``hybrid:MODEL`` becomes a ``HybridRef``, anything else a
    draft model's ``ModelConfig`` (which never runs exact numerics: a draft only proposes).
    ``options.exact`` must be decided (True or False)."""
    o = options
    assert o.exact is not None, "exact None (the profile decides) is settled by resolve"
    target_cfg = ModelConfig(
        target, o.target_backend, o.device, o.dtype, o.n_ctx, o.n_threads, o.exact
    )
    if draft is None or is_model_free(draft):
        return draft or "none", target_cfg
    model = ModelConfig(
        draft.removeprefix(HYBRID_PREFIX),
        o.draft_backend,
        o.draft_device or o.device,
        o.draft_dtype or o.dtype,
        o.n_ctx,
        o.n_threads,
    )
    return (HybridRef(model) if draft.startswith(HYBRID_PREFIX) else model), target_cfg


def parse_drafter(ref: str) -> Drafter | None:
    """A model-free drafter from its reference (None for plain decoding)."""
    if ref in ("none", ""):
        return None
    if _named(ref, "ngram"):
        _, _, n = ref.partition(":")
        try:
            max_n = int(n) if n else 3
        except ValueError as e:
            raise ConfigError(f"bad n-gram drafter {ref!r}: use ngram or ngram:MAX_N") from e
        return NgramDrafter(max_n=max_n)
    if _named(ref, PLANNED):  # the inner drafter; load_pair adds the planner
        return planned_suffix(ref.partition(":")[2])
    if _named(ref, "suffix"):
        return SuffixDrafter(parse_suffix_options(ref.partition(":")[2]))
    raise ConfigError(
        f"unknown drafter {ref!r}: use a model, 'ngram[:MAX_N]', 'suffix[:OPTS]', "
        "'planned[:OPTS]', 'hybrid:MODEL' or 'none'"
    )


def release(*models: object) -> None:
    """Free models early (backends with native memory expose ``close``)."""
    for m in models:
        close = getattr(m, "close", None)
        if callable(close):
            close()


def load_pair(
    draft: DraftRef,
    target: ModelConfig,
    *,
    loader: Loader = load_model,
    costs: CostProvider | None = None,
    draft_window: int | None = None,
) -> tuple[CausalLM | Drafter | None, CausalLM]:
    """(draft model or drafter or None, target) ready for ``generate``.

    Model pairs are checked to share one tokenizer; on any failure the models loaded so far
    are released. ``loader`` turns a ModelConfig into a CausalLM (tests inject their own);
    ``costs`` gives the loaded target's measured costs to a ``planned`` drafter;
    ``draft_window`` (an int >= 1, below the draft model's n_ctx) makes the draft model a
    windowed ``ModelDrafter``: a draft model then comes back wrapped. Plain decoding ignores
    it; a drafter without a model refuses it.
    """
    check_window(draft_window)
    if draft_window is not None:
        _check_windowable(draft)
    planned = is_planned(draft)
    if planned and costs is None:
        raise ConfigError(f"the drafter {draft!r} needs the target's measured costs")
    if isinstance(draft, str):
        draft = parse_drafter(draft)  # validate before loading anything
    suffix = (
        SuffixDrafter(parse_suffix_options(draft.suffix)) if isinstance(draft, HybridRef) else None
    )
    target_lm = loader(target)
    for copier in (draft, suffix):  # no suffix draft runs past an end of generation
        if isinstance(copier, SuffixDrafter):
            copier.ends = target_lm.eos_token_ids
    if planned:
        assert costs is not None and isinstance(draft, SuffixDrafter)
        try:
            return PlannedSuffixDrafter(draft, costs(target, target_lm)), target_lm
        except BaseException:
            release(target_lm)
            raise
    model_cfg = draft.model if isinstance(draft, HybridRef) else draft
    if not isinstance(model_cfg, ModelConfig):
        return draft, target_lm  # type: ignore[return-value]
    try:
        draft_lm = loader(model_cfg)
    except BaseException:
        release(target_lm)
        raise
    try:
        check_same_vocabulary(draft_lm, target_lm)
    except BaseException:
        release(draft_lm, target_lm)
        raise
    try:
        drafter = (
            None
            if suffix is None and draft_window is None
            else ModelDrafter(draft_lm, vocab_size=target_lm.vocab_size, window=draft_window)
        )
    except BaseException:
        release(draft_lm, target_lm)
        raise
    if suffix is not None:
        assert drafter is not None
        return HybridDrafter(suffix, drafter), target_lm
    return (draft_lm if drafter is None else drafter), target_lm


def _check_windowable(draft: DraftRef) -> None:
    """A draft window needs a draft model (plain decoding has nothing to window)."""
    if draft is None or draft in ("none", "") or isinstance(draft, ModelConfig | HybridRef):
        return
    raise ConfigError(
        f"a draft window applies to a draft model (or hybrid:MODEL), not to {draft_label(draft)!r}"
    )


def pair_context_limit(draft: CausalLM | Drafter | None, target: CausalLM) -> int:
    """The context window a generation with this pair may use (the smaller of the two; the
    target's alone with a windowed draft)."""
    if isinstance(draft, CausalLM):
        return min(target.n_ctx, draft.n_ctx)
    return context_limit(target, draft)  # a hybrid bounds its own model's drafts


def draft_label(ref: DraftRef) -> str | None:
    """A short, stable description of a draft reference (for records and certificates)."""
    if ref is None or isinstance(ref, str):
        return ref
    if isinstance(ref, ModelConfig):
        return ref.label()
    if isinstance(ref, HybridRef):
        return f"{HYBRID_PREFIX}{ref.model.label()}" + (f"[{ref.suffix}]" if ref.suffix else "")
    return getattr(ref, "name", type(ref).__name__)
