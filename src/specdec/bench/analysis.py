"""Statistics over measurement records: speedups, their spread, pooled acceptance, verdicts.

Everything here is a pure function of records read from a results file (plain dicts), so the
report's numbers can be recomputed and tested on hand-made data.

Conventions
- speedup of a K > 0 measurement = its tokens/s / tokens/s of plain decoding (K = 0) of the
  same configuration, mode, prompt and repeat (seed-paired, measured in the same run).
- the point estimate of a (configuration, mode, K) cell is the geometric mean of its
  speedups; its 95 % CI is a percentile bootstrap that resamples prompts (all repeats of a
  prompt travel together: repeats of one prompt are not independent samples of the content;
  ``specdec.stats.bootstrap``).
- positional acceptance pools counts: a_i = sum accepted_i / sum reached_i, which weights each
  round equally (averaging per-prompt rates would over-weight short generations).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specdec.stats.bootstrap import Spread, spread
from specdec.theory import predicted_speedup, predicted_speedup_from_rounds

Record = dict[str, Any]


def fill_acceptance(reached: Sequence[int], accepted: Sequence[int]) -> list[float]:
    """a_i = accepted_i / reached_i; a never-reached position repeats the previous value (only
    clamped final rounds leave a position unreached after an accepted one), position 1 -> 0."""
    out: list[float] = []
    prev = 0.0
    for n, a in zip(reached, accepted, strict=True):
        prev = a / n if n else prev
        out.append(prev)
    return out


def predicted_from_counts(
    reached: Sequence[int],
    accepted: Sequence[int],
    k: int,
    c: float | None,
    verify_ratio: Sequence[float] | None,
) -> float | None:
    """Predicted speedup at K from positional acceptance counts and the measured costs."""
    if k == 0:
        return 1.0
    if c is None or not math.isfinite(c) or len(reached) < k:
        return None
    vr = _finite_curve(verify_ratio)
    return predicted_speedup(fill_acceptance(reached, accepted), k, c, vr)


def _finite_curve(verify_ratio: Sequence[float] | None) -> list[float] | None:
    vr = list(verify_ratio) if verify_ratio else None
    if vr is not None and not all(v is not None and math.isfinite(v) for v in vr):
        return None
    return vr


def per_token_draft(drafter_kind: str) -> bool:
    """Whether a drafter pays its measured step per drafted token (a draft model, also inside
    a hybrid) rather than once per round (model-free lookups)."""
    return drafter_kind in ("model", "hybrid")


def predicted_from_rounds(
    draft_lengths: Sequence[int],
    tokens: int,
    k: int,
    c: float | None,
    verify_ratio: Sequence[float] | None,
    drafter_kind: str,
) -> float | None:
    """Predicted speedup of one run from its round structure (how many rounds verified how
    many drafts) and the measured costs: right for drafters whose drafts vary in length."""
    if k == 0:
        return 1.0
    if c is None or not math.isfinite(c) or tokens < 1 or not any(draft_lengths):  # no rounds
        return None
    vr = _finite_curve(verify_ratio)
    return predicted_speedup_from_rounds(
        draft_lengths, tokens, c, vr, per_token=per_token_draft(drafter_kind)
    )


def predicted_by_rounds(
    records: Sequence[Record], c: float, vr: Sequence[float] | None
) -> float | None:
    """Geometric mean over a cell's runs of the prediction from each run's round structure
    (``analysis.predicted_from_rounds``); None when a run lacks it (older result files)."""
    preds = [
        predicted_from_rounds(
            m["draft_lengths"], m["n_tokens"], m["k"], c, vr, m.get("drafter", "model")
        )
        if "draft_lengths" in m
        else None
        for m in records
    ]
    if not preds or any(p is None or not p > 0 for p in preds):
        return None
    return math.exp(sum(math.log(p) for p in preds if p is not None) / len(preds))


# -- pairing and spread ------------------------------------------------------------------


def attach_speedups(measurements: Iterable[Record]) -> list[Record]:
    """Copies of the K > 0 records with 'speedup' recomputed from the paired plain record
    (records without a plain partner are dropped)."""
    ms = list(measurements)
    plain = {
        (m["config"], m["mode"], m["prompt_id"], m["repeat"]): m["tokens_per_second"]
        for m in ms
        if m["k"] == 0
    }
    out = []
    for m in ms:
        if m["k"] == 0:
            continue
        base = plain.get((m["config"], m["mode"], m["prompt_id"], m["repeat"]))
        tps = m.get("tokens_per_second")
        if base is None or tps is None or not base > 0:
            continue
        out.append({**m, "speedup": tps / base})
    return out


Cell = tuple[str, str, int]  # (config, mode, k)


def speedup_cells(measurements: Iterable[Record]) -> dict[Cell, Spread]:
    """Spread of the speedup per (configuration, mode, K)."""
    groups: dict[Cell, tuple[list[float], list[str]]] = defaultdict(lambda: ([], []))
    for m in attach_speedups(measurements):
        if m["speedup"] > 0:
            vals, cls = groups[(m["config"], m["mode"], m["k"])]
            vals.append(m["speedup"])
            cls.append(m["prompt_id"])
    return {cell: spread(v, c) for cell, (v, c) in sorted(groups.items())}


# -- acceptance --------------------------------------------------------------------------


def pooled_acceptance(measurements: Iterable[Record]) -> tuple[list[int], list[int]]:
    """Summed (reached, accepted) counts per draft position over K > 0 records."""
    reached: list[int] = []
    accepted: list[int] = []
    for m in measurements:
        if m["k"] == 0:
            continue
        r, a = m.get("reached") or [], m.get("accepted") or []
        if len(reached) < len(r):
            reached += [0] * (len(r) - len(reached))
            accepted += [0] * (len(r) - len(accepted))
        for i, (n, x) in enumerate(zip(r, a, strict=True)):
            reached[i] += int(n)
            accepted[i] += int(x)
    return reached, accepted


def rates(reached: Sequence[int], accepted: Sequence[int]) -> list[float]:
    return [a / n if n else float("nan") for n, a in zip(reached, accepted, strict=True)]


def overall_rate(reached: Sequence[int], accepted: Sequence[int]) -> float:
    """Accepted drafts / drafts that were checked, pooled over positions."""
    n = sum(reached)
    return sum(accepted) / n if n else float("nan")


def group_by(records: Iterable[Record], *fields: str) -> dict[tuple[Any, ...], list[Record]]:
    out: dict[tuple[Any, ...], list[Record]] = defaultdict(list)
    for r in records:
        out[tuple(r[f] for f in fields)].append(r)
    return dict(sorted(out.items(), key=lambda kv: tuple(str(x) for x in kv[0])))


def time_split_fractions(measurements: Iterable[Record]) -> dict[str, float]:
    """Fraction of summed wall time in prefill / draft / verify / sampling / other."""
    parts = ("prefill", "draft", "verify", "sampling", "other")
    tot = dict.fromkeys(parts, 0.0)
    for m in measurements:
        ts = m.get("time_split") or {}
        for p in parts:
            tot[p] += float(ts.get(p) or 0.0)
    s = sum(tot.values())
    return {p: (v / s if s > 0 else float("nan")) for p, v in tot.items()}


def mean_or_nan(values: Iterable[float | None]) -> float:
    v = [x for x in values if x is not None and math.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")


# -- the per-configuration summary --------------------------------------------------------


@dataclass
class ConfigSummary:
    """The headline row of one (configuration, mode)."""

    config: str
    mode: str
    best_k: int | None
    best: Spread | None
    plateau: list[int] = field(default_factory=list)
    verify8: float = float("nan")  # verify(8) / verify(1)
    verify5: float = float("nan")
    c: float = float("nan")
    c_flops: float | None = None
    acceptance: float = float("nan")  # pooled over positions and K
    predicted_best: float = float("nan")
    verdict: str = ""


def _ratio_at(profile: Record | None, n: int) -> float:
    if not profile:
        return float("nan")
    vr = profile.get("verify_ratio") or []
    return float(vr[n - 1]) if len(vr) >= n and vr[n - 1] is not None else float("nan")


def _best_predicted(
    accept: Sequence[float], c: float, verify: Sequence[float] | None, k_max: int
) -> float:
    return max(predicted_speedup(accept, k, c, verify) for k in range(1, k_max + 1))


def diagnose(
    accept: Sequence[float], c: float, verify_ratio: Sequence[float] | None, k_max: int
) -> str:
    """Which cost keeps speculation from paying: compare the best predicted speedup with
    perfectly parallel verification (verify(n) = verify(1)) and with a free draft (c = 0)."""
    if k_max < 1 or not accept or not math.isfinite(c):
        return "unknown"
    vr = list(verify_ratio) if verify_ratio else None
    flat = _best_predicted(accept, c, None, k_max)
    free = _best_predicted(accept, 0.0, vr, k_max)
    if flat <= 1.0 and free <= 1.0:
        return "acceptance"
    return "verify" if flat >= free else "draft"


def summarize_config(
    config: str,
    mode: str,
    cells: dict[Cell, Spread],
    measurements: Sequence[Record],
    profile: Record | None,
) -> ConfigSummary:
    own = {k: s for (cfg, md, k), s in cells.items() if cfg == config and md == mode}
    ms = [m for m in measurements if m["config"] == config and m["mode"] == mode]
    reached, accepted = pooled_acceptance(ms)
    out = ConfigSummary(config, mode, None, None)
    out.acceptance = overall_rate(reached, accepted)
    out.verify8 = _ratio_at(profile, 8)
    out.verify5 = _ratio_at(profile, 5)
    if profile:
        out.c = float(profile["c"]) if profile.get("c") is not None else float("nan")
        out.c_flops = profile.get("c_flops")
    if own:
        best_k = max(own, key=lambda k: own[k].geomean)
        best = own[best_k]
        out.best_k, out.best = best_k, best
        if math.isfinite(best.ci_low):
            out.plateau = sorted(
                k for k, s in own.items() if s.ci_high >= best.ci_low and s.ci_low <= best.ci_high
            )
        else:
            out.plateau = [best_k]
    accept = fill_acceptance(reached, accepted)
    k_max = max(own) if own else 0
    vr = profile.get("verify_ratio") if profile else None
    if own and math.isfinite(out.c):  # runs that recorded their rounds: the best K's
        by_rounds = [predicted_by_rounds([m for m in ms if m["k"] == k], out.c, vr) for k in own]
        if all(p is not None for p in by_rounds):
            out.predicted_best = max(p for p in by_rounds if p is not None)
    if math.isnan(out.predicted_best) and accept and k_max and math.isfinite(out.c):
        out.predicted_best = _best_predicted(accept, out.c, vr, min(k_max, len(accept)))
    out.verdict = verdict(out, accept, vr, min(k_max, len(accept)))
    return out


def verdict(
    s: ConfigSummary, accept: Sequence[float], vr: Sequence[float] | None, k_max: int
) -> str:
    """One line: does speculation pay here, and if not, which cost is to blame."""
    if s.best is None:
        return "no speculative measurements"
    b = s.best
    has_ci = math.isfinite(b.ci_low)
    if b.geomean > 1.0 and (not has_ci or b.ci_low > 1.0):
        return f"speculation pays ({b.geomean:.2f}x at K = {s.best_k})"
    if has_ci and b.ci_low <= 1.0 < b.ci_high:
        return f"inconclusive: the 95 % CI of the best K spans 1 ({b.ci_low:.2f}-{b.ci_high:.2f}x)"
    cause = diagnose(accept, s.c, vr, k_max)
    if cause == "verify":
        return f"decelerates: verification is serial (verify(5)/verify(1) = {s.verify5:.2f})"
    if cause == "draft":
        return f"decelerates: draft not cheap enough (c = {s.c:.2f})"
    if cause == "acceptance":
        return f"decelerates: acceptance too low ({s.acceptance:.0%} of drafts accepted)"
    return "decelerates"


def baseline_configs(results_configs: Iterable[Record], backend: str = "llamacpp") -> set[str]:
    """Labels of the configurations whose target runs on ``backend`` (from the header plans):
    their K = 0 runs are plain decoding on that backend."""
    out = set()
    for c in results_configs:
        target = c.get("target") or {}
        model = str(target.get("model", ""))
        b = target.get("backend", "auto")
        if b == "auto":
            b = "llamacpp" if model.endswith(".gguf") or "/" not in model else "hf"
        if b == backend:
            out.add(str(c["label"]))
    return out


def against_baseline(
    measurements: Iterable[Record], baseline: set[str], field: str = "tokens_per_second"
) -> dict[tuple[str, str, int], list[tuple[str, str, float]]]:
    """Each run's speed as a ratio to plain decoding on the baseline backend for the same
    prompt, mode and repeat: (config, mode, K) -> [(prompt id, category, ratio)]. The
    baseline of a (prompt, mode, repeat) is the median of the baseline configurations' K = 0
    runs (every one of them is plain decoding of the same file). With ``field`` "t_total" the
    ratio is baseline end-to-end time over the run's (above 1: faster)."""
    ms = list(measurements)
    base: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for m in ms:
        if m["k"] == 0 and m["config"] in baseline and m.get(field):
            base[(m["mode"], m["prompt_id"], m["repeat"])].append(float(m[field]))
    out: dict[tuple[str, str, int], list[tuple[str, str, float]]] = defaultdict(list)
    for m in ms:
        b = base.get((m["mode"], m["prompt_id"], m["repeat"]))
        v = m.get(field)
        if not b or not v:
            continue
        ref = float(np.median(b))
        ratio = float(v) / ref if field == "tokens_per_second" else ref / float(v)
        if ratio > 0 and math.isfinite(ratio):
            out[(m["config"], m["mode"], m["k"])].append((m["prompt_id"], m["category"], ratio))
    return out
