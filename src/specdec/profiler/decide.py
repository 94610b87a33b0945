"""The decision rule: rank configurations by predicted end-to-end time for the request at
hand, and say why the winner wins (pure functions).

A candidate is one way to run the target: plain decoding on a backend (K = 0), or a drafter
with that backend at some K. Every candidate is compared with the fastest *plain* decoder
available on this machine, which is what a user would otherwise run. Speculation is
recommended only when its predicted end-to-end time beats that plain decoder by a margin
fixed in advance (``DEFAULT_MARGIN``), so a prediction within the profile's own noise never
replaces the plain decoder.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specdec.profiler.predict import Costs, Prediction

# Speculation must be predicted at least this much faster (end to end) than the fastest
# plain decoder before it is recommended: the cost measurements move by a few percent
# between runs on a shared machine.
DEFAULT_MARGIN = 1.05
# The planned suffix drafter (which falls back to plain steps by itself where drafting does
# not pay) is recommended over plain decoding unless it measured below this fraction of it.
FALLBACK_MARGIN = 0.97


@dataclass(frozen=True)
class Candidate:
    """One configuration: a target backend and a drafter ("none" for plain decoding)."""

    target_backend: str
    drafter: str  # "none" | "ngram" | "suffix" | a draft model label
    model_draft: bool

    @property
    def label(self) -> str:
        return (
            f"plain {self.target_backend}"
            if self.drafter == "none"
            else f"{self.drafter} -> {self.target_backend}"
        )


@dataclass
class Scored:
    """A candidate at its best K, scored for a request."""

    candidate: Candidate
    k: int
    prediction: Prediction
    e2e_s: float  # predicted seconds for the request (prefill + decode)
    speedup_vs_plain: float  # against the fastest plain decoder, end to end
    decode_speedup_vs_plain: float


@dataclass
class Recommendation:
    best: Scored
    ranked: list[Scored]
    plain: Scored  # the fastest plain decoder
    reason: str


def request_seconds(pred: Prediction, prompt_tokens: int, new_tokens: int) -> float:
    """Predicted seconds for one request of the given size, from a prediction made on the
    probe sequences (per-token decode rate and per-token prefill rate scale linearly)."""
    per_prompt_token = pred.prefill_s / max(pred.prompt_tokens, 1)
    per_new_token = pred.decode_s / max(pred.tokens, 1)
    return per_prompt_token * prompt_tokens + per_new_token * new_tokens


def rank(
    predictions: Sequence[tuple[Candidate, Prediction]],
    *,
    prompt_tokens: int,
    new_tokens: int,
    margin: float = DEFAULT_MARGIN,
    costs: dict[str, Costs] | None = None,
) -> Recommendation:
    """Best K per candidate, ranked by predicted request time; the recommendation with its
    reason. ``costs`` (per target backend) only enriches the reason."""
    if not predictions:
        raise ValueError("nothing to rank: no candidate was profiled")
    best_per: dict[Candidate, Scored] = {}
    for cand, pred in predictions:
        e2e = request_seconds(pred, prompt_tokens, new_tokens)
        cur = best_per.get(cand)
        if cur is None or e2e < cur.e2e_s:
            best_per[cand] = Scored(cand, pred.k, pred, e2e, math.nan, math.nan)
    plains = [s for s in best_per.values() if s.candidate.drafter == "none"]
    if not plains:
        raise ValueError("no plain configuration was profiled: nothing to compare against")
    plain = min(plains, key=lambda s: s.e2e_s)
    plain_decode = plain.prediction.decode_s / max(plain.prediction.tokens, 1)
    for s in best_per.values():
        s.speedup_vs_plain = plain.e2e_s / s.e2e_s if s.e2e_s > 0 else math.inf
        per_tok = s.prediction.decode_s / max(s.prediction.tokens, 1)
        s.decode_speedup_vs_plain = plain_decode / per_tok if per_tok > 0 else math.inf
    ranked = sorted(best_per.values(), key=lambda s: s.e2e_s)
    spec = [s for s in ranked if s.candidate.drafter != "none"]
    best_spec = spec[0] if spec else None
    wins = best_spec is not None and best_spec.speedup_vs_plain >= margin
    best = best_spec if wins and best_spec is not None else plain
    reason = explain(best, plain, best_spec, margin, costs or {}, prompt_tokens, new_tokens)
    return Recommendation(best=best, ranked=ranked, plain=plain, reason=reason)


def _verify_ratio(costs: Costs | None, n: int) -> float | None:
    if costs is None:
        return None
    return costs.verify(n) / costs.verify(1)


def explain(
    best: Scored,
    plain: Scored,
    best_spec: Scored | None,
    margin: float,
    costs: dict[str, Costs],
    prompt_tokens: int,
    new_tokens: int,
) -> str:
    """One sentence in words: what to run and why (numbers from the profile)."""
    size = f"{prompt_tokens} prompt tokens, {new_tokens} new"
    if best is plain:
        if best_spec is None:
            return f"{plain.candidate.label}: no drafter was profiled ({size})"
        c = costs.get(best_spec.candidate.target_backend)
        k = max(best_spec.k, 1)
        ratio = _verify_ratio(c, k + 1)
        why = [
            f"the best speculative configuration ({best_spec.candidate.label}, K={best_spec.k}) "
            f"is predicted at {best_spec.speedup_vs_plain:.2f}x of it end to end"
        ]
        if ratio is not None:
            why.append(
                f"verifying {k + 1} tokens costs {ratio:.1f}x one token on "
                f"{best_spec.candidate.target_backend} here"
            )
        why.append(
            f"drafts keep {best_spec.prediction.mean_kept:.2f} tokens per round "
            f"(of {best_spec.prediction.mean_drafted:.2f} drafted)"
        )
        if best_spec.decode_speedup_vs_plain > best_spec.speedup_vs_plain * 1.02:
            why.append(
                f"decoding alone would be {best_spec.decode_speedup_vs_plain:.2f}x, but "
                + (
                    "the draft model's own prefill costs more than it wins back"
                    if best_spec.candidate.model_draft
                    else "the prompt's prefill, the same for both, dilutes it"
                )
            )
        return (
            f"{plain.candidate.label} (plain decoding, {size}): "
            + "; ".join(why)
            + f" (speculation must reach {margin:.2f}x to be chosen)"
        )
    c = costs.get(best.candidate.target_backend)
    ratio = _verify_ratio(c, best.k + 1)
    cost_part = f", and verifying {best.k + 1} tokens costs {ratio:.1f}x one token" if ratio else ""
    return (
        f"{best.candidate.label}, K={best.k}: {best.speedup_vs_plain:.2f}x end to end over "
        f"{plain.candidate.label} ({size}; decode {best.decode_speedup_vs_plain:.2f}x) because "
        f"drafts keep {best.prediction.mean_kept:.2f} tokens per round of "
        f"{best.prediction.mean_drafted:.2f} drafted{cost_part}"
    )
