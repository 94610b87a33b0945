"""Markdown report and PNG plots from a results file. Every number comes from the file."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specdec.bench import plots
from specdec.bench.analysis import (
    Cell,
    ConfigSummary,
    Record,
    against_baseline,
    attach_speedups,
    baseline_configs,
    fill_acceptance,
    group_by,
    mean_or_nan,
    overall_rate,
    pooled_acceptance,
    predicted_by_rounds,
    rates,
    speedup_cells,
    spread,
    summarize_config,
    time_split_fractions,
)
from specdec.bench.results import Results, read_results
from specdec.errors import ConfigError
from specdec.stats.bootstrap import Spread
from specdec.theory import predicted_speedup
from specdec.util.printable import md_code

REPORT_NAME = "report.md"


def _f(x: float | None, digits: int = 2, suffix: str = "") -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.{digits}f}{suffix}"


def _ms(seconds: float | None) -> str:
    """Milliseconds with three significant digits."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    return f"{seconds * 1e3:.3g}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.1f} %"


def _ci(s: Spread) -> str:
    if not math.isfinite(s.ci_low):
        return f"{s.geomean:.2f}x (CI n/a: {s.n_prompts} prompt)"
    return f"{s.geomean:.2f}x [{s.ci_low:.2f}, {s.ci_high:.2f}]"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return [*out, ""]


@dataclass
class ReportData:
    """What the markdown and the plots are drawn from."""

    results: Results
    configs: list[str]
    modes: list[str]
    cells: dict[Cell, Spread]
    profiles: dict[str, Record]
    summaries: list[ConfigSummary] = field(default_factory=list)
    accept_curves: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    predicted: dict[tuple[str, str, int], float] = field(default_factory=dict)


