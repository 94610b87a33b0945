"""``specdec certify --endpoint``: is a server's output unchanged by its speculation?

Two parts, both comparing the spec-on side with the spec-off side (one server with the
per-request switch, or two servers):

1. **Greedy agreement.** Each prompt once per side at temperature 0; the texts must be equal.
   At the first divergence the text around it is shown, and, where the server returns
   logprobs, the tokens and the log-probability gap between the two competing tokens in the
   rows each side reported. A divergence is a near-tie (a caveat, not a failure) only when
   both gaps are at most ``tie_gap`` nats, a threshold fixed before the run; anything else
   (also any divergence on a server without logprobs) FAILS.
2. **Sampled two-sample tests.** For each prompt, ``samples`` independent requests per side at
   the plan's temperature, each with its own seed (the spec-on and spec-off seeds are
   disjoint, so the two samples are independent). The unit is one request: tokens within a
   completion are dependent, completions are not, so the null of the test holds whatever the
   dependence inside a sequence. Fixed statistics of each completion (its first, second
   and third pieces, a piece being a word or one other non-space character, and its whole
   text) are compared by a chi-square test of homogeneity per
   prompt (rare values pooled by column totals), summed over prompts, Holm over the four
   statistics at family-wise ``alpha``. Power: the smallest TV (on the pooled categories,
   present in every prompt) each statistic detects with 80 % probability, analytically and
   re-checked by a seeded simulation on the observed spec-off frequencies.
3. **Per-token test** (``specdec.endpoint.pertoken``), where both servers speak token ids
   (vLLM): every token of every spec-on sample scored against the spec-off server's row at
   its position; a fifth member of the Holm family.

The requests are made by ``specdec.endpoint.certify_run`` (resumable, both servers at once);
the certificate's markdown by ``specdec.endpoint.certify_report``. What a remote test cannot
show is written into the certificate (``LIMITS``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from specdec.bounds import check_range, check_scale
from specdec.certify.common import first_difference
from specdec.certify.stats.chisquare import (
    ChiSquareResult,
    chisquare_homogeneity,
    combined_homogeneity,
)
from specdec.certify.stats.multiple import holm_adjust
from specdec.certify.stats.power import min_detectable_tv_combined
from specdec.certify.stats.simulated import simulated_power_combined
from specdec.endpoint.capacity import MAX_CONCURRENCY
from specdec.endpoint.client import Reply
from specdec.endpoint.pertoken import DEFAULT_TOP, PerTokenResult
from specdec.errors import ConfigError
from specdec.jsonable import json_ready

PASS, WARN, FAIL = "pass", "warn", "fail"
QUICK_SAMPLES = 150  # per prompt and side, at most (the time budget may lower it)
QUICK_SECONDS = 300.0
VERDICT = {PASS: "PASS", WARN: "PASS WITH CAVEATS", FAIL: "FAIL"}
STATISTICS = ("piece 1", "piece 2", "piece 3", "text")
NONE = "<none>"
_PIECE = re.compile(r"\w+|[^\w\s]")  # a word, or one other non-space character

LIMITS = (
    "The reference is the spec-off side, not the model: a fault shared by both sides (the "
    "same wrong sampler, a wrong model file) is invisible here.",
    "Only the text the server returns is tested: the sampled tests see four statistics of "
    "short completions (pieces 1-3 and the whole text); a difference confined to later "
    "tokens or to rare tokens pooled into one category is not seen, and the stated power is "
    "for differences on the pooled categories.",
    "Logprobs, where a server returns them, are its top-N rows only (OpenAI's API allows at "
    "most 20): a near-tie can be recognised only when both competing tokens are among them.",
    "The per-token test runs only where the spec-on server returns token ids and the spec-off "
    "server scores a token-id prompt with prompt_logprobs (vLLM); a text API alone gives no "
    "ids that line up (re-tokenising a completion can split it differently). It sees the "
    "spec-off rows' top N tokens and one category for the rest of the vocabulary.",
    "Numerics that depend on what else the server is running (batch composition in vLLM and "
    "llama-server with several slots) change outputs; run on an otherwise idle server and "
    "read a greedy near-tie as such an effect only within the stated gap.",
    "Seeds are assumed to give independent streams (a server that ignores them still gives "
    "independent samples); the greedy part assumes temperature 0 means argmax on both sides.",
)


@dataclass(frozen=True)
class EndpointCertifyPlan:
    prompts: tuple[str, ...]
    greedy_prompts: int = 8
    greedy_tokens: int = 64
    sampled_prompts: int = 4
    samples: int = 250  # independent requests per prompt and side
    sample_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    alpha: float = 0.01
    tie_gap: float = 0.1  # nats
    top_logprobs: int = 5
    seed: int = 0
    power: float = 0.8
    power_trials: int = 200
    concurrency: int = 1  # requests in flight per server
    pertoken: bool = True  # where the servers allow it (and the sampling is T = 1, no cut-off)
    pertoken_top: int = DEFAULT_TOP
    # a time budget for the whole run: a pilot (not part of the tests) times the requests,
    # then ``samples`` is lowered to what fits, but not below ``min_samples``
    max_seconds: float | None = None
    min_samples: int = 30

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ConfigError("no prompts")
        if self.greedy_prompts < 0 or self.sampled_prompts < 0:
            raise ConfigError("prompt counts must be >= 0")
        if self.greedy_prompts == 0 and self.sampled_prompts == 0:
            raise ConfigError("nothing to test: no greedy and no sampled prompts")
        if self.sampled_prompts and self.samples < 2:
            raise ConfigError(f"samples must be >= 2 per prompt and side, got {self.samples}")
        if self.greedy_tokens < 1 or self.sample_tokens < 1:
            raise ConfigError("token counts must be >= 1")
        if not self.temperature > 0:
            raise ConfigError("the sampled tests need a temperature > 0")
        if not 0 < self.alpha < 0.5:
            raise ConfigError(f"alpha must be in (0, 0.5), got {self.alpha}")
        if not (math.isfinite(self.tie_gap) and self.tie_gap >= 0):
            raise ConfigError(f"tie gap must be finite and >= 0, got {self.tie_gap}")
        check_range(self.concurrency, "concurrency", 1, MAX_CONCURRENCY)
        if not 1 <= self.top_logprobs <= 20:
            raise ConfigError(f"top logprobs must be in 1..20, got {self.top_logprobs}")
        if self.pertoken_top < 1:
            raise ConfigError(f"per-token top N must be >= 1, got {self.pertoken_top}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ConfigError(f"the time budget must be > 0 seconds, got {self.max_seconds}")
        if self.min_samples < 2:
            raise ConfigError(f"min samples must be >= 2, got {self.min_samples}")

    @property
    def pertoken_sampling(self) -> bool:
        """Whether the sampling is the model's raw distribution (what the rows describe)."""
        return self.temperature == 1.0 and self.top_p >= 1.0 and self.top_k <= 0

    def greedy_texts(self) -> list[str]:
        return [self.prompts[i % len(self.prompts)] for i in range(self.greedy_prompts)]

    def sampled_texts(self) -> list[str]:
        return [self.prompts[i % len(self.prompts)] for i in range(self.sampled_prompts)]


