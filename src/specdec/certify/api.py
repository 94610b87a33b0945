"""``certify_models``: Level 3 (probe, greedy agreement, per-token test) on any pair of
``CausalLM`` objects, for people with their own backends. The CLI prints the same
``Certificate`` object that this returns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from specdec.core.drafter import Drafter
from specdec.core.model import CausalLM
from specdec.stats.thresholds import ALPHA

from .plan import make_plan
from .prompts import CertifyPrompts
from .report import Certificate
from .runner import CertifyConfig, run_certificate


def certify_models(
    draft: CausalLM | Drafter,
    target: CausalLM,
    prompts: Sequence[str | Sequence[int]],
    *,
    quick: bool = False,
    out: str | Path | None = None,
    seed: int = 0,
    alpha: float = ALPHA,
    k: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seeds: int | None = None,
    sample_tokens: int | None = None,
    greedy_prompts: int | None = None,
    sampled_prompts: int | None = None,
    plain_seeds: int | None = None,
    plain_tv_threshold: float | None = None,
    chat: str = "off",
    draft_label: str = "draft",
    target_label: str = "target",
    fault: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Certificate:
    """Certify that speculative decoding with ``draft`` (a model or a drafter) and
    ``target`` keeps the target's distribution, with Level 3 of ``specdec certify``.

    prompts: texts (encoded with the target's tokenizer; ``chat="auto"``/``"on"`` applies its
    chat template) or token-id lists. The probe takes the last prompts when there are more
    than the greedy prompts need (so its near-tie threshold is measured on other prompts),
    the per-token test the first ``sampled_prompts``. Sizes default to the quick or full plan
    (docs/certify.md); every option of the CLI's Level 3 can be overridden here.
    ``out``: a directory for certificate.json / certificate.md / progress.jsonl (None: no
    files). Returns the ``Certificate``; its ``status`` is "pass", "warn" or "fail" and
    ``verdict_line()`` is what the CLI prints.
    """
    plan = make_plan(
        quick=quick,
        seed=seed,
        alpha=alpha,
        k=k,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seeds=seeds,
        sample_tokens=sample_tokens,
        greedy_prompts=greedy_prompts,
        sampled_prompts=sampled_prompts,
        plain_seeds=plain_seeds,
        plain_tv_threshold=plain_tv_threshold,
    )
    cfg = CertifyConfig(
        levels=("3",),
        plan=plan,
        quick=quick,
        seed=seed,
        alpha=alpha,
        draft=draft_label,
        target=target_label,
        prompts_source="caller",
        chat=chat,
        out_dir=Path(out) if out is not None else None,
        fault=fault,
        command="specdec.certify.certify_models(...)",
    )
    given = CertifyPrompts(list(prompts), None, "the caller")
    return run_certificate(cfg, lambda: (draft, target), progress=progress, prompts=given)