def _ordered(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def build(results: Results) -> ReportData:
    ms = results.measurements
    configs = _ordered(
        [c["label"] for h in results.headers for c in h.get("plan", {}).get("configs", [])]
        + [m["config"] for m in ms]
    )
    configs = [c for c in configs if any(m["config"] == c for m in ms)]
    modes = [md for md in ("greedy", "sampled") if any(m["mode"] == md for m in ms)]
    modes += _ordered([m["mode"] for m in ms if m["mode"] not in modes])
    profiles = {c: p for c in configs if (p := results.profile_for(c)) is not None}
    data = ReportData(results, configs, modes, speedup_cells(ms), profiles)
    for (cfg, mode), group in group_by(ms, "config", "mode").items():
        reached, accepted = pooled_acceptance(group)
        data.accept_curves[(cfg, mode)] = rates(reached, accepted)
        prof = profiles.get(cfg)
        c = prof.get("c") if prof else None
        vr = prof.get("verify_ratio") if prof else None
        accept = fill_acceptance(reached, accepted)
        if c is None or not math.isfinite(c) or not accept:
            continue
        for k in sorted({m["k"] for m in group if m["k"] > 0}):
            structural = predicted_by_rounds([m for m in group if m["k"] == k], c, vr)
            if structural is not None:
                data.predicted[(cfg, mode, k)] = structural
            elif k <= len(accept):
                data.predicted[(cfg, mode, k)] = predicted_speedup(accept, k, c, vr)
    for cfg in configs:
        for mode in modes:
            if any(m["config"] == cfg and m["mode"] == mode for m in ms):
                data.summaries.append(
                    summarize_config(cfg, mode, data.cells, ms, profiles.get(cfg))
                )
    return data


def _setup_section(data: ReportData, source: Path) -> list[str]:
    r = data.results
    ms = r.measurements
    lines = [
        "# specdec bench report",
        "",
        f"Source: {md_code(source.name)}: {len(ms)} measurements of {len(data.configs)} "
        f"configuration(s) in {len(r.headers)} session(s).",
    ]
    if r.bad_lines:
        lines.append(f"Unreadable lines ignored: {len(r.bad_lines)} (line {r.bad_lines[0]} first).")
    if r.partial_tail:
        lines.append("The last line was cut short (an interrupted run) and is ignored.")
    lines += ["", "## Setup", ""]
    for h in r.headers:
        mach = h.get("machine", {})
        ver = h.get("versions", {})
        git = h.get("git", {})
        plan = h.get("plan", {})
        lines.append(f"Session {h.get('session')} (started {h.get('started')}):")
        lines.append(
            f"- machine: {mach.get('cpu')}, {mach.get('usable_cores')} usable of "
            f"{mach.get('cores')} cores, {mach.get('memory_gib')} GiB, torch threads "
            f"{mach.get('torch_threads')}, GPU {mach.get('cuda') or 'none'}"
        )
        lines.append(
            "- versions: "
            + ", ".join(f"{k} {v}" for k, v in ver.items() if v is not None)
            + f"; Python {mach.get('python')}"
        )
        commit = git.get("commit")
        dirty = " (with uncommitted changes)" if git.get("dirty") else ""
        lines.append(f"- source: commit {commit[:12] if commit else 'unknown'}{dirty}")
        if h.get("argv"):
            lines.append(f"- command: {md_code(' '.join(map(str, h['argv'])))}")
        lines.append(
            f"- plan: K {plan.get('ks')}, modes {plan.get('modes')}, "
            f"{plan.get('max_new_tokens')} new tokens, {plan.get('repeats')} repeat(s), "
            f"{len(h.get('prompts', []))} prompts, seed {plan.get('seed')}, chat "
            f"{plan.get('chat')}, stop on EOS {plan.get('stop_on_eos')}"
        )
        for c in plan.get("configs", []):
            d = c.get("draft") or {}
            t = c.get("target") or {}
            draft = (
                f"ngram {c['ngram']}"
                if c.get("ngram")
                else f"{d.get('model')} ({d.get('backend')}, {d.get('dtype')})"
            )
            lines.append(
                f"  - {c['label']}: {draft} -> {t.get('model')} ({t.get('backend')}, "
                f"{t.get('dtype')})"
            )
    cats = Counter(m["category"] for m in ms if m["k"] == 0)
    prompts = {m["prompt_id"] for m in ms}
    lines += [
        "",
        f"Prompts measured: {len(prompts)}; plain-decoding measurements per category: "
        + ", ".join(f"{c} {n}" for c, n in sorted(cats.items())),
        "",
    ]
    return lines


def _summary_section(data: ReportData) -> list[str]:
    rows = []
    for s in data.summaries:
        rows.append(
            [
                s.config,
                s.mode,
                str(s.best_k) if s.best_k is not None else "n/a",
                _ci(s.best) if s.best else "n/a",
                ", ".join(map(str, s.plateau)) or "n/a",
                _f(s.verify8),
                _f(s.c, 3),
                _f(s.c_flops, 3),
                _pct(s.acceptance),
                _f(s.predicted_best, 2, "x"),
                s.verdict,
            ]
        )
    lines = [
        "## Summary",
        "",
        "Speedup = tokens/s of speculative decoding / tokens/s of plain decoding of the same "
        "target, prompt, seed and repeat (prefill excluded). Point estimate: geometric mean over "
        "prompts x repeats; 95 % CI: percentile bootstrap resampling prompts (2,000 draws). "
        "Plateau: the K whose CI overlaps the best K's CI. verify(8)/verify(1) and c (draft step "
        "/ target step) come from the configuration's micro-profile; predicted best: the "
        "highest of the K measured by the speed model with each run's round structure and "
        "those costs (see Predicted vs measured), or, for result files without round "
        "structure, the best K by the pooled positional acceptance.",
        "",
    ]
    return lines + _table(
        [
            "configuration",
            "mode",
            "best K",
            "speedup at best K [95 % CI]",
            "plateau K",
            "verify(8)/verify(1)",
            "c",
            "c (FLOPs)",
            "acceptance",
            "predicted best",
            "verdict",
        ],
        rows,
    )


def _speedup_section(data: ReportData) -> list[str]:
    lines = ["## Speedup vs K", "", "![speedup vs K](speedup_vs_k.png)", ""]
    ms = data.results.measurements
    for (cfg, mode), group in group_by(ms, "config", "mode").items():
        lines.append(f"### {cfg}, {mode}")
        lines.append("")
        rows = []
        for k in sorted({m["k"] for m in group}):
            at = [m for m in group if m["k"] == k]
            tps = [m["tokens_per_second"] for m in at if m.get("tokens_per_second")]
            med_tps = float(np.median(tps)) if tps else float("nan")
            cell = data.cells.get((cfg, mode, k))
            rows.append(
                [
                    str(k),
                    str(len(at)),
                    _f(med_tps, 1),
                    _ci(cell) if cell else ("1 (baseline)" if k == 0 else "n/a"),
                    f"{_f(cell.median)} ({_f(cell.q25)}-{_f(cell.q75)})" if cell else "",
                    _f(mean_or_nan(m.get("mean_accepted_per_round") for m in at)) if k else "",
                    _f(data.predicted.get((cfg, mode, k)), 2, "x") if k else "",
                ]
            )
        lines += _table(
            [
                "K",
                "n",
                "tokens/s (median)",
                "speedup [95 % CI]",
                "median (IQR)",
                "accepted / round",
                "predicted",
            ],
            rows,
        )
    return lines


def _acceptance_section(data: ReportData) -> list[str]:
    lines = [
        "## Acceptance by draft position",
        "",
        "a_i = P(draft i accepted | drafts 1..i-1 accepted), counts pooled over prompts, "
        "repeats and K (each K contributes to positions 1..K).",
        "",
        "![acceptance by position](acceptance_by_position.png)",
        "",
    ]
    kmax = max((len(a) for a in data.accept_curves.values()), default=0)
    rows = []
    for (cfg, mode), a in data.accept_curves.items():
        group = [m for m in data.results.measurements if m["config"] == cfg and m["mode"] == mode]
        reached, _ = pooled_acceptance(group)
        rows.append(
            [cfg, mode, str(reached[0] if reached else 0)]
            + [_pct(a[i]) if i < len(a) else "" for i in range(kmax)]
        )
    lines += _table(
        ["configuration", "mode", "rounds at 1"] + [f"a_{i + 1}" for i in range(kmax)], rows
    )
    return lines


def _verify_section(data: ReportData) -> list[str]:
    lines = [
        "## Verify-batch scaling and step costs",
        "",
        "One target pass over n new tokens after the profiling context, median of the "
        "profile's repeats, as a ratio to n = 1 (1 everywhere = batch-parallel, n = serial).",
        "",
        "![verify scaling](verify_scaling.png)",
        "",
    ]
    show = (1, 2, 4, 5, 8, 16)
    rows = []
    for cfg, p in data.profiles.items():
        vr = p.get("verify_ratio") or []
        rows.append(
            [
                cfg,
                _ms(p.get("target_step_s")),
                _ms(p.get("draft_step_s")),
                _f(p.get("c"), 3),
                _f(p.get("c_flops"), 3),
                str(p.get("context_tokens")),
            ]
            + [_f(vr[n - 1]) if len(vr) >= n and vr[n - 1] is not None else "" for n in show]
        )
    lines += _table(
        ["configuration", "target step ms", "draft step ms", "c", "c (FLOPs)", "context"]
        + [f"v({n})/v(1)" for n in show],
        rows,
    )
    return lines


def _split_data(data: ReportData, mode: str) -> dict[str, dict[int, dict[str, float]]]:
    out: dict[str, dict[int, dict[str, float]]] = {}
    for (cfg, md, k), group in group_by(data.results.measurements, "config", "mode", "k").items():
        if md == mode:
            out.setdefault(cfg, {})[k] = time_split_fractions(group)
    return out


def _split_section(data: ReportData) -> list[str]:
    lines = [
        "## Time split",
        "",
        "Share of summed wall time (prefill included) per part; 'other' is the loop's own "
        "overhead (bookkeeping, cache rollback outside the timed sections, Python).",
        "",
        "![time split](time_split.png)",
        "",
    ]
    rows = []
    for mode in data.modes:
        for cfg, by_k in _split_data(data, mode).items():
            for k, fr in sorted(by_k.items()):
                rows.append([cfg, mode, str(k)] + [_pct(fr[p]) for p in plots.SPLIT_PARTS])
    return lines + _table(["configuration", "mode", "K", *plots.SPLIT_PARTS], rows)


def _category_data(data: ReportData, mode: str) -> dict[tuple[str, str], float]:
    out = {}
    for (cfg, md, cat), group in group_by(
        data.results.measurements, "config", "mode", "category"
    ).items():
        if md == mode:
            out[(cfg, cat)] = overall_rate(*pooled_acceptance(group))
    return out


def _category_section(data: ReportData) -> list[str]:
    lines = [
        "## Acceptance by prompt category",
        "",
        "Drafts accepted / drafts checked, pooled over positions, K, prompts and repeats; "
        "speedup: geometric mean over all K > 0 measurements of the category.",
        "",
        "![acceptance by category](acceptance_by_category.png)",
        "",
    ]
    rows = []
    for (cfg, mode, cat), group in group_by(
        data.results.measurements, "config", "mode", "category"
    ).items():
        spec = [m for m in group if m["k"] > 0]
        sp = [m["speedup"] for m in attach_speedups(group) if m["speedup"] > 0]
        geo = math.exp(sum(math.log(x) for x in sp) / len(sp)) if sp else float("nan")
        rows.append(
            [
                cfg,
                mode,
                cat,
                str(len({m["prompt_id"] for m in group})),
                _pct(overall_rate(*pooled_acceptance(group))),
                _f(mean_or_nan(m.get("mean_accepted_per_round") for m in spec)),
                _f(geo, 2, "x"),
            ]
        )
    return lines + _table(
        [
            "configuration",
            "mode",
            "category",
            "prompts",
            "acceptance",
            "accepted / round",
            "speedup (all K)",
        ],
        rows,
    )


PROMPT_BANDS = ((0, 128), (129, 512), (513, 10**9))  # prompt tokens: short, medium, long


def _band(n: int) -> str:
    lo, hi = next(b for b in PROMPT_BANDS if b[0] <= n <= b[1])
    return f"> {lo - 1}" if hi >= 10**9 else f"{lo}-{hi}"


TTFT_PLOT = "ttft_vs_prompt_length.png"


def _timed(data: ReportData) -> list[dict[str, Any]]:
    """Measurements that recorded TTFT (older result files did not)."""
    return [m for m in data.results.measurements if isinstance(m.get("ttft"), int | float)]


def _ttft_points(data: ReportData) -> dict[str, list[tuple[int, float]]]:
    """(prompt tokens, TTFT) of every timed run, by configuration and K ("plain" for K = 0
    of every configuration)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for m in _timed(data):
        label = "plain" if m["k"] == 0 else f"{m['config']} K={m['k']} ({m['mode']})"
        out.setdefault(label, []).append((int(m.get("prompt_tokens", 0)), float(m["ttft"])))
    return out


def _ttft_section(data: ReportData) -> list[str]:
    """Median time to first token and end-to-end time per configuration, K and prompt-length
    band (records written before TTFT was recorded are left out)."""
    ms = _timed(data)
    if not ms:
        return []
    lines = [
        "## Time to first token and end-to-end time",
        "",
        "Median over prompts and repeats, by prompt length in tokens. TTFT = prefill (target and "
        "draft) + the first round; end to end = the whole generation.",
        "",
        f"![TTFT vs prompt length]({TTFT_PLOT})",
        "",
    ]
    rows = []
    for (cfg, mode, k), group in sorted(
        group_by(ms, "config", "mode", "k").items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])
    ):
        by_band: dict[str, list[dict[str, Any]]] = {}
        for m in group:
            by_band.setdefault(_band(int(m.get("prompt_tokens", 0))), []).append(m)
        for band, items in sorted(
            by_band.items(), key=lambda kv: int(kv[0].split("-")[0].lstrip("> "))
        ):
            rows.append(
                [
                    cfg,
                    mode,
                    str(k),
                    band,
                    str(len(items)),
                    _f(statistics.median(float(m["ttft"]) for m in items), 2, " s"),
                    _f(statistics.median(float(m["t_total"]) for m in items), 2, " s"),
                ]
            )
    return lines + _table(
        ["configuration", "mode", "K", "prompt tokens", "runs", "TTFT", "end to end"], rows
    )


def _design_note(headers: Sequence[dict[str, Any]]) -> str:
    """Which plain baseline the run's design makes the better one."""
    modes = {bool(h.get("plan", {}).get("interleave", False)) for h in headers}
    if modes == {True}:
        return (
            "This file ran interleaved (`--interleave`): the configurations shared one target "
            "instance and took turns on each prompt, so every plain run here is the same "
            "computation at nearly the same time, and the median of them is a steadier "
            "baseline than a configuration's own single plain run (the Summary's pairing)."
        )
    if modes == {False}:
        return (
            "This file ran the configurations one after another (blocks): drift between "
            "blocks falls on whole configurations and on their plain runs alike, so the "
            "Summary's pairing with each configuration's own plain runs is the fairer "
            "comparison; `--interleave` removes the drift between configurations."
        )
    return "This file mixes interleaved and block sessions: compare with care."


def _baseline_section(data: ReportData) -> list[str]:
    """Every configuration and K against plain llama.cpp on the same file, per category:
    what a user would otherwise run (the fastest plain decoder measured here)."""
    plan_configs = [c for h in data.results.headers for c in h.get("plan", {}).get("configs", [])]
    baseline = baseline_configs(plan_configs)
    ms = data.results.measurements
    if not baseline or not any(m["k"] == 0 and m["config"] in baseline for m in ms):
        return []
    speed = against_baseline(ms, baseline)
    e2e = against_baseline(ms, baseline, "t_total")
    cats = _ordered([m["category"] for m in ms])
    lines = [
        "## Against plain llama.cpp on the same file",
        "",
        "Decode tokens/s of every configuration and K as a ratio to plain llama.cpp decoding "
        "of the same prompt, mode and repeat (the median of the K = 0 runs of the "
        f"configurations on llama.cpp: {', '.join(sorted(baseline))}); geometric mean per "
        "category, and over all prompts with a 95 % bootstrap CI over prompts. The last column "
        "is the same for end-to-end time (prefill included). Above 1.00x: faster than plain "
        "llama.cpp.",
        "",
        _design_note(data.results.headers),
        "",
    ]
    rows = []
    for (cfg, mode, k), items in sorted(speed.items(), key=lambda kv: kv[0]):
        by_cat: dict[str, list[float]] = {}
        for _, cat, r in items:
            by_cat.setdefault(cat, []).append(r)
        s = spread([r for _, _, r in items], [p for p, _, _ in items])
        e = e2e.get((cfg, mode, k), [])
        e_geo = math.exp(statistics.fmean(math.log(r) for _, _, r in e)) if e else math.nan
        rows.append(
            [cfg, mode, str(k)]
            + [
                _f(math.exp(statistics.fmean(math.log(r) for r in by_cat[c])), 2, "x")
                if c in by_cat
                else ""
                for c in cats
            ]
            + [_ci(s), _f(e_geo, 2, "x")]
        )
    return lines + _table(["configuration", "mode", "K", *cats, "all", "end to end"], rows)


def _predicted_points(data: ReportData, mode: str) -> dict[str, list[tuple[int, float, float]]]:
    out: dict[str, list[tuple[int, float, float]]] = {}
    for (cfg, md, k), pred in sorted(data.predicted.items()):
        cell = data.cells.get((cfg, md, k))
        if md == mode and cell is not None:
            out.setdefault(cfg, []).append((k, cell.geomean, pred))
    return out


def _predicted_section(data: ReportData) -> list[str]:
    lines = [
        "## Predicted vs measured speedup",
        "",
        "Predicted: each run's tokens over the cost of its rounds, every round charged "
        "for the drafts it really verified: verify(j+1)/verify(1) plus the draft's cost "
        "(j c for a draft model, c once per drafting round for a model-free lookup), with "
        "c and the verify curve from the micro-profile "
        "(`specdec.theory.predicted_speedup_from_rounds`; geometric mean over the cell's "
        "runs). So a drafter whose drafts are shorter than K (a suffix lookup without a "
        "match, the cost-aware planner) is not charged K. Result files written before runs "
        "recorded their draft lengths fall back to E[tokens per round] from the pooled "
        "positional acceptance / (K c + verify(K+1)/verify(1)). The model ignores sampling "
        "and loop overhead, so measured below predicted shows that overhead.",
        "",
        "![predicted vs measured](predicted_vs_measured.png)",
        "",
    ]
    rows = []
    for (cfg, mode, k), pred in sorted(data.predicted.items()):
        cell = data.cells.get((cfg, mode, k))
        meas = cell.geomean if cell else float("nan")
        rows.append([cfg, mode, str(k), _f(meas, 2, "x"), _f(pred, 2, "x"), _f(meas / pred, 2)])
    return lines + _table(
        ["configuration", "mode", "K", "measured", "predicted", "measured / predicted"], rows
    )


def _agreement_section(data: ReportData) -> list[str]:
    """Greedy outputs of speculative vs plain decoding (identical on batch-invariant backends)."""
    ms = data.results.measurements
    plain = {
        (m["config"], m["prompt_id"], m["repeat"]): m.get("tokens")
        for m in ms
        if m["k"] == 0 and m["mode"] == "greedy"
    }
    rows = []
    for cfg in data.configs:
        pairs = [
            (m.get("tokens"), plain.get((cfg, m["prompt_id"], m["repeat"])))
            for m in ms
            if m["config"] == cfg and m["mode"] == "greedy" and m["k"] > 0
        ]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if pairs:
            same = sum(a == b for a, b in pairs)
            rows.append([cfg, str(len(pairs)), str(same), _pct(same / len(pairs))])
    if not rows:
        return []
    return [
        "## Greedy agreement with plain decoding",
        "",
        "A sanity check, not a certificate: on backends whose logits depend on the batch shape "
        "a near-tie can flip between a K+1-token verify pass and one-token steps.",
        "",
        *_table(["configuration", "greedy runs", "identical to plain", "share"], rows),
    ]


def _prediction_section(data: ReportData) -> list[str]:
    """Predicted outputs (configurations with ``prediction=1``): per configuration, mode and
    fine category, the prediction tokens kept and rejected (OpenAI's counts) and the
    speedup over the configuration's own plain runs."""
    ms = [m for m in data.results.measurements if m.get("accepted_prediction_tokens") is not None]
    if not ms:
        return []
    rows = []
    for (cfg, mode, fine), group in sorted(group_by(ms, "config", "mode", "fine_category").items()):
        acc = sum(int(m["accepted_prediction_tokens"]) for m in group)
        rej = sum(int(m["rejected_prediction_tokens"]) for m in group)
        out = sum(int(m["n_tokens"]) for m in group)
        ups = [float(m["speedup"]) for m in group if m.get("speedup")]
        gm = math.exp(sum(math.log(u) for u in ups) / len(ups)) if ups else None
        rows.append(
            [
                cfg,
                mode,
                fine,
                str(len(group)),
                str(acc),
                str(rej),
                _pct(acc / (acc + rej)) if acc + rej else "-",
                _pct(acc / out) if out else "-",
                _f(gm, suffix="x"),
            ]
        )
    return [
        "## Predicted outputs",
        "",
        "Prediction tokens drafted and kept (OpenAI's accepted_prediction_tokens) or rejected, "
        "the share of the output that came from the prediction, and the speedup (geometric "
        "mean) over the same configuration's plain runs.",
        "",
        *_table(
            [
                "configuration",
                "mode",
                "task",
                "runs",
                "accepted",
                "rejected",
                "kept share",
                "output from prediction",
                "speedup",
            ],
            rows,
        ),
        "",
    ]


def _skip_section(results: Results) -> list[str]:
    if not results.skips:
        return []
    rows = [
        [s.get("config", ""), s.get("prompt_id", ""), s.get("reason", "")] for s in results.skips
    ]
    return ["## Skipped prompts", "", *_table(["configuration", "prompt", "reason"], rows)]


def write_report(results_path: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write report.md and the PNGs into out_dir (default: <results stem>-report/ beside the
    results file); return the markdown path."""
    src = Path(results_path)
    results = read_results(src)
    if not results.measurements:
        raise ConfigError(f"{src} holds no measurements to report")
    out = Path(out_dir) if out_dir is not None else src.with_name(f"{src.stem}-report")
    out.mkdir(parents=True, exist_ok=True)
    data = build(results)
    plot_mode = data.modes[0]
    plots.speedup_vs_k(data.cells, data.configs, data.modes, out / "speedup_vs_k.png")
    plots.acceptance_by_position(data.accept_curves, data.modes, out / "acceptance_by_position.png")
    plots.verify_scaling(
        {c: p.get("verify_ratio") or [] for c, p in data.profiles.items()},
        out / "verify_scaling.png",
    )
    plots.time_split(_split_data(data, plot_mode), plot_mode, out / "time_split.png")
    plots.acceptance_by_category(
        _category_data(data, plot_mode), data.configs, plot_mode, out / "acceptance_by_category.png"
    )
    plots.predicted_vs_measured(
        _predicted_points(data, plot_mode), out / "predicted_vs_measured.png"
    )
    ttft_points = _ttft_points(data)
    if ttft_points:
        plots.ttft_vs_prompt_length(ttft_points, out / TTFT_PLOT)
    lines: list[str] = []
    for section in (
        _setup_section(data, src),
        _summary_section(data),
        _speedup_section(data),
        _acceptance_section(data),
        _verify_section(data),
        _split_section(data),
        _category_section(data),
        _baseline_section(data),
        _ttft_section(data),
        _predicted_section(data),
        _prediction_section(data),
        _agreement_section(data),
        _skip_section(results),
    ):
        lines += section
    if len(data.modes) > 1:
        lines.append(
            f"Plots of time split, categories and predicted vs measured show mode {plot_mode}."
        )
        lines.append("")
    md = out / REPORT_NAME
    md.write_text("\n".join(lines), encoding="utf-8")
    return md


def report_summary(results_path: str | Path) -> list[dict[str, Any]]:
    """The summary rows as dicts (for programmatic use and tests)."""
    data = build(read_results(results_path))
    return [
        {
            "config": s.config,
            "mode": s.mode,
            "best_k": s.best_k,
            "speedup": s.best.geomean if s.best else None,
            "ci": (s.best.ci_low, s.best.ci_high) if s.best else None,
            "plateau": s.plateau,
            "verify8": s.verify8,
            "c": s.c,
            "verdict": s.verdict,
        }
        for s in data.summaries
    ]