def make_plan(
    prompts: Sequence[str], *, quick: bool, scale: float = 1.0, **overrides: Any
) -> EndpointCertifyPlan:
    """The quick or the full plan; ``overrides`` that are not None replace plan fields;
    ``scale`` multiplies the sample count. Quick is a 5-minute certificate: as many sampled
    requests (up to 150 per prompt and side, at least 30) as a pilot says fit in 5 minutes."""
    base: dict[str, Any] = (
        {
            "greedy_prompts": 2,
            "greedy_tokens": 32,
            "sampled_prompts": 2,
            "samples": QUICK_SAMPLES,
            "sample_tokens": 8,
            "max_seconds": QUICK_SECONDS,
        }
        if quick
        else {}
    )
    base.update({k: v for k, v in overrides.items() if v is not None})
    check_scale(scale)  # finite: inf or 1e300 would overflow the sample count
    if base.get("max_seconds") == 0:  # no time budget
        base["max_seconds"] = None
    if scale != 1.0:
        n = base.get("samples", EndpointCertifyPlan.samples)
        base["samples"] = max(2, round(n * scale))
    return EndpointCertifyPlan(prompts=tuple(prompts), **base)


# -- greedy ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GreedyCase:
    prompt: str
    status: str  # "identical" | "near-tie" | "differs"
    on_text: str
    off_text: str
    char_index: int | None = None
    context: str | None = None  # the common text just before the divergence
    on_next: str | None = None
    off_next: str | None = None
    token_index: int | None = None
    on_tokens: tuple[str, ...] | None = None  # a window around the divergence
    off_tokens: tuple[str, ...] | None = None
    gap_on: float | None = None  # nats, in the spec-on side's row
    gap_off: float | None = None
    reason: str = ""
    # where a gap came from: "reported" (the row the side returned with its output), or
    # "follow-up" (a second request for that position's row: the side returned none there)
    gap_on_source: str | None = None
    gap_off_source: str | None = None


