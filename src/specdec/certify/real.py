"""Level 3: a given draft/target/backend setup (any CausalLM pair, e.g. from load_model).

1. Batch-invariance probe of the target (``invariance.batch_invariance``): how far its logits
   move between scoring n positions in one pass and one at a time.
2. Greedy agreement on each prompt between speculative decoding, plain decoding and the
   shape-matched plain baseline. Speculative vs shape-matched must agree bit for bit (same
   rows, same shapes). At a speculative vs plain divergence the target's row at that position
   is recomputed both ways — replaying the speculative rounds' batch shapes, and one token
   per pass as plain decoding feeds it — and the divergence is a "near-tie" when the top-2
   logit gap in BOTH scorings is within the batch-invariance tie threshold (2 x the largest
   logit difference measured, by the probe or at that very position), else a "real bug".
3. Sampled two-sample tests. Unit: an independent sequence (its own seed; the methods use
   disjoint seed streams, so nothing is paired). Variable: the first m generated tokens as
   one categorical. Per prompt a chi-square test of homogeneity (rare categories pooled);
   across prompts (a) Holm over the per-prompt tests at alpha / 2 and (b) the sum of the
   per-prompt statistics (chi-square with the summed dof) at alpha / 2 — a difference is
   declared when either rejects, so the family-wise level is alpha. Two comparisons, each
   its own family: speculative vs plain (what a user sees), and speculative vs shape-matched
   plain (the clean test of the decoder: same batch shapes, so backend batch variance can
   neither fake nor hide a loss). Power: the smallest TV (on the pooled categories) detected
   with 80 % probability, per prompt at the worst Holm level and for the combined test when
   the difference is present at every prompt (noncentral chi-square approximation).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from specdec.decoding import GenerationResult, RoundStats, generate, generate_stream
from specdec.drafters.base import Drafter
from specdec.models.base import CausalLM, extend_last
from specdec.sampling import SamplingConfig
from specdec.stats import (
    ChiSquareResult,
    chisquare_homogeneity,
    combine_chisquare,
    min_detectable_tv_combined,
    softmax_tv_bound,
)

from .common import FAIL, PASS, WARN, TestRecord, apply_holm, fmt
from .invariance import InvarianceResult, batch_invariance
from .prefix_cache import PrefixReuseLM
from .progress import ProgressLog
from .seeds import derive_seed
from .shape_matched import shape_matched_generate, shape_matched_stream

METHODS = ("spec", "plain", "shape_matched")
COMPARISONS = (("spec", "shape_matched"), ("spec", "plain"))


@dataclass(frozen=True)
class Level3Config:
    k: int = 4
    greedy_prompts: int = 6
    greedy_max_new_tokens: int = 32
    probe_prompts: int = 3
    probe_ns: tuple[int, ...] = (2, 5, 9)
    sampled_prompts: int = 3
    seeds: int = 60  # independent sequences per prompt and method
    m: int = 2  # the first m generated tokens form the categorical variable
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    chunk: int = 20  # sequences per progress-log record
    alpha: float = 0.01
    power: float = 0.8
    seed: int = 0

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)


# ------------------------------------------------------------------ greedy
def top2_gap(row: torch.Tensor) -> float:
    """Largest minus second-largest logit of a row [V]."""
    top = torch.topk(row.double(), 2).values
    return float(top[0] - top[1])


def replay_speculative_row(
    target: CausalLM,
    prompt: Sequence[int],
    tokens: Sequence[int],
    rounds: Sequence[RoundStats],
    index: int,
) -> torch.Tensor:
    """The target's row [V] for generated position ``index`` computed in the speculative run's
    shapes: prefill of prompt[:-1], then each round's pass over [last, K drafts] (accepted
    drafts are known; rejected ones are replaced by filler tokens, which later rows only see),
    with the same rollbacks."""
    ctx = [int(t) for t in prompt]
    if target.n_cached:
        target.truncate(0)
    if len(ctx) > 1:
        extend_last(target, ctx[:-1])
    pos = 0
    for r in rounds:
        accepted = [int(t) for t in tokens[pos : pos + r.n_accepted]]
        nxt = pos + r.n_accepted
        filler = int(tokens[nxt]) if nxt < len(tokens) else ctx[-1]  # rejected drafts unknown
        drafts = accepted + [filler] * (r.k - len(accepted))
        logits = target.extend([ctx[-1], *drafts])  # [K+1, V]
        if pos <= index < pos + r.n_emitted:
            return logits[index - pos]
        if r.n_accepted < r.k:
            target.truncate(len(ctx) + r.n_accepted)
        ctx.extend(int(t) for t in tokens[pos : pos + r.n_emitted])
        pos += r.n_emitted
    raise ValueError(f"position {index} is not covered by the {len(rounds)} rounds")


def sequential_row(
    target: CausalLM, prompt: Sequence[int], tokens: Sequence[int], index: int
) -> torch.Tensor:
    """The target's row [V] for generated position ``index`` as plain decoding computes it:
    prefill of prompt[:-1], then one token per pass."""
    if target.n_cached:
        target.truncate(0)
    ctx = [int(t) for t in prompt]
    if len(ctx) > 1:
        extend_last(target, ctx[:-1])
    row = target.extend([ctx[-1]])[0]
    for t in tokens[:index]:
        row = target.extend([int(t)])[0]
    return row


@dataclass
class Divergence:
    index: int  # first generated position where the outputs differ
    spec_token: int | None
    plain_token: int | None
    gap_batched: float  # top-2 logit gap of the target row, speculative shapes
    gap_single: float  # same row, one token per pass
    argmax_batched: int
    argmax_single: int
    logit_diff: float  # max |batched - single| at this position
    threshold: float  # 2 x max(probe max diff, logit_diff)
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


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def classify_divergence(
    target: CausalLM,
    prompt: Sequence[int],
    spec: GenerationResult,
    plain_tokens: Sequence[int],
    index: int,
    probe_max_abs: float,
) -> Divergence:
    """Recompute the divergent position both ways and name the cause (module docstring)."""
    if index >= len(spec.tokens) or index >= len(plain_tokens):
        # one output is a prefix of the other: a stop (EOS) in one of them only
        idx = min(index, len(spec.tokens) - 1, len(plain_tokens) - 1)
    else:
        idx = index
    b = replay_speculative_row(target, prompt, spec.tokens, spec.rounds, idx)
    s = sequential_row(target, prompt, spec.tokens, idx)
    diff = float((b - s).abs().max())
    thr = 2.0 * max(probe_max_abs, diff)
    gb, gs = top2_gap(b), top2_gap(s)
    st = spec.tokens[index] if index < len(spec.tokens) else None
    pt = plain_tokens[index] if index < len(plain_tokens) else None
    ab, as_ = int(torch.argmax(b)), int(torch.argmax(s))
    return Divergence(
        index=index,
        spec_token=st,
        plain_token=pt,
        gap_batched=gb,
        gap_single=gs,
        argmax_batched=ab,
        argmax_single=as_,
        logit_diff=diff,
        threshold=thr,
        reproduced=(ab == st and as_ == pt),
        cause="near-tie" if max(gb, gs) <= thr else "real bug",
    )


def greedy_prompt(
    target: CausalLM,
    draft: CausalLM | Drafter,
    prompt: Sequence[int],
    cfg: Level3Config,
    probe_max_abs: float,
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
    div = (
        None
        if i is None
        else classify_divergence(target, prompt, spec, plain.tokens, i, probe_max_abs)
    )
    return GreedyPrompt(
        prompt=index,
        n_tokens=len(spec.tokens),
        agree_plain=i is None,
        agree_shape_matched=spec.tokens == shaped,
        divergence=div,
        seconds=time.perf_counter() - t0,
    )


# ------------------------------------------------------------------ sampled
def _first_tokens(stream: Iterator[Any], m: int) -> list[int]:
    toks: list[int] = []
    for ev in stream:
        toks.extend(ev.tokens)
        if len(toks) >= m:
            break
    return toks[:m]


def sample_sequence(
    method: str,
    target: CausalLM,
    draft: CausalLM | Drafter,
    prompt: Sequence[int],
    cfg: Level3Config,
    seed: int,
) -> list[int]:
    """The first m tokens of one independent sequence of the given method (fewer at EOS)."""
    # room for m + K tokens: no round before the m-th token has its K clamped, so every pass
    # of the speculative and shape-matched paths has K + 1 positions
    n_max = cfg.m + cfg.k
    if method == "spec":
        stream: Iterator[Any] = generate_stream(
            target,
            draft,
            prompt,
            max_new_tokens=n_max,
            k=cfg.k,
            sampling=cfg.sampling,
            seed=seed,
        )
    elif method == "plain":
        stream = generate_stream(
            target, None, prompt, max_new_tokens=cfg.m, k=0, sampling=cfg.sampling, seed=seed
        )
    elif method == "shape_matched":
        stream = shape_matched_stream(
            target,
            draft,
            prompt,
            max_new_tokens=n_max,
            k=cfg.k,
            sampling=cfg.sampling,
            seed=seed,
        )
    else:
        raise ValueError(f"unknown method {method!r}")
    return _first_tokens(stream, cfg.m)


def _table(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Count vectors [C] of two samples of token tuples over their union of categories."""
    keys = sorted({tuple(x) for x in a} | {tuple(x) for x in b})
    index = {k: i for i, k in enumerate(keys)}
    ca, cb = np.zeros(len(keys)), np.zeros(len(keys))
    for x in a:
        ca[index[tuple(x)]] += 1
    for x in b:
        cb[index[tuple(x)]] += 1
    return ca, cb


