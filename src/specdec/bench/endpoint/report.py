"""Markdown and a plot from a ``specdec bench --endpoint`` results file.

Per mode and concurrency, for spec-on and spec-off: median time to first token, median
decode tokens/s per request, median end-to-end latency, throughput (tokens of all the
level's groups over their summed wall time) and the draft acceptance the server reported;
then the speedup of spec-on over spec-off (throughput ratio, and the geometric mean over
requests of the paired end-to-end ratio: same prompt, same seed, same slot) and the first
concurrency at which speculation stops paying.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.errors import ConfigError
from specdec.util.printable import md_code, md_text

from .records import GroupKey, group_key, read_records

Level = tuple[str, int]  # (mode, concurrency)


@dataclass(frozen=True)
class SideSummary:
    n_requests: int
    ttft_ms: float
    decode_tps: float
    e2e_s: float
    throughput_tps: float
    acceptance: float  # accepted / drafted as reported (nan when not reported)
    drafted: int | None
    # requests on the wire at once, measured at the client (None: a file from before that)
    peak_in_flight: int | None = None
    mean_in_flight: float | None = None


@dataclass(frozen=True)
class LevelSummary:
    mode: str
    concurrency: int
    on: SideSummary
    off: SideSummary
    throughput_ratio: float  # on / off
    e2e_speedup: float  # geometric mean of off e2e / on e2e over paired requests
    n_pairs: int
    # pairs left out of the e2e speedup: the two replies differ in length (a reply cut
    # short, or outputs that differ), so their times are not of the same work
    n_unequal: int = 0


def complete_requests(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Request records of groups that finished (a group re-measured after a resume replaces
    the partial attempt, slot by slot)."""
    pending: dict[GroupKey, dict[int, dict[str, Any]]] = defaultdict(dict)
    out: list[dict[str, Any]] = []
    for rec in records:
        kind = rec.get("type")
        if kind == "endpoint_request":
            pending[group_key(rec)][int(rec["slot"])] = rec
        elif kind == "endpoint_group":
            out.extend(pending.pop(group_key(rec), {}).values())
    return out


def _median(xs: Sequence[float | None]) -> float:
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(vals) if vals else math.nan


def _side(reqs: list[dict[str, Any]], groups: list[dict[str, Any]]) -> SideSummary:
    drafted = [r["drafted"] for r in reqs if r.get("drafted") is not None]
    accepted = [r["accepted"] for r in reqs if r.get("accepted") is not None]
    g_drafted = [g["metrics_drafted"] for g in groups if g.get("metrics_drafted") is not None]
    g_accepted = [g["metrics_accepted"] for g in groups if g.get("metrics_accepted") is not None]
    if not drafted and g_drafted:
        drafted, accepted = g_drafted, g_accepted
    total_d = sum(drafted) if drafted else None
    acc = sum(accepted) / total_d if total_d else math.nan
    wall = sum(g["wall_s"] for g in groups)
    tokens = sum(g["n_tokens"] for g in groups)
    sent = [g for g in groups if g.get("peak_in_flight") is not None]
    sent_wall = sum(g["wall_s"] for g in sent)
    mean_sent = (
        sum(g["mean_in_flight"] * g["wall_s"] for g in sent if g.get("mean_in_flight") is not None)
        / sent_wall
        if sent and sent_wall > 0
        else None
    )
    return SideSummary(
        n_requests=len(reqs),
        ttft_ms=1000 * _median([r.get("ttft_s") for r in reqs]),
        decode_tps=_median([r.get("decode_tps") for r in reqs]),
        e2e_s=_median([r.get("e2e_s") for r in reqs]),
        throughput_tps=tokens / wall if wall > 0 else math.nan,
        acceptance=acc,
        drafted=total_d,
        peak_in_flight=max(g["peak_in_flight"] for g in sent) if sent else None,
        mean_in_flight=mean_sent,
    )


