"""Level 3: a given draft/target/backend setup (any CausalLM pair, e.g. from load_model).

1. Batch-invariance probe of the target (``invariance.batch_invariance``) on its own prompts
   (disjoint from the greedy prompts when there are enough): how far its logits move between
   scoring n positions in one pass and one at a time, and whether truncate() is exact. A
   rollback error > 0 FAILS the level: the KV cache is wrong after a rejection.
2. Greedy agreement on each prompt between speculative decoding, plain decoding and the
   shape-matched plain baseline. Speculative vs shape-matched must agree bit for bit (same
   rows, same shapes). At a speculative vs plain divergence the target's row at that position
   is recomputed both ways — replaying the speculative rounds' pass shapes, and one token per
   pass — and the divergence is a "near-tie" only when (i) the replay reproduces it (each
   emitted token is the argmax of its own scoring: the decoder did exactly what its rows
   said) and (ii) the top-2 logit gap in both scorings is at most the tie threshold 2 x the
   probe's max logit difference, a measurement made on other prompts and positions (never
   the difference at the divergence itself, which would grow with the very error under test).
   Anything else is a "real bug".
3. Per-token test (``pertoken``, ``stats.pit``): independent speculative sequences, every emitted
   token turned into a randomised PIT value against (a) the shape-matched rows (the run's
   own verify passes, checked against its output and, on a subset, reproduced by a full
   replay: the clean test of the decoder, uniform under a correct walk whatever the
   backend's numerics) and (b) plain one-token-per-pass rows; uniformity tested with
   Anderson-Darling plus a binned chi-square (each at alpha / 2; (a) and (b) each their own
   family at alpha). The
   effect of batch-shape numerics on what users see is measured directly: the per-token TV
   between the (a) and (b) rows at the positions the sequences visit, with a 95 % interval
   over sequences. The verdict rule against plain decoding is fixed in advance: the upper
   bound of that interval must stay below ``plain_tv_threshold`` (0.02), else losslessness
   vs plain decoding FAILS with "batch-shape numerics" as the diagnosed cause.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from specdec.core.drafter import Drafter
from specdec.core.loop import as_drafter, generate
from specdec.core.model import CausalLM
from specdec.core.rows import rows_both_ways
from specdec.core.sampling import SamplingConfig
from specdec.drafters.prediction import PredictionDrafter
from specdec.stats.alternatives import PowerRow, power_table
from specdec.stats.intervals import sequence_mean_interval
from specdec.stats.thresholds import ALPHA, CONFIDENCE, N_BINS, PLAIN_TV_THRESHOLD, POWER
from specdec.stats.tv import softmax_tv_bound
from specdec.stats.uniformity import UniformityResult, uniformity_test

from .common import FAIL, PASS, WARN, first_difference, fmt, worst
from .invariance import InvarianceResult, batch_invariance
from .pertoken import SequenceScore, score_sequence
from .prefix_cache import PrefixReuseLM
from .progress import ProgressLog
from .seeds import SeedPlan
from .shape_matched import shape_matched_generate


@dataclass(frozen=True)
class Level3Config:
    k: int = 4
    greedy_prompts: int = 5
    greedy_max_new_tokens: int = 32
    probe_prompts: int = 3
    probe_ns: tuple[int, ...] = (2, 5, 9)
    sampled_prompts: int = 3
    seeds: int = 8  # independent speculative sequences per prompt (per-token test)
    sample_tokens: int = 32  # tokens per sequence (fewer at EOS)
    plain_seeds: int | None = None  # sequences per prompt also scored one token per pass
    plain_tv_threshold: float = PLAIN_TV_THRESHOLD
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    chunk: int = 4  # sequences per progress-log record
    alpha: float = ALPHA
    power: float = POWER
    power_trials: int = 200  # simulations per TV when the power is computed
    bins: int = N_BINS
    seed: int = 0

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)

    @property
    def n_plain(self) -> int:
        return self.seeds if self.plain_seeds is None else min(self.seeds, self.plain_seeds)


# ------------------------------------------------------------------ greedy
def top2_gap(row: torch.Tensor) -> float:
    """Largest minus second-largest logit of a row [V]."""
    top = torch.topk(row.double(), 2).values
    return float(top[0] - top[1])


@dataclass
class Divergence:
    index: int  # first generated position where the outputs differ
    spec_token: int | None
    plain_token: int | None
    gap_batched: float  # top-2 logit gap of the target row, speculative shapes
    gap_single: float  # same row, one token per pass
    argmax_batched: int
    argmax_single: int
    logit_diff: float  # max |batched - single| at this position (reported, not a tolerance)
    threshold: float  # 2 x the probe's max |diff| (an independent measurement)
    reproduced: bool  # the two scorings' argmaxes are the two emitted tokens
    cause: str  # "near-tie" | "real bug"


@dataclass
class GreedyPrompt:
    prompt: int
    n_tokens: int
    agree_plain: bool
    agree_shape_matched: bool
    divergence: Divergence | None = None
    seconds: float = 0.0


def classify_divergence(
    batched: torch.Tensor,
    single: torch.Tensor,
    spec_tokens: Sequence[int],
    plain_tokens: Sequence[int],
    index: int,
    tie_threshold: float,
) -> Divergence:
    """Name the cause of the first difference (at ``index``) between the speculative and the
    plain output (module docstring), from the target's row [V] at that position (the last
    one both outputs have, where one is a prefix of the other) computed both ways: ``batched``
    in the speculative run's shapes, ``single`` one token per pass
    (``core.rows.rows_both_ways``). ``tie_threshold`` must come from an independent
    measurement (the probe)."""
    diff = float((batched - single).abs().max())
    gb, gs = top2_gap(batched), top2_gap(single)
    st = spec_tokens[index] if index < len(spec_tokens) else None
    pt = plain_tokens[index] if index < len(plain_tokens) else None
    ab, as_ = int(torch.argmax(batched)), int(torch.argmax(single))
    reproduced = ab == st and as_ == pt
    # both gaps, each on its own (max() drops a NaN that comes second), finite, and a finite
    # threshold: a row with NaN or inf logits is a bug, not a near-tie
    gaps_ok = all(math.isfinite(g) and g <= tie_threshold for g in (gb, gs))
    tie = reproduced and gaps_ok and math.isfinite(tie_threshold)
    return Divergence(
        index=index,
        spec_token=st,
        plain_token=pt,
        gap_batched=gb,
        gap_single=gs,
        argmax_batched=ab,
        argmax_single=as_,
        logit_diff=diff,
        threshold=tie_threshold,
        reproduced=reproduced,
        cause="near-tie" if tie else "real bug",
    )


def greedy_prompt(
    target: CausalLM,
    draft: CausalLM | Drafter,
    prompt: Sequence[int],
    cfg: Level3Config,
    tie_threshold: float,
    index: int,
) -> GreedyPrompt:
    t0 = time.perf_counter()
    greedy = SamplingConfig()
    n = cfg.greedy_max_new_tokens
    plain = generate(target, None, prompt, max_new_tokens=n, k=0, sampling=greedy)
    spec = generate(target, draft, prompt, max_new_tokens=n, k=cfg.k, sampling=greedy)
    shaped, _ = shape_matched_generate(
        target, draft, prompt, max_new_tokens=n, k=cfg.k, sampling=greedy, seed=0
    )
    i = first_difference(spec.tokens, plain.tokens)
    div = None
    if i is not None:  # the model work (the row both ways), then the verdict on those rows
        # the position itself, or where one output is a prefix of the other (a stop at EOS
        # in one of them only) the last position both have
        at = min(i, len(spec.tokens) - 1, len(plain.tokens) - 1)
        rows = rows_both_ways(target, prompt, spec.tokens, spec.rounds, at)
        div = classify_divergence(*rows, spec.tokens, plain.tokens, i, tie_threshold)
    return GreedyPrompt(
        prompt=index,
        n_tokens=len(spec.tokens),
        agree_plain=i is None,
        agree_shape_matched=spec.tokens == shaped,
        divergence=div,
        seconds=time.perf_counter() - t0,
    )


# ------------------------------------------------------------------ per-token
@dataclass
class PerTokenResult:
    """The per-token test over all prompts (see the module docstring)."""

    n_sequences: int
    n_tokens: int
    shape_matched: UniformityResult  # reference (a)
    plain: UniformityResult | None  # reference (b)
    n_plain_sequences: int
    tv_plain: float  # mean per-token TV(replay row, plain row) over the scored sequences
    tv_plain_low: float  # 95 % Student-t interval over sequences
    tv_plain_high: float
    tv_threshold: float
    power_shape_matched: list[PowerRow]  # (b) is judged by its measured effect instead
    order: str  # the token order of the PIT
    mean_tokens_per_round: float
    inconsistent_sequences: int = 0  # a verify pass was not the one the output implies
    replay_max_abs: float = 0.0  # max |full replay - recorded rows| over replayed sequences
    n_replayed: int = 0

    @property
    def reference_broken(self) -> bool:
        """The run's passes do not match its output, or the replay does not reproduce them:
        the decoder fed the target something else than it claims (or the backend is not
        deterministic), so reference (a) is not the rows that produced the tokens."""
        return self.inconsistent_sequences > 0 or self.replay_max_abs != 0  # NaN: broken

    @property
    def decoder_rejected(self) -> bool:
        return self.shape_matched.rejected or self.reference_broken

    @property
    def plain_rejected(self) -> bool:
        return self.plain is not None and self.plain.rejected

    @property
    def plain_effect_too_large(self) -> bool:
        """The verdict rule against plain decoding (fixed in advance): FAIL when the upper
        95 % bound of the measured per-token TV is not below the threshold."""
        return not (self.tv_plain_high < self.tv_threshold) if self.plain is not None else False

    @staticmethod
    def worst_power(rows: Sequence[PowerRow]) -> float:
        v = [r.min_detectable_tv for r in rows]
        return max(v) if v and all(math.isfinite(x) for x in v) else math.nan

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape_matched"] = self.shape_matched.to_dict()
        d["plain"] = self.plain.to_dict() if self.plain else None
        d.update(
            decoder_rejected=self.decoder_rejected,
            reference_broken=self.reference_broken,
            plain_rejected=self.plain_rejected,
            plain_effect_too_large=self.plain_effect_too_large,
            min_detectable_tv_shape_matched=self.worst_power(self.power_shape_matched),
        )
        return d


def summarize_scores(
    scores: Sequence[SequenceScore], cfg: Level3Config, order: str, seeds: SeedPlan
) -> PerTokenResult:
    """Pool the sequences' PIT values (i.i.d. U(0, 1) under the null) and test them; the
    power simulation draws from ``seeds``' stream "l3/power"."""
    u_a = np.array([u for s in scores for u in s.u_shape_matched], dtype=np.float64)
    plain = [s for s in scores if s.u_plain is not None]
    u_b = np.array([u for s in plain for u in (s.u_plain or [])], dtype=np.float64)
    test_a = uniformity_test(u_a, cfg.alpha, cfg.bins)
    test_b = uniformity_test(u_b, cfg.alpha, cfg.bins) if plain else None
    tv = sequence_mean_interval([s.tv_plain for s in plain if s.tv_plain is not None], CONFIDENCE)
    rng = seeds.rng("l3", "power")

    def power(n: int) -> list[PowerRow]:
        return power_table(n, cfg.alpha, cfg.power, cfg.power_trials, rng, cfg.bins)

    rounds = sum(s.n_rounds for s in scores)
    replayed = [s.replay_max_abs for s in scores if s.replay_max_abs is not None]
    return PerTokenResult(
        n_sequences=len(scores),
        n_tokens=int(u_a.shape[0]),
        shape_matched=test_a,
        plain=test_b,
        n_plain_sequences=len(plain),
        tv_plain=tv[0],
        tv_plain_low=tv[1],
        tv_plain_high=tv[2],
        tv_threshold=cfg.plain_tv_threshold,
        power_shape_matched=power(test_a.n),
        order=order,
        mean_tokens_per_round=float(u_a.shape[0] / rounds) if rounds else math.nan,
        inconsistent_sequences=sum(not s.consistent for s in scores),
        replay_max_abs=worst(replayed),
        n_replayed=len(replayed),
    )