@dataclass
class Comparison:
    """Two-sample tests of one pair of methods over the prompts."""

    a: str
    b: str
    tests: list[TestRecord]  # per prompt, Holm at alpha / 2
    combined_statistic: float
    combined_dof: int
    combined_p: float
    combined_min_detectable_tv: float  # at alpha / 2, difference at every prompt
    alpha: float

    @property
    def rejected(self) -> bool:
        return self.combined_p <= self.alpha / 2 or any(t.rejected for t in self.tests)

    @property
    def per_prompt_min_detectable_tv(self) -> float:
        v = [t.min_detectable_tv for t in self.tests if np.isfinite(t.min_detectable_tv)]
        return max(v) if v else float("nan")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tests"] = [t.to_dict() for t in self.tests]
        d.update(
            rejected=self.rejected, per_prompt_min_detectable_tv=self.per_prompt_min_detectable_tv
        )
        return d

    def sentence(self) -> str:
        n = sum(t.n_a for t in self.tests)
        if self.combined_dof == 0:
            return (
                f"{self.a} vs {self.b}: untestable — with {n} sequences per method over "
                f"{len(self.tests)} prompts every category had to be pooled into one; use "
                "more --seeds."
            )
        verdict = "DIFFERENCE DETECTED" if self.rejected else "no difference detected"
        return (
            f"{self.a} vs {self.b}: {verdict} at alpha {self.alpha:g} "
            f"({len(self.tests)} prompts, {n} sequences per method; combined chi2 "
            f"{self.combined_statistic:.1f} on {self.combined_dof} dof, p = "
            f"{fmt(self.combined_p)}; smallest per-prompt Holm-adjusted p = "
            f"{fmt(min((t.adjusted_p for t in self.tests), default=1.0))}). This test would "
            f"detect a TV >= {fmt(self.combined_min_detectable_tv)} present at every prompt, "
            f"or >= {fmt(self.per_prompt_min_detectable_tv)} at any single prompt, with 80 % "
            "power."
        )