def summarise(records: Sequence[dict[str, Any]]) -> list[LevelSummary]:
    reqs = complete_requests(records)
    grps = [r for r in records if r.get("type") == "endpoint_group"]
    last_group: dict[GroupKey, dict[str, Any]] = {group_key(g): g for g in grps}
    levels = sorted({(str(r["mode"]), int(r["concurrency"])) for r in reqs})
    out = []
    for mode, c in levels:

        def pick(side: str, mode: str = mode, c: int = c) -> list[dict[str, Any]]:
            return [r for r in reqs if (r["mode"], r["concurrency"], r["side"]) == (mode, c, side)]

        def pick_groups(side: str, mode: str = mode, c: int = c) -> list[dict[str, Any]]:
            return [g for k, g in last_group.items() if (k[0], k[1], k[4]) == (mode, c, side)]

        on_r, off_r = pick("on"), pick("off")
        if not on_r or not off_r:
            continue
        on, off = _side(on_r, pick_groups("on")), _side(off_r, pick_groups("off"))
        off_by = {(r["repeat"], r["group"], r["slot"]): r for r in off_r}
        logs = []
        unequal = 0
        for r in on_r:
            o = off_by.get((r["repeat"], r["group"], r["slot"]))
            if o is None or not (r["e2e_s"] > 0 and o["e2e_s"] > 0):
                continue
            if r.get("n_tokens") != o.get("n_tokens"):
                unequal += 1  # another amount of work: no pair
                continue
            logs.append(math.log(o["e2e_s"] / r["e2e_s"]))
        out.append(
            LevelSummary(
                mode=mode,
                concurrency=c,
                on=on,
                off=off,
                throughput_ratio=on.throughput_tps / off.throughput_tps
                if off.throughput_tps > 0
                else math.nan,
                e2e_speedup=math.exp(statistics.fmean(logs)) if logs else math.nan,
                n_pairs=len(logs),
                n_unequal=unequal,
            )
        )
    return out


def stops_paying(levels: Sequence[LevelSummary], mode: str) -> int | None:
    """The lowest concurrency at which spec-on throughput is below spec-off (None: never)."""
    for s in sorted((x for x in levels if x.mode == mode), key=lambda x: x.concurrency):
        if s.throughput_ratio < 1.0:
            return s.concurrency
    return None


def _f(x: float | int | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}f}"


def _shown(x: Any) -> str:
    """A header field from the results file for the Markdown report: printable, bounded and
    escaped (it may hold anything: a server's model id, its notes)."""
    return md_text(x if x is not None else "n/a", 200)