# ------------------------------------------------------------------ level
@dataclass
class Level3Result:
    config: Level3Config
    draft_label: str
    target_label: str
    probe: InvarianceResult | None = None
    greedy: list[GreedyPrompt] = field(default_factory=list)
    pertoken: PerTokenResult | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    probe_overlaps_greedy: bool = False

    @property
    def real_bugs(self) -> list[GreedyPrompt]:
        return [
            g
            for g in self.greedy
            if not g.agree_shape_matched
            or (g.divergence is not None and g.divergence.cause == "real bug")
        ]

    @property
    def near_ties(self) -> list[GreedyPrompt]:
        return [
            g for g in self.greedy if g.divergence is not None and g.divergence.cause == "near-tie"
        ]

    @property
    def batch_invariant(self) -> bool:
        return self.probe is not None and self.probe.batch_invariant

    @property
    def rollback_broken(self) -> bool:
        return self.probe is not None and self.probe.rollback_max_abs != 0  # NaN: broken

    @property
    def tie_threshold(self) -> float:
        """2 x the probe's max logit difference (0 without a probe: every flip is a bug)."""
        return self.probe.tie_threshold if self.probe is not None else 0.0

    @property
    def status(self) -> str:
        """fail: rollback not exact, a real greedy bug, a per-token rejection against the
        shape-matched replay, or a measured effect vs plain decoding at or above the
        threshold; warn: outputs differ from plain decoding by a measured amount below the
        threshold (a rejected per-token test vs plain, or greedy near-ties); else pass."""
        pt = self.pertoken
        if self.rollback_broken or self.real_bugs:
            return FAIL
        if pt is not None and (pt.decoder_rejected or pt.plain_effect_too_large):
            return FAIL
        if self.near_ties or (pt is not None and pt.plain_rejected):
            return WARN
        return PASS

    def probe_tv_bound_sentence(self) -> str:
        """What the probe's max logit difference implies for the per-token TV between pass
        shapes at the sampling settings (a cross-check of the measured effect, never an
        excuse: logits move by eps, probabilities by eps / T; no bound under truncation)."""
        c = self.config
        if self.probe is None:
            return ""
        if c.top_k > 0 or c.top_p < 1.0:
            return (
                "Under top-k / top-p truncation the probe's logit difference bounds nothing "
                "(a token can cross the cut): only the measured effect counts."
            )
        bound = softmax_tv_bound(self.probe.max_abs, 1, temperature=c.temperature)
        return (
            f"At T = {c.temperature:g} that difference bounds the per-token TV between pass "
            f"shapes by {bound:.3g} (1 - exp(-2 eps / T)) at the probed positions."
        )

    def notes(self) -> list[str]:
        """Why the status is what it is, in words (empty for a clean pass)."""
        out = []
        if self.rollback_broken:
            assert self.probe is not None
            out.append(
                f"Rollback is not exact: rescoring a token after truncate() moved its logits "
                f"by {self.probe.rollback_max_abs:.3g} (must be 0). The cache is wrong after "
                "every rejected draft: a backend bug."
            )
        if self.real_bugs:
            out.append(
                f"{len(self.real_bugs)} greedy divergence(s) are not explained by batch "
                "variance (speculative output differs from the shape-matched baseline, the "
                "replay does not reproduce the flip, or the top-2 gap exceeds the near-tie "
                f"threshold {self.tie_threshold:.3g} measured by the probe): a decoder bug."
            )
        pt = self.pertoken
        if pt is not None and pt.reference_broken:
            out.append(
                f"The speculative run's verify passes are not the ones its output implies "
                f"({pt.inconsistent_sequences} sequence(s) with a pass at the wrong cache "
                "position, with other tokens or of another size), or the shape-matched replay "
                f"does not reproduce them (max logit difference {pt.replay_max_abs:.3g} over "
                f"{pt.n_replayed} replayed sequences; must be 0): a decoder bug, or a backend "
                "that is not deterministic."
            )
        if pt is not None and pt.shape_matched.rejected:
            out.append(
                "Per-token test against the shape-matched replay REJECTED (p = "
                f"{fmt(pt.shape_matched.pvalue)}; {pt.shape_matched.impossible} tokens "
                "impossible under their rows): the speculative tokens are not distributed as "
                "the target rows of the passes that produced them. A decoder bug (no backend "
                "numerics can cause this: the reference has the same pass shapes)."
            )
        if pt is not None and pt.plain is not None:
            effect = (
                f"measured per-token TV between the rows of the speculative passes and plain "
                f"decoding's one-token rows: {fmt(pt.tv_plain)} (95 % interval "
                f"[{fmt(pt.tv_plain_low)}, {fmt(pt.tv_plain_high)}] over "
                f"{pt.n_plain_sequences} sequences), threshold {pt.tv_threshold:g} fixed in "
                "advance"
            )
            if pt.plain_effect_too_large:
                out.append(
                    "Losslessness vs plain decoding FAILS: " + effect + ". Diagnosed cause: "
                    "batch-shape numerics (the target's rows in multi-token passes differ from "
                    "its one-token rows enough to move outputs beyond the threshold)."
                )
            elif pt.plain_rejected:
                out.append(
                    "Outputs differ from plain decoding (per-token test vs plain rows p = "
                    f"{fmt(pt.plain.pvalue)}), by a small measured amount: " + effect + ". "
                    "Cause: batch-shape numerics (the test against the shape-matched replay "
                    "passes)."
                )
        if self.near_ties:
            out.append(
                f"{len(self.near_ties)} greedy output(s) differ from plain decoding at a "
                "near-tie that the replay reproduces (batch-shape numerics flip the argmax)."
            )
        return out

    def summary(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "status": self.status,
            "draft": self.draft_label,
            "target": self.target_label,
            "k": self.config.k,
            "greedy_prompts": len(self.greedy),
            "greedy_agree_plain": sum(g.agree_plain for g in self.greedy),
            "greedy_agree_shape_matched": sum(g.agree_shape_matched for g in self.greedy),
            "greedy_near_ties": len(self.near_ties),
            "greedy_real_bugs": len(self.real_bugs),
            "tie_threshold": self.tie_threshold,
            "notes": self.notes(),
            "seconds": self.seconds,
        }
        if self.probe is not None:
            d["invariance_max_abs"] = self.probe.max_abs
            d["invariance_argmax_flips"] = self.probe.argmax_flips
            d["invariance_row_offset_max_abs"] = self.probe.row_offset_max_abs
            d["rollback_max_abs"] = self.probe.rollback_max_abs
        pt = self.pertoken
        if pt is not None:
            d["pertoken"] = {
                "sequences": pt.n_sequences,
                "tokens": pt.n_tokens,
                "shape_matched_p": pt.shape_matched.pvalue,
                "shape_matched_rejected": pt.decoder_rejected,
                "reference_broken": pt.reference_broken,
                "replay_max_abs": pt.replay_max_abs,
                "min_detectable_tv_shape_matched": pt.worst_power(pt.power_shape_matched),
                "plain_p": pt.plain.pvalue if pt.plain else None,
                "plain_rejected": pt.plain_rejected,
                "tv_plain": pt.tv_plain,
                "tv_plain_high": pt.tv_plain_high,
                "tv_threshold": pt.tv_threshold,
                "plain_effect_too_large": pt.plain_effect_too_large,
            }
        return d

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "config": asdict(self.config),
            "probe": self.probe.to_dict() if self.probe else None,
            "probe_overlaps_greedy": self.probe_overlaps_greedy,
            "greedy": [asdict(g) for g in self.greedy],
            "pertoken": self.pertoken.to_dict() if self.pertoken else None,
        }

    def shown(self) -> list[str]:
        lines = []
        if self.probe is not None:
            p = self.probe
            lines.append(
                f"Batch invariance of the target: max |logit diff| {p.max_abs:.3g} between one "
                f"pass of n in {p.ns} tokens and one token per pass ({p.argmax_flips} argmax "
                f"flips) on {p.n_prompts} prompt(s)"
                + (" (shared with the greedy prompts)" if self.probe_overlaps_greedy else "")
                + f"; near-tie threshold {p.tie_threshold:.3g}; rollback error "
                f"{p.rollback_max_abs:.2g} (must be 0). " + self.probe_tv_bound_sentence()
            )
        if self.greedy:
            n = len(self.greedy)
            ag = sum(g.agree_plain for g in self.greedy)
            sm = sum(g.agree_shape_matched for g in self.greedy)
            text = (
                f"Greedy agreement with plain decoding on {ag}/{n} prompts "
                f"({self.config.greedy_max_new_tokens} tokens, K = {self.config.k}); "
                f"bit-identical to the shape-matched baseline on {sm}/{n}."
            )
            for g in self.greedy:
                dv = g.divergence
                if dv is not None:
                    text += (
                        f" Prompt {g.prompt} diverges at token {dv.index}: a {dv.cause} (top-2 "
                        f"gap {dv.gap_batched:.3g} batched / {dv.gap_single:.3g} one-at-a-time "
                        f"vs threshold {dv.threshold:.3g}; "
                        + ("flip reproduced by the replay" if dv.reproduced else "NOT reproduced")
                        + ")."
                    )
            lines.append(text)
        pt = self.pertoken
        if pt is not None:
            c = self.config
            lines.append(
                "Per-token design (fixed before running): unit = one independent speculative "
                f"sequence (own seed) of up to {c.sample_tokens} tokens, {c.seeds} per prompt "
                f"on {c.sampled_prompts} prompt(s); every token x_t becomes U_t = F_t(x_t-) + "
                "V_t P_t(x_t) with P_t the reference row, tokens ordered by "
                f"{pt.order}, V_t from a separate generator; under the null the U_t are "
                "i.i.d. U(0, 1). Test: Anderson-Darling and a chi-square in "
                f"{c.bins} bins, each at {c.alpha / 2:g} (family-wise alpha {c.alpha:g} per "
                f"reference). T = {c.temperature:g}, top-k {c.top_k}, top-p {c.top_p:g}, "
                f"K = {c.k}."
            )
            a = pt.shape_matched
            lines.append(
                "(a) vs the rows of the run's own passes "
                f"({pt.n_sequences - pt.inconsistent_sequences}/{pt.n_sequences} sequences' "
                "passes match their "
                f"output; the full shape-matched replay of {pt.n_replayed} sequences "
                f"reproduces them to {pt.replay_max_abs:.2g}): {pt.n_tokens} tokens "
                f"({pt.mean_tokens_per_round:.2f} per round); AD p = {fmt(a.ad_pvalue)}, "
                f"chi-square p = {fmt(a.chi2_pvalue)}: "
                + ("REJECTED" if a.rejected else "not rejected")
                + f" at {c.alpha:g}. Power (simulated, {c.power_trials} trials per TV): a "
                "per-token TV present at every token is detected with 80 % probability from "
                + ", ".join(
                    f"{fmt(r.min_detectable_tv)} ({r.alternative})" for r in pt.power_shape_matched
                )
                + "."
            )
            if pt.plain is not None:
                b = pt.plain
                lines.append(
                    f"(b) vs plain one-token-per-pass rows: {b.n} tokens from "
                    f"{pt.n_plain_sequences} sequences; AD p = {fmt(b.ad_pvalue)}, chi-square "
                    f"p = {fmt(b.chi2_pvalue)}: "
                    + ("REJECTED" if b.rejected else "not rejected")
                    + f". Measured effect of the backend's batch-shape numerics: per-token TV "
                    f"{fmt(pt.tv_plain)} (95 % interval [{fmt(pt.tv_plain_low)}, "
                    f"{fmt(pt.tv_plain_high)}]); rule fixed in advance: the upper bound must "
                    f"be below {pt.tv_threshold:g}, else losslessness vs plain decoding FAILS."
                )
        return lines