def compare(
    samples: dict[str, list[list[list[int]]]], a: str, b: str, cfg: Level3Config
) -> Comparison:
    """Per-prompt homogeneity tests of methods a vs b plus their combination."""
    results: list[ChiSquareResult] = []
    raw: list[TestRecord] = []
    for pi, (sa, sb) in enumerate(zip(samples[a], samples[b], strict=True)):
        ca, cb = _table(sa, sb)
        r = chisquare_homogeneity(ca, cb)
        results.append(r)
        raw.append(TestRecord.from_test(f"prompt{pi}", r))
    tests = apply_holm(raw, cfg.alpha / 2, cfg.power)
    comb = combine_chisquare(results)
    n_eff = [r.n_a * r.n_b / r.n for r in results if r.dof > 0]
    mdt = min_detectable_tv_combined(n_eff, comb.dof, cfg.alpha / 2, cfg.power)
    return Comparison(a, b, tests, comb.statistic, comb.dof, comb.pvalue, mdt, cfg.alpha)


# ------------------------------------------------------------------ level
@dataclass
class Level3Result:
    config: Level3Config
    draft_label: str
    target_label: str
    probe: InvarianceResult | None = None
    greedy: list[GreedyPrompt] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

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

    def comparison(self, a: str, b: str) -> Comparison | None:
        return next((c for c in self.comparisons if (c.a, c.b) == (a, b)), None)

    @property
    def batch_invariant(self) -> bool:
        return self.probe is not None and self.probe.batch_invariant

    def numerics_tv_bound(self, a: str, b: str) -> float:
        """How large a TV between methods a and b the backend's measured numerics could
        plausibly cause (a heuristic: ``softmax_tv_bound`` over the m tokens, with the probe's
        max logit difference between the two ways the methods score a position — pass size
        for spec vs plain, row index within equal-size passes for spec vs shape-matched)."""
        if self.probe is None:
            return 1.0  # unmeasured: numerics cannot be ruled out
        eps = self.probe.row_offset_max_abs if b == "shape_matched" else self.probe.max_abs
        return softmax_tv_bound(eps, self.config.m)

    def explained_by_numerics(self, c: Comparison) -> bool:
        """A rejection is put down to numerics only when they could cause a TV of at least a
        quarter of what the test detects with 80 % power (below that a rejection is unlikely:
        the test's power there is close to its level)."""
        mdt = c.combined_min_detectable_tv
        return bool(np.isfinite(mdt)) and self.numerics_tv_bound(c.a, c.b) >= 0.25 * mdt

    @property
    def status(self) -> str:
        """fail: a real greedy bug, or a sampled difference that the backend's measured numerics
        cannot explain; warn: a sampled difference that they can (see ``notes``); else pass."""
        if self.real_bugs:
            return FAIL
        for c in self.comparisons:
            if c.rejected and not self.explained_by_numerics(c):
                return FAIL
        if any(c.rejected for c in self.comparisons):
            return WARN
        return PASS

    def notes(self) -> list[str]:
        """Why the status is what it is, in words (empty for a clean pass)."""
        out = []
        if self.real_bugs:
            out.append(
                f"{len(self.real_bugs)} greedy divergence(s) cannot be explained by batch "
                "variance (speculative output differs from the shape-matched baseline, or the "
                "top-2 gap exceeds the near-tie threshold): a decoder bug."
            )
        for c in self.comparisons:
            if not c.rejected:
                continue
            bound = self.numerics_tv_bound(c.a, c.b)
            what = (
                "the row index within equal-size passes (which the shape-matched baseline does "
                "not match)"
                if c.b == "shape_matched"
                else "the pass size (one token per pass in plain decoding)"
            )
            if self.explained_by_numerics(c):
                out.append(
                    f"{c.a} and {c.b} sampling differ; this backend's logits depend on {what} "
                    f"enough to cause a TV up to about {bound:.2g} over {self.config.m} "
                    "token(s): numerics may explain it. A decoder bug cannot be excluded here; "
                    "Levels 1-2 cover the decoder, a batch-invariant (fp32) backend removes the "
                    "ambiguity."
                )
            else:
                out.append(
                    f"{c.a} and {c.b} sampling differ, and this backend's measured numerics "
                    f"(dependence on {what}) could cause a TV of at most about {bound:.2g}, "
                    "far below what the test detects: a decoder bug."
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
            "notes": self.notes(),
            "seconds": self.seconds,
        }
        if self.probe is not None:
            d["invariance_max_abs"] = self.probe.max_abs
            d["invariance_tie_threshold"] = self.probe.tie_threshold
            d["invariance_argmax_flips"] = self.probe.argmax_flips
            d["invariance_row_offset_max_abs"] = self.probe.row_offset_max_abs
        for c in self.comparisons:
            d[f"{c.a}_vs_{c.b}"] = {
                "rejected": c.rejected,
                "combined_p": c.combined_p,
                "min_adjusted_p": min((t.adjusted_p for t in c.tests), default=1.0),
                "min_detectable_tv_every_prompt": c.combined_min_detectable_tv,
                "min_detectable_tv_one_prompt": c.per_prompt_min_detectable_tv,
                "sequences_per_method": sum(t.n_a for t in c.tests),
            }
        return d

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "config": asdict(self.config),
            "probe": self.probe.to_dict() if self.probe else None,
            "greedy": [asdict(g) for g in self.greedy],
            "comparisons": [c.to_dict() for c in self.comparisons],
        }

    def shown(self) -> list[str]:
        lines = []
        if self.probe is not None:
            p = self.probe
            lines.append(
                f"Batch invariance of the target: max |logit diff| {p.max_abs:.3g} between one "
                f"pass of n in {p.ns} tokens and one token per pass ({p.argmax_flips} argmax "
                f"flips); near-tie threshold {p.tie_threshold:.3g}; rollback exact to "
                f"{p.rollback_max_abs:.2g}."
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
                        f"vs threshold {dv.threshold:.3g}"
                        + (", flip reproduced" if dv.reproduced else "")
                        + ")."
                    )
            lines.append(text)
        if self.comparisons:
            c = self.config
            lines.append(
                f"Sampled design (fixed before running): unit = one independent sequence (own "
                f"seed, disjoint seed streams per method); variable = the first {c.m} generated "
                f"token(s) as one category; T = {c.temperature:g}, top-k {c.top_k}, top-p "
                f"{c.top_p:g}, K = {c.k}; null = the two methods' sequences have the same "
                "distribution; test = per-prompt chi-square homogeneity (pooled to expected "
                f"counts >= 5), Holm over prompts at {c.alpha / 2:g} plus the combined "
                f"chi-square at {c.alpha / 2:g} (family-wise alpha {c.alpha:g}); power = the "
                "smallest TV detected with 80 % probability."
            )
        lines += [c.sentence() for c in self.comparisons]
        return lines