def _gap(row: Mapping[str, float] | None, mine: str, other: str) -> float | None:
    """``row[mine] - row[other]`` (signed), None when the row lacks either token."""
    if row is None or mine not in row or other not in row:
        return None
    return float(row[mine] - row[other])


def _not_greedy(row: Mapping[str, float], mine: str) -> float | None:
    """How many nats the row's best token scores above ``mine``, the token the side chose at
    temperature 0 (None when ``mine`` is the best or ties it). Positive means the side did not
    pick its own argmax: not a near-tie, whatever the other side's gap."""
    lead = max(row.values()) - row[mine]
    return lead if lead > 0 or math.isnan(lead) else None


def _follow_up_gap(row: Mapping[str, float] | None, mine: str, other: str) -> float | None:
    """The gap in a row fetched by a second request (another pass than the one that chose):
    how far the lower of the two competing tokens is below the row's best token. When one of
    them is the best, that is |row[mine] - row[other]|; when a third token leads both, the
    two are not the contest at that position and the gap is the distance to it."""
    if row is None or mine not in row or other not in row:
        return None
    return float(max(row.values()) - min(row[mine], row[other]))


def compare_greedy(
    prompt: str,
    on: Reply,
    off: Reply,
    tie_gap: float,
    follow_up: tuple[Mapping[str, float] | None, Mapping[str, float] | None] = (None, None),
) -> GreedyCase:
    """Compare one prompt's greedy outputs.

    A divergence at token j is a near-tie only when, for each side, the row it reported with
    its output scores its own choice as the best token (it chose its argmax: a side whose row
    puts the other token above its choice made a non-greedy choice, a FAIL) ahead of the other
    side's choice by at most ``tie_gap`` nats (the signed gap, >= 0). ``follow_up`` holds rows
    for the divergence position fetched by a second request (spec-on, spec-off), used for a
    side whose own row lacks a competing token; such a row comes from another pass, so the
    chosen token may trail there, and its gap is ``_follow_up_gap``. Every gap must be a
    finite number."""
    d = first_difference(on.text, off.text)
    if d is None:
        return GreedyCase(prompt, "identical", on.text, off.text)
    case: dict[str, Any] = {
        "char_index": d,
        "context": on.text[max(0, d - 60) : d],
        "on_next": on.text[d : d + 30],
        "off_next": off.text[d : d + 30],
    }
    if on.tokens is None or off.tokens is None:
        reason = (
            "the server returns no logprobs, so a near-tie cannot be told from a real difference"
        )
        return GreedyCase(prompt, "differs", on.text, off.text, reason=reason, **case)
    j = first_difference(on.tokens, off.tokens)
    if j is None:  # same tokens, different text (should not happen): report as is
        return GreedyCase(prompt, "differs", on.text, off.text, reason="same tokens", **case)
    lo = max(0, j - 3)
    case |= {
        "token_index": j,
        "on_tokens": on.tokens[lo : j + 3],
        "off_tokens": off.tokens[lo : j + 3],
    }
    if j >= len(on.tokens) or j >= len(off.tokens):
        reason = "one side stopped where the other went on"
        return GreedyCase(prompt, "differs", on.text, off.text, reason=reason, **case)
    t_on, t_off = on.tokens[j], off.tokens[j]
    row_on = on.top_logprobs[j] if on.top_logprobs and j < len(on.top_logprobs) else None
    row_off = off.top_logprobs[j] if off.top_logprobs and j < len(off.top_logprobs) else None
    gap_on, gap_off = _gap(row_on, t_on, t_off), _gap(row_off, t_off, t_on)
    src_on = src_off = "reported"
    # a side whose own row says it did not choose its best token: not greedy, never a tie
    for side, row, mine in (("spec-on", row_on, t_on), ("spec-off", row_off, t_off)):
        lead = _not_greedy(row, mine) if row and mine in row else None
        if lead is not None:
            case |= {"gap_on": gap_on, "gap_off": gap_off}
            case |= {"gap_on_source": "reported" if gap_on is not None else None}
            case |= {"gap_off_source": "reported" if gap_off is not None else None}
            reason = (
                f"the {side} side chose {mine!r} at temperature 0 though its own row scores "
                f"another token {lead:.3g} nats higher: not its argmax, so not a near-tie"
            )
            return GreedyCase(prompt, "differs", on.text, off.text, reason=reason, **case)
    if gap_on is None and (g := _follow_up_gap(follow_up[0], t_on, t_off)) is not None:
        gap_on, src_on = g, "follow-up"
    if gap_off is None and (g := _follow_up_gap(follow_up[1], t_off, t_on)) is not None:
        gap_off, src_off = g, "follow-up"
    case |= {"gap_on": gap_on, "gap_off": gap_off}
    case |= {"gap_on_source": src_on if gap_on is not None else None}
    case |= {"gap_off_source": src_off if gap_off is not None else None}
    if gap_on is None or gap_off is None:
        reason = "a competing token is not among the returned top logprobs"
        return GreedyCase(prompt, "differs", on.text, off.text, reason=reason, **case)
    gaps = (gap_on, gap_off)
    if all(math.isfinite(g) and 0 <= g <= tie_gap for g in gaps) and math.isfinite(tie_gap):
        reason = f"both gaps <= {tie_gap:g} nats" + (
            " (a gap from a follow-up request for that position's row)"
            if "follow-up" in (src_on, src_off)
            else ""
        )
        return GreedyCase(prompt, "near-tie", on.text, off.text, reason=reason, **case)
    reason = f"a gap above {tie_gap:g} nats (or not a finite number): not a near-tie"
    return GreedyCase(prompt, "differs", on.text, off.text, reason=reason, **case)


