"""What a generation returns: one ``Round`` record per round (yielded by the loop as it goes,
learnt from by the K policies, kept in the result) and the ``GenerationResult`` with the
metrics derived from them (definitions: docs/metrics.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specdec.core.logprobs import TokenLogprob


@dataclass(frozen=True)
class Round:
    """What one round did. Times in seconds (stopwatch sections of the round)."""

    k: int  # drafts proposed (after clamping; a drafter may propose fewer); 0 = a plain step
    n_accepted: int  # drafts the verifier kept (0..k)
    tokens: list[int]  # tokens appended to the context (after the EOS / length cut)
    t_draft: float
    t_verify: float  # the target pass, and the rollback past rejected drafts
    t_sampling: float  # the verifier (rows, accept/reject)
    t_round: float  # the whole round, the policy's choice of K included
    eos: bool = False  # the round ended at an end-of-sequence token
    source: str | None = None  # where the drafts came from, when the drafter says (Draft.source)
    # one per token, when the generation asked for them (core.logprobs), from this round's rows
    logprobs: tuple[TokenLogprob, ...] | None = None

    @property
    def n_emitted(self) -> int:
        """Tokens kept from this round (after the EOS / length cut)."""
        return len(self.tokens)

    def stats(self) -> dict[str, Any]:
        """The round's figures as ``GenerationResult.to_dict`` lists them (no token ids)."""
        return {
            "k": self.k,
            "n_accepted": self.n_accepted,
            "n_emitted": self.n_emitted,
            "t_draft": self.t_draft,
            "t_verify": self.t_verify,
            "t_sampling": self.t_sampling,
            "t_round": self.t_round,
            "source": self.source,
        }


