"""PNG figures for the report (matplotlib's object API with the Agg canvas: no pyplot state)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from specdec.bench.analysis import Cell
from specdec.stats.bootstrap import Spread

SPLIT_PARTS = ("prefill", "draft", "verify", "sampling", "other")
SPLIT_COLORS = ("#9e9e9e", "#4c72b0", "#dd8452", "#55a868", "#c44e52")


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def speedup_vs_k(
    cells: dict[Cell, Spread], configs: Sequence[str], modes: Sequence[str], path: Path
) -> Path:
    fig = Figure(figsize=(5.5 * len(modes), 4.2), layout="constrained")
    axes = fig.subplots(1, len(modes), squeeze=False)[0]
    for ax, mode in zip(axes, modes, strict=True):
        for cfg in configs:
            ks = sorted(k for (c, m, k) in cells if c == cfg and m == mode)
            if not ks:
                continue
            g = [cells[(cfg, mode, k)].geomean for k in ks]
            lo = [cells[(cfg, mode, k)].ci_low for k in ks]
            hi = [cells[(cfg, mode, k)].ci_high for k in ks]
            line = ax.plot(ks, g, marker="o", label=cfg)[0]
            if all(_finite(x) for x in lo + hi):
                ax.fill_between(ks, lo, hi, color=line.get_color(), alpha=0.18, linewidth=0)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("K (drafted tokens per round)")
        ax.set_ylabel("speedup vs plain (geometric mean, 95 % CI)")
        ax.set_title(f"speedup vs K ({mode})")
        ax.legend(fontsize=8)
    return _save(fig, path)


def acceptance_by_position(
    curves: dict[tuple[str, str], list[float]], modes: Sequence[str], path: Path
) -> Path:
    fig = Figure(figsize=(5.5 * len(modes), 4.0), layout="constrained")
    axes = fig.subplots(1, len(modes), squeeze=False)[0]
    for ax, mode in zip(axes, modes, strict=True):
        for (cfg, m), a in curves.items():
            if m != mode or not a:
                continue
            ax.plot(range(1, len(a) + 1), a, marker="o", label=cfg)
        ax.set_ylim(0, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("draft position i")
        ax.set_ylabel("P(accept i | 1..i-1 accepted)")
        ax.set_title(f"acceptance by draft position ({mode})")
        ax.legend(fontsize=8)
    return _save(fig, path)


def verify_scaling(ratios: dict[str, list[float]], path: Path) -> Path:
    fig = Figure(figsize=(6.0, 4.2), layout="constrained")
    ax = fig.subplots()
    n_max = max((len(r) for r in ratios.values()), default=1)
    ns = list(range(1, n_max + 1))
    ax.plot(ns, ns, color="black", linewidth=0.8, linestyle=":", label="serial (n)")
    ax.plot(ns, [1.0] * n_max, color="black", linewidth=0.8, linestyle="--", label="parallel (1)")
    for cfg, r in ratios.items():
        ax.plot(range(1, len(r) + 1), r, marker="o", markersize=3, label=cfg)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("n (tokens in one target pass, after the profiling context)")
    ax.set_ylabel("verify(n) / verify(1)")
    ax.set_title("verify-batch scaling")
    ax.legend(fontsize=8)
    return _save(fig, path)


def time_split(splits: dict[str, dict[int, dict[str, float]]], mode: str, path: Path) -> Path:
    cfgs = list(splits)
    cols = min(3, max(1, len(cfgs)))
    rows = math.ceil(len(cfgs) / cols) if cfgs else 1
    fig = Figure(figsize=(4.6 * cols, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, cfg in zip(axes, cfgs, strict=False):
        ks = sorted(splits[cfg])
        bottom = [0.0] * len(ks)
        for part, color in zip(SPLIT_PARTS, SPLIT_COLORS, strict=True):
            vals = [splits[cfg][k].get(part, 0.0) for k in ks]
            vals = [v if _finite(v) else 0.0 for v in vals]
            ax.bar([str(k) for k in ks], vals, bottom=bottom, color=color, label=part)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_ylim(0, 1.0)
        ax.set_title(cfg, fontsize=9)
        ax.set_xlabel("K (0 = plain)")
        ax.set_ylabel("share of wall time")
    for ax in axes[len(cfgs) :]:
        ax.set_visible(False)
    if cfgs:
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles[::-1], labels[::-1], fontsize=8, loc="outside right center")
    fig.suptitle(f"time split ({mode})")
    return _save(fig, path)


def acceptance_by_category(
    table: dict[tuple[str, str], float], configs: Sequence[str], mode: str, path: Path
) -> Path:
    cats = sorted({cat for (_, cat) in table})
    fig = Figure(
        figsize=(max(6.0, 1.1 * len(cats) * max(1, len(configs)) * 0.5 + 3), 4.2),
        layout="constrained",
    )
    ax = fig.subplots()
    width = 0.8 / max(1, len(configs))
    for j, cfg in enumerate(configs):
        xs = [i + (j - (len(configs) - 1) / 2) * width for i in range(len(cats))]
        ys = [table.get((cfg, cat), float("nan")) for cat in cats]
        ax.bar(xs, [y if _finite(y) else 0.0 for y in ys], width=width, label=cfg)
    ax.set_xticks(range(len(cats)), cats, rotation=20)
    ax.set_ylim(0, 1.0)
    ax.set_ylabel("drafts accepted / drafts checked")
    ax.set_title(f"acceptance by prompt category ({mode})")
    ax.legend(fontsize=8)
    return _save(fig, path)


def predicted_vs_measured(points: dict[str, list[tuple[int, float, float]]], path: Path) -> Path:
    """points[config] = [(K, measured, predicted), ...]."""
    fig = Figure(figsize=(5.2, 5.0), layout="constrained")
    ax = fig.subplots()
    vals = [v for pts in points.values() for _, a, b in pts for v in (a, b) if _finite(v)]
    lo, hi = (min([*vals, 1.0]) * 0.9, max([*vals, 1.0]) * 1.1) if vals else (0.0, 2.0)
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, linestyle="--", label="y = x")
    for cfg, pts in points.items():
        good = [(k, a, b) for k, a, b in pts if _finite(a) and _finite(b)]
        if not good:
            continue
        sc = ax.scatter([a for _, a, _ in good], [b for _, _, b in good], label=cfg, s=22)
        for k, a, b in good:
            ax.annotate(
                str(k),
                (a, b),
                fontsize=6,
                color=sc.get_facecolor()[0],
                xytext=(2, 2),
                textcoords="offset points",
            )
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured speedup (geometric mean)")
    ax.set_ylabel("predicted speedup (theory, measured acceptance and costs)")
    ax.set_title("predicted vs measured (labels: K)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def ttft_vs_prompt_length(points: dict[str, list[tuple[int, float]]], path: Path) -> Path:
    """points[label] = [(prompt tokens, TTFT seconds), ...]: one marker per run."""
    fig = Figure(figsize=(6.5, 4.4), layout="constrained")
    ax = fig.subplots()
    for label, pts in points.items():
        if pts:
            xs, ys = zip(*sorted(pts), strict=True)
            ax.plot(xs, ys, marker="o", linestyle="none", alpha=0.75, label=label)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time to first token, s (prefill + first round)")
    ax.set_title("TTFT vs prompt length (one marker per run)")
    if points:
        ax.legend(fontsize=8)
    return _save(fig, path)