# -- sampled -----------------------------------------------------------------------------


def statistics_of(text: str) -> dict[str, str]:
    """The tested statistics of one completion (fixed before any data are seen)."""
    pieces = _PIECE.findall(text)

    def piece(i: int) -> str:
        return pieces[i] if len(pieces) > i else NONE

    return {"piece 1": piece(0), "piece 2": piece(1), "piece 3": piece(2), "text": text}


def _table(on: Sequence[str], off: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    cats = sorted(set(on) | set(off))
    index = {c: i for i, c in enumerate(cats)}
    a = np.zeros(len(cats))
    b = np.zeros(len(cats))
    for v in on:
        a[index[v]] += 1
    for v in off:
        b[index[v]] += 1
    return cats, a, b


@dataclass(frozen=True)
class StatisticTest:
    name: str
    statistic: float
    dof: int
    pvalue: float
    adjusted_p: float
    rejected: bool
    per_prompt: tuple[dict[str, Any], ...]
    min_detectable_tv: float  # analytic, at alpha / m and the plan's power
    simulated_power: float  # at that TV, hardest_alternative on the observed frequencies


def sampled_tests(
    texts_on: Sequence[Sequence[str]],
    texts_off: Sequence[Sequence[str]],
    plan: EndpointCertifyPlan,
    rng: np.random.Generator,
    *,
    family: int = len(STATISTICS),
) -> list[StatisticTest]:
    """The four statistics' combined tests, Holm-adjusted among themselves, with their power
    at alpha / ``family`` (the size of the certificate's Holm family; ``joint_holm`` adjusts
    the whole family when the per-token test joins it)."""
    level = plan.alpha / family  # Holm's first step: a conservative level for the power
    raw: list[tuple[str, float, int, float, list[dict[str, Any]], float, float]] = []
    for name in STATISTICS:
        tables = []
        per_prompt = []
        n_eff = []
        for on, off in zip(texts_on, texts_off, strict=True):
            cats, a, b = _table(
                [statistics_of(t)[name] for t in on], [statistics_of(t)[name] for t in off]
            )
            r: ChiSquareResult = chisquare_homogeneity(a, b)
            tables.append((a, b))
            if r.dof > 0:
                n_eff.append(r.n_a * r.n_b / (r.n_a + r.n_b))
            top = sorted(range(len(cats)), key=lambda i: -(a[i] + b[i]))[:10]
            per_prompt.append(
                {
                    "pvalue": r.pvalue,
                    "dof": r.dof,
                    "categories": len(cats),
                    "groups": r.n_groups,
                    "tv": r.tv.estimate,
                    "top_values": [[cats[i], int(a[i]), int(b[i])] for i in top],
                }
            )
        combined = combined_homogeneity(tables)
        stat, dof, p = combined.statistic, combined.dof, combined.pvalue
        mdt = min_detectable_tv_combined(n_eff, dof, level, plan.power) if dof else math.nan
        live = [t for t in tables if chisquare_homogeneity(*t).dof > 0]
        sim = (
            simulated_power_combined(live, mdt, level, plan.power_trials, rng) if live else math.nan
        )
        raw.append((name, stat, dof, p, per_prompt, mdt, sim))
    adjusted = holm_adjust([r[3] for r in raw])
    return [
        StatisticTest(
            name=name,
            statistic=stat,
            dof=dof,
            pvalue=p,
            adjusted_p=float(adj),
            rejected=not bool(adj > plan.alpha),  # NaN: rejected
            per_prompt=tuple(pp),
            min_detectable_tv=mdt,
            simulated_power=sim,
        )
        for (name, stat, dof, p, pp, mdt, sim), adj in zip(raw, adjusted, strict=True)
    ]


def joint_holm(
    tests: Sequence[StatisticTest], pertoken: PerTokenResult | None, alpha: float
) -> tuple[list[StatisticTest], PerTokenResult | None]:
    """Holm over the sampled statistics and the per-token test together."""
    raw = [t.pvalue for t in tests] + ([pertoken.pvalue] if pertoken is not None else [])
    if not raw:
        return list(tests), pertoken
    adj = [float(a) for a in holm_adjust(raw)]
    out = [
        replace(t, adjusted_p=a, rejected=not a > alpha) for t, a in zip(tests, adj, strict=False)
    ]
    if pertoken is not None:
        a = adj[-1]
        rejected = not a > alpha or pertoken.impossible > 0  # an impossible token: rejected
        pertoken = replace(pertoken, adjusted_p=a, rejected=rejected)
    return out, pertoken


# -- the certificate ---------------------------------------------------------------------


@dataclass
class EndpointCertificate:
    status: str
    sides: str
    model: str
    api: str
    plan: dict[str, Any]
    greedy: list[GreedyCase]
    tests: list[StatisticTest]
    drafted_on: int | None
    accepted_on: int | None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    command: str = ""
    pertoken: PerTokenResult | None = None
    pertoken_note: str | None = None  # why the per-token test did not run
    timing: dict[str, Any] = field(default_factory=dict)

    def verdict_line(self) -> str:
        n_same = sum(c.status == "identical" for c in self.greedy)
        ties = sum(c.status == "near-tie" for c in self.greedy)
        parts = [f"greedy {n_same}/{len(self.greedy)} identical"]
        if ties:
            parts.append(f"{ties} near-tie(s)")
        if self.tests:
            rej = sum(t.rejected for t in self.tests)
            pmin = min(t.adjusted_p for t in self.tests)
            parts.append(f"sampled {rej}/{len(self.tests)} tests rejected (min Holm p {pmin:.3g})")
        if self.pertoken is not None:
            pt = self.pertoken
            parts.append(
                f"per-token {'REJECTED' if pt.rejected else 'not rejected'} "
                f"({pt.n_tokens} tokens, Holm p {pt.adjusted_p:.3g})"
            )
        if self.drafted_on is not None:
            parts.append(f"spec-on drafted {self.drafted_on}, accepted {self.accepted_on}")
        return f"endpoint certificate: {VERDICT[self.status]}: " + "; ".join(parts)

    def power_line(self) -> str:
        """The stated power in one line (what a PASS of this size can and cannot rule out)."""
        bits = []
        tvs = [t.min_detectable_tv for t in self.tests if math.isfinite(t.min_detectable_tv)]
        if tvs:
            n = self.plan.get("sampled_prompts", 0) * self.plan.get("samples", 0)
            bits.append(
                f"the sampled tests find a TV of {min(tvs):.2g}-{max(tvs):.2g} on their pooled "
                f"categories with 80 % probability ({n} requests per side)"
            )
        if self.pertoken is not None:
            mdt = [v for v in self.pertoken.min_detectable_tv.values() if math.isfinite(v)]
            if mdt:
                bits.append(
                    f"the per-token test finds a per-token TV of {min(mdt):.2g}-{max(mdt):.2g} "
                    f"(top {self.pertoken.top} + rest; {self.pertoken.n_tokens} tokens)"
                )
        elif self.pertoken_note:
            bits.append(f"no per-token test ({self.pertoken_note})")
        return "power: " + ("; ".join(bits) if bits else "no sampled tests") + "."

    def to_dict(self) -> dict[str, Any]:
        return json_ready(
            {
                "status": self.status,
                "verdict": VERDICT[self.status],
                "sides": self.sides,
                "model": self.model,
                "api": self.api,
                "plan": self.plan,
                "greedy": [asdict(c) for c in self.greedy],
                "sampled_tests": [asdict(t) for t in self.tests],
                "pertoken_test": self.pertoken.to_dict() if self.pertoken else None,
                "pertoken_note": self.pertoken_note,
                "power": self.power_line(),
                "timing": self.timing,
                "drafted_on": self.drafted_on,
                "accepted_on": self.accepted_on,
                "notes": self.notes,
                "limits": list(LIMITS),
                "seconds": self.seconds,
                "command": self.command,
            }
        )