@dataclass
class GenerationResult:
    """One generation: the prompt and the tokens generated, its rounds, why it ended, its
    times (seconds), the drafter's name and what the drafter and the numerics add (extra)."""

    prompt_ids: list[int]
    tokens: list[int]
    rounds: list[Round]
    finish_reason: str  # "length" | "eos" | "context" | "stop" (a stop string) | "cancelled"
    t_prefill: float
    t_total: float  # wall time of prefill plus all rounds
    drafter: str = "none"
    extra: dict[str, Any] = field(default_factory=dict)
    # the prompt's tokens scored when asked (core.logprobs): None for the first, then one per
    # token, each under the row of the tokens before it
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        """One per generated token, when the generation asked for them (``core.logprobs``)."""
        if not self.rounds or any(r.logprobs is None for r in self.rounds):
            return None if self.rounds else []
        return [lp for r in self.rounds for lp in r.logprobs or ()]

    @property
    def n_rounds(self) -> int:
        return len(self.rounds)

    @property
    def tokens_per_second(self) -> float:
        t = self.t_total - self.t_prefill
        return len(self.tokens) / t if t > 0 else float("nan")

    @property
    def ttft(self) -> float:
        """Time to first token, seconds: prefill (target and draft) plus the first round, which
        emits the first token(s). nan when no round ran."""
        return self.t_prefill + self.rounds[0].t_round if self.rounds else float("nan")

    @property
    def e2e_tokens_per_second(self) -> float:
        """Tokens per second of wall time including prefill (what a user waits for)."""
        return len(self.tokens) / self.t_total if self.t_total > 0 else float("nan")

    @property
    def mean_tokens_per_round(self) -> float:
        """Tokens kept per round, after the EOS / length cuts (``mean_acceptance_length`` is
        the same figure before the cuts)."""
        return len(self.tokens) / len(self.rounds) if self.rounds else float("nan")

    @property
    def mean_accepted_per_round(self) -> float:
        return float(np.mean([r.n_accepted for r in self.rounds])) if self.rounds else 0.0

    # -- the names other tools use (definitions: docs/metrics.md) ----------------------------
    @property
    def drafted_tokens(self) -> int:
        """Draft tokens proposed, summed over rounds (llama.cpp ``draft_n``)."""
        return sum(r.k for r in self.rounds)

    @property
    def accepted_tokens(self) -> int:
        """Draft tokens the verifier kept, summed over rounds (llama.cpp ``draft_n_accepted``)."""
        return sum(r.n_accepted for r in self.rounds)

    @property
    def draft_acceptance_rate(self) -> float:
        """accepted_tokens / drafted_tokens (vLLM's per-drafted-token rate; nan undrafted)."""
        drafted = self.drafted_tokens
        return self.accepted_tokens / drafted if drafted else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens the rounds produced per verification round, the bonus/correction token
        included: (accepted_tokens + rounds) / rounds, taken before the EOS / length / stop
        cuts (1.0 for plain decoding; nan without rounds)."""
        n = len(self.rounds)
        return (self.accepted_tokens + n) / n if n else float("nan")

    def accepted_length_histogram(self) -> list[int]:
        """Rounds by drafts accepted: entry j counts the rounds that kept exactly j drafts
        (j = 0..max K; a round then produced j + 1 tokens)."""
        hist = [0] * (max((r.k for r in self.rounds), default=0) + 1)
        for r in self.rounds:
            hist[r.n_accepted] += 1
        return hist

    def draft_length_histogram(self) -> list[int]:
        """Rounds by drafts proposed: entry j counts the rounds that verified exactly j drafts
        (j = 0..max K; 0 is a plain step)."""
        hist = [0] * (max((r.k for r in self.rounds), default=0) + 1)
        for r in self.rounds:
            hist[r.k] += 1
        return hist

    def acceptance_counts(self) -> tuple[list[int], list[int]]:
        """(reached[i], accepted[i]) for draft position i = 1..max K (0-based lists)."""
        kmax = max((r.k for r in self.rounds), default=0)
        reached, accepted = [0] * kmax, [0] * kmax
        for r in self.rounds:
            for i in range(min(r.k, r.n_accepted + 1)):
                reached[i] += 1
                accepted[i] += int(i < r.n_accepted)
        return reached, accepted

    def acceptance_by_position(self) -> list[float]:
        """P(accept draft i | drafts 1..i-1 accepted), i = 1..max K (nan when never reached)."""
        reached, accepted = self.acceptance_counts()
        return [a / n if n else float("nan") for a, n in zip(accepted, reached, strict=True)]

    def prediction_tokens(self, source: str = "prediction") -> tuple[int, int]:
        """(accepted, rejected) draft tokens of the rounds drafted from ``source`` (OpenAI's
        ``accepted_prediction_tokens`` / ``rejected_prediction_tokens``): accepted ones are in
        the output; rejected ones were proposed and are not (a verifier rejection, or cut by
        the end-of-sequence / length limit)."""
        accepted = rejected = 0
        for r in self.rounds:
            if r.source == source:
                kept = min(r.n_accepted, r.n_emitted)
                accepted += kept
                rejected += r.k - kept
        return accepted, rejected

    def time_split(self) -> dict[str, float]:
        """Seconds in prefill / draft / verify / sampling / other (sums to t_total)."""
        d = sum(r.t_draft for r in self.rounds)
        v = sum(r.t_verify for r in self.rounds)
        s = sum(r.t_sampling for r in self.rounds)
        other = self.t_total - self.t_prefill - d - v - s
        return {"prefill": self.t_prefill, "draft": d, "verify": v, "sampling": s, "other": other}

    def summary(self, label: str = "") -> str:
        """One line for people: tokens, time, TTFT, tok/s, rounds, acceptance by position,
        the prediction's counts, the numerics and draft window when they apply, time split."""
        split = self.time_split()
        total = sum(split.values()) or 1.0
        acc = " ".join("-" if a != a else f"{a:.2f}" for a in self.acceptance_by_position())
        parts = [
            f"{len(self.tokens)} tokens in {self.t_total:.2f} s",
            f"TTFT {self.ttft:.2f} s ({len(self.prompt_ids)}-token prompt)",
            f"{self.tokens_per_second:.2f} tok/s",
            f"{self.n_rounds} rounds, {self.mean_tokens_per_round:.2f} tokens/round",
        ]
        if acc:
            parts.append(f"acceptance by position {acc}")
        if "prediction_tokens" in self.extra:
            accepted, rejected = self.prediction_tokens()
            parts.append(f"prediction {accepted} accepted / {rejected} rejected")
        if self.extra.get("exact"):
            parts.append("exact numerics")
        if "draft_window" in self.extra:  # the draft's prefill (in TTFT) covers only the window
            parts.append(
                f"draft window {self.extra['draft_window']} ({self.extra['draft_rebases']} "
                "re-bases)"
            )
        parts.append(" ".join(f"{k} {100 * v / total:.0f}%" for k, v in split.items()))
        return f"[specdec{' ' + label if label else ''}] " + " | ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        if "prediction_tokens" in self.extra:  # a prediction was given (drafters.prediction)
            accepted, rejected = self.prediction_tokens()
            counts = {
                "accepted_prediction_tokens": accepted,
                "rejected_prediction_tokens": rejected,
            }
        return {
            "prompt_tokens": len(self.prompt_ids),
            "tokens": self.tokens,
            "n_tokens": len(self.tokens),
            "finish_reason": self.finish_reason,
            "drafter": self.drafter,
            "rounds": len(self.rounds),
            "tokens_per_second": self.tokens_per_second,
            "e2e_tokens_per_second": self.e2e_tokens_per_second,
            "mean_tokens_per_round": self.mean_tokens_per_round,
            "mean_accepted_per_round": self.mean_accepted_per_round,
            "acceptance_by_position": self.acceptance_by_position(),
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "verification_rounds": len(self.rounds),
            "draft_acceptance_rate": self.draft_acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "accepted_length_histogram": self.accepted_length_histogram(),
            "draft_length_histogram": self.draft_length_histogram(),
            "time_split": self.time_split(),
            "t_prefill": self.t_prefill,
            "ttft": self.ttft,
            "t_total": self.t_total,
            "round_stats": [r.stats() for r in self.rounds],
            **self.extra,
            **counts,
        }