def run_level3(
    draft: CausalLM | Drafter,
    target: CausalLM,
    prompts: Sequence[Sequence[int]],
    cfg: Level3Config,
    *,
    draft_label: str = "draft",
    target_label: str = "target",
    log: ProgressLog | None = None,
    parts: Sequence[str] = ("probe", "greedy", "sampled"),
    progress: Callable[[str], None] | None = None,
) -> Level3Result:
    """Run the parts of Level 3 on a model pair (prompts as token ids); ``progress``
    receives a one-line message after each completed unit."""
    say = progress or (lambda _msg: None)
    res = Level3Result(cfg, draft_label, target_label)
    if "probe" in parts:
        t0 = time.perf_counter()
        res.probe = batch_invariance(
            target, list(prompts[: cfg.probe_prompts]), ns=cfg.probe_ns, label=target_label
        )
        res.seconds["probe"] = time.perf_counter() - t0
        say(f"probe: max |logit diff| {res.probe.max_abs:.3g} ({res.seconds['probe']:.0f} s)")
    probe_max = res.probe.max_abs if res.probe is not None else 0.0
    # from here on the models are only used through the wrappers (the probe used them bare)
    d: CausalLM | Drafter = PrefixReuseLM(draft) if isinstance(draft, CausalLM) else draft
    t = PrefixReuseLM(target)
    if "greedy" in parts:
        t0 = time.perf_counter()
        for i, ids in enumerate(prompts[: cfg.greedy_prompts]):
            key = f"l3/greedy/{i}"
            done = log.get(key) if log else None
            if done is not None:
                div = Divergence(**done["divergence"]) if done["divergence"] else None
                res.greedy.append(GreedyPrompt(**{**done, "divergence": div}))
                continue
            g = greedy_prompt(t, d, ids, cfg, probe_max, i)
            res.greedy.append(g)
            what = "agrees" if g.divergence is None else f"diverges ({g.divergence.cause})"
            n_greedy = min(len(prompts), cfg.greedy_prompts)
            say(f"greedy prompt {i + 1}/{n_greedy}: {what} ({g.seconds:.0f} s)")
            if log:
                log.put(key, asdict(g))
        res.seconds["greedy"] = time.perf_counter() - t0
    if "sampled" in parts:
        t0 = time.perf_counter()
        samples: dict[str, list[list[list[int]]]] = {m: [] for m in METHODS}
        for i, ids in enumerate(prompts[: cfg.sampled_prompts]):
            for method in METHODS:
                seqs: list[list[int]] = []
                for c0 in range(0, cfg.seeds, cfg.chunk):
                    key = f"l3/sampled/{method}/{i}/{c0}"
                    done = log.get(key) if log else None
                    if done is None:
                        done = [
                            sample_sequence(
                                method, t, d, ids, cfg, derive_seed(cfg.seed, "l3", method, i, s)
                            )
                            for s in range(c0, min(cfg.seeds, c0 + cfg.chunk))
                        ]
                        if log:
                            log.put(key, done)
                        say(
                            f"sampled prompt {i + 1}/{min(len(prompts), cfg.sampled_prompts)}, "
                            f"{method}: {c0 + len(done)}/{cfg.seeds} sequences "
                            f"({time.perf_counter() - t0:.0f} s)"
                        )
                    seqs.extend(done)
                samples[method].append(seqs)
        res.comparisons = [compare(samples, a, b, cfg) for a, b in COMPARISONS]
        res.seconds["sampled"] = time.perf_counter() - t0
    return res