def _probe_prompts(
    prompts: Sequence[Sequence[int]], cfg: Level3Config
) -> tuple[list[Sequence[int]], bool]:
    """The probe's prompts: the last ones when there are enough to keep them apart from the
    greedy prompts (so the near-tie threshold is measured independently), else the first."""
    n = min(cfg.probe_prompts, len(prompts))
    if len(prompts) >= cfg.greedy_prompts + n:
        return list(prompts[len(prompts) - n :]), False
    return list(prompts[:n]), True


def run_level3(
    draft: CausalLM | Drafter,
    target: CausalLM,
    prompts: Sequence[Sequence[int]],
    cfg: Level3Config,
    *,
    draft_label: str = "draft",
    target_label: str = "target",
    log: ProgressLog | None = None,
    parts: Sequence[str] = ("probe", "greedy", "pertoken"),
    progress: Callable[[str], None] | None = None,
    predictions: Sequence[Sequence[int] | None] | None = None,
) -> Level3Result:
    """Run the parts of Level 3 on a model pair (prompts as token ids); ``progress``
    receives a one-line message after each completed unit. ``predictions`` (token ids per
    prompt, None where a prompt has none): each generation of that prompt drafts its
    prediction in front of the draft (``drafters.prediction``; a fresh drafter each)."""
    say = progress or (lambda _msg: None)
    res = Level3Result(cfg, draft_label, target_label)
    log = ProgressLog.memory() if log is None else log
    seeds = SeedPlan(cfg.seed)
    if "probe" in parts:
        t0 = time.perf_counter()
        probe_ids, res.probe_overlaps_greedy = _probe_prompts(prompts, cfg)
        res.probe = batch_invariance(target, probe_ids, ns=cfg.probe_ns, label=target_label)
        res.seconds["probe"] = time.perf_counter() - t0
        say(f"probe: max |logit diff| {res.probe.max_abs:.3g} ({res.seconds['probe']:.0f} s)")
    # from here on the models are only used through the wrappers (the probe used them bare)
    d: CausalLM | Drafter = PrefixReuseLM(draft) if isinstance(draft, CausalLM) else draft
    t = PrefixReuseLM(target)

    def drafter(i: int) -> CausalLM | Drafter:
        predicted = predictions[i] if predictions is not None and i < len(predictions) else None
        if predicted is None:
            return d
        return PredictionDrafter(predicted, costs=None, fallback=as_drafter(d, t))

    if "greedy" in parts:
        t0 = time.perf_counter()
        n_greedy = min(len(prompts), cfg.greedy_prompts)

        def greedy_unit(i: int, ids: Sequence[int]) -> GreedyPrompt:
            g = greedy_prompt(t, drafter(i), ids, cfg, res.tie_threshold, i)
            what = "agrees" if g.divergence is None else f"diverges ({g.divergence.cause})"
            say(f"greedy prompt {i + 1}/{n_greedy}: {what} ({g.seconds:.0f} s)")
            return g

        for i, ids in enumerate(prompts[: cfg.greedy_prompts]):
            compute = partial(greedy_unit, i, ids)
            res.greedy.append(log.unit(f"l3/greedy/{i}", compute, GreedyPrompt))
        res.seconds["greedy"] = time.perf_counter() - t0
    if "pertoken" in parts:
        t0 = time.perf_counter()
        order_model: CausalLM | None = d if isinstance(d, CausalLM) else None
        inner = getattr(draft, "model", None)
        if order_model is None and isinstance(inner, CausalLM):
            order_model = inner
        order = "draft row / target row (q / P)" if order_model is not None else "-P"
        n_prompts = min(len(prompts), cfg.sampled_prompts)

        def pertoken_chunk(i: int, ids: Sequence[int], c0: int) -> list[SequenceScore]:
            done = [
                score_sequence(
                    t,
                    drafter(i),
                    order_model,
                    ids,
                    k=cfg.k,
                    max_new_tokens=cfg.sample_tokens,
                    sampling=cfg.sampling,
                    seed=seeds.seed("l3", "spec", i, s),
                    pit_generator=seeds.generator("l3", "pit", i, s),
                    with_plain=s < cfg.n_plain,
                )
                for s in range(c0, min(cfg.seeds, c0 + cfg.chunk))
            ]
            say(
                f"per-token prompt {i + 1}/{n_prompts}: {c0 + len(done)}/{cfg.seeds} sequences "
                f"({time.perf_counter() - t0:.0f} s)"
            )
            return done

        scores = [
            score
            for i, ids in enumerate(prompts[:n_prompts])
            for c0 in range(0, cfg.seeds, cfg.chunk)
            for score in log.units(
                f"l3/pertoken/{i}/{c0}", partial(pertoken_chunk, i, ids, c0), SequenceScore
            )
        ]
        res.pertoken = summarize_scores(scores, cfg, order, seeds)
        res.seconds["pertoken"] = time.perf_counter() - t0
    return res