def _fields(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _in_flight(side: SideSummary) -> str:
    if side.peak_in_flight is None:
        return "n/a"
    return f"{side.peak_in_flight} / {_f(side.mean_in_flight)}"


def short_of_concurrency(rows: Sequence[LevelSummary]) -> list[str]:
    """A line for each level whose client had fewer requests on the wire at once than the
    clients asked for (the achieved figure is the one to read)."""
    out = []
    for s in rows:
        for name, side in (("spec-on", s.on), ("spec-off", s.off)):
            if side.peak_in_flight is not None and side.peak_in_flight < s.concurrency:
                out.append(
                    f"At {s.concurrency} clients ({name}) at most {side.peak_in_flight} requests "
                    "were on the wire at once, measured at the client: the level measured that "
                    "concurrency, not the one asked for."
                )
    return ["", *out] if out else []


def render(records: Sequence[dict[str, Any]], plot_name: str | None = None) -> str:
    headers = [r for r in records if r.get("type") == "endpoint_header"]
    if not headers:
        raise ConfigError("no endpoint_header record: not a `specdec bench --endpoint` file")
    h = headers[-1]
    levels = summarise(records)
    lines = ["# Endpoint benchmark: speculation on vs off", ""]
    model = h.get("model")
    lines.append(f"- model: {md_code(model if model is not None else 'n/a', 200)}")
    lines[-1] += f" ({_shown(h.get('api'))} API)"
    if h.get("switch") == "per-request":
        lines.append(f"- server: {_shown(h.get('endpoint_on'))}; spec-off requests send n_max = 0")
    else:
        on, off = _shown(h.get("endpoint_on")), _shown(h.get("endpoint_off"))
        lines.append(f"- spec-on: {on}; spec-off: {off}")
    plan = _fields(h.get("plan"))
    prompt_ids = plan.get("prompt_ids")
    conc = plan.get("concurrency")
    lines.append(
        f"- {len(prompt_ids) if isinstance(prompt_ids, list) else '?'} prompts, "
        f"{_shown(plan.get('max_new_tokens'))} new tokens, {_shown(plan.get('repeats'))} "
        f"repeat(s), seed {_shown(plan.get('seed'))}; concurrency "
        f"{_shown(', '.join(map(str, conc)) if isinstance(conc, list) else conc)}"
    )
    notes = _fields(h.get("probe")).get("notes")
    for note in notes if isinstance(notes, list) else []:
        lines.append(f"- note: {_shown(note)}")
    lines.append("")
    for mode in dict.fromkeys(s.mode for s in levels):
        lines += [f"## {_shown(mode)}", ""]
        lines.append(
            "| clients | in flight (peak / mean) | side | requests | TTFT ms (median) | "
            "decode tok/s (median) | e2e s (median) | throughput tok/s | acceptance |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|")
        rows = [s for s in levels if s.mode == mode]
        for s in rows:
            for name, side in (("on", s.on), ("off", s.off)):
                lines.append(
                    f"| {s.concurrency} | {_in_flight(side)} | {name} | {side.n_requests} | "
                    f"{_f(side.ttft_ms)} | {_f(side.decode_tps)} | {_f(side.e2e_s, 3)} | "
                    f"{_f(side.throughput_tps)} | {_f(side.acceptance, 3)} |"
                )
        lines += short_of_concurrency(rows)
        lines += [
            "",
            "| clients | throughput on/off | e2e speedup (paired, geomean) | pairs | "
            "left out (lengths differ) |",
        ]
        lines.append("|---|---|---|---|---|")
        for s in rows:
            lines.append(
                f"| {s.concurrency} | {_f(s.throughput_ratio, 2)}x | {_f(s.e2e_speedup, 2)}x | "
                f"{s.n_pairs} | {s.n_unequal} |"
            )
        stop = stops_paying(levels, mode)
        lines.append("")
        lines.append(
            f"Speculation stops paying at {stop} concurrent client{'s' * (stop > 1)} (throughput "
            "on/off < 1)."
            if stop is not None
            else "Speculation paid (throughput on/off >= 1) at every concurrency measured."
        )
        lines.append("")
    if plot_name:
        lines += [f"![throughput and speedup by concurrency]({plot_name})", ""]
    lines.append(
        "Decode tok/s counts tokens after the first one; where a server reports no token "
        "count, streamed chunks are counted (one per token on llama.cpp servers). A server "
        "that streams several tokens per chunk (specdec serve: one chunk per verification "
        "round) puts several in the first one, which inflates decode tok/s of short "
        "generations; TTFT, e2e and throughput are not affected. Acceptance "
        "is accepted / drafted draft tokens as the server reported them (per response, or "
        "from /metrics around each group). In flight: requests on the wire at once, counted "
        "at the client from a request's first byte out to its close (peak, and the mean over "
        "the groups' time); a request waiting for a connection is not counted."
    )
    return "\n".join(lines) + "\n"


def plot(levels: Sequence[LevelSummary], path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    modes = list(dict.fromkeys(s.mode for s in levels))
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_t, ax_s = fig.subplots(1, 2)
    for mode in modes:
        rows = sorted((s for s in levels if s.mode == mode), key=lambda s: s.concurrency)
        cs = [s.concurrency for s in rows]
        ax_t.plot(cs, [s.on.throughput_tps for s in rows], "o-", label=f"{mode} on")
        ax_t.plot(cs, [s.off.throughput_tps for s in rows], "s--", label=f"{mode} off")
        ax_s.plot(cs, [s.throughput_ratio for s in rows], "o-", label=f"{mode} throughput")
        ax_s.plot(cs, [s.e2e_speedup for s in rows], "s--", label=f"{mode} e2e (paired)")
    ax_s.axhline(1.0, color="grey", lw=0.8)
    for ax, title in ((ax_t, "throughput, tokens/s"), (ax_s, "spec-on / spec-off")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.legend(fontsize=8)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path


def write_report(results: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write report.md and throughput.png into out_dir (default: <results stem>-report/
    beside the results file); return the markdown path."""
    src = Path(results)
    records = read_records(src)
    levels = summarise(records)
    if not levels:
        raise ConfigError(f"{src} holds no finished spec-on/spec-off groups to report")
    out = Path(out_dir) if out_dir is not None else src.with_name(f"{src.stem}-report")
    out.mkdir(parents=True, exist_ok=True)
    png = plot(levels, out / "throughput.png")
    md = out / "report.md"
    md.write_text(render(records, png.name), encoding="utf-8")
    return md
