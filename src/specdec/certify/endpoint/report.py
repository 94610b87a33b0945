"""The markdown and JSON files of an endpoint certificate (``certificate.md``,
``certificate.json``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from specdec.util.printable import md_code, md_text

from .certificate import LIMITS, VERDICT, EndpointCertificate
from .pertoken import ALTERNATIVES


def _src(source: str | None) -> str:
    return " (follow-up request)" if source == "follow-up" else ""


def _f(x: float | None, spec: str = ".3g") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, spec)


def render_markdown(cert: EndpointCertificate) -> str:
    p = cert.plan
    out = [f"# Endpoint certificate: {VERDICT[cert.status]}", ""]
    # the model name is the server's own (its /v1/models list), the notes and divergences hold
    # its text: each escaped for Markdown (util.printable), never able to open a link or HTML
    out += [f"- sides: {md_text(cert.sides)}", f"- model: {md_code(cert.model, 200)}"]
    out[-1] += f" ({md_text(cert.api)} API)"
    if cert.command:
        out.append(f"- command: {md_code(cert.command)}")
    out.append(f"- time: {cert.seconds:.0f} s (where it went: the Time section)")
    if p.get("n_predictions"):
        out.append(
            f"- {p['n_predictions']} of {p['n_prompts']} prompts carry a prediction (OpenAI's "
            "`prediction` field), sent with each of their requests to both sides"
        )
    if cert.drafted_on is not None:
        out.append(f"- spec-on drafted {cert.drafted_on} tokens, accepted {cert.accepted_on}")
    for n in cert.notes:
        out.append(f"- note: {md_text(n)}")
    out += ["", "## Greedy agreement", ""]
    out.append(
        f"{len(cert.greedy)} prompts, {p['greedy_tokens']} tokens, temperature 0; a divergence "
        f"is a near-tie only when both log-probability gaps are <= {p['tie_gap']:g} nats "
        "(fixed before the run)."
    )
    out.append("")
    for i, c in enumerate(cert.greedy):
        if c.status == "identical":
            out.append(f"- prompt {i + 1}: identical ({len(c.on_text)} characters)")
            continue
        out.append(
            f"- prompt {i + 1}: **{md_text(c.status)}** at character {c.char_index}: "
            f"{md_text(c.reason)}"
        )
        out.append(f"  - before: {md_code(repr(c.context))}")
        out.append(
            f"  - spec-on: {md_code(repr(c.on_next))}; spec-off: {md_code(repr(c.off_next))}"
        )
        if c.token_index is not None:
            out.append(
                f"  - tokens from {c.token_index}: spec-on {list(c.on_tokens or ())}, "
                f"spec-off {list(c.off_tokens or ())}; gaps (nats) on {_f(c.gap_on)}"
                f"{_src(c.gap_on_source)}, off {_f(c.gap_off)}{_src(c.gap_off_source)}"
            )
    if cert.tests:
        out += ["", "## Sampled two-sample tests", ""]
        out.append(
            f"{p['sampled_prompts']} prompts x {p['samples']} independent requests per side, "
            f"{p['sample_tokens']} tokens, temperature {p['temperature']:g}, top-p "
            f"{p['top_p']:g}, top-k {p['top_k']}; disjoint seeds per side; unit = one "
            f"request; chi-square homogeneity per prompt, summed over prompts; Holm at "
            f"alpha {p['alpha']:g}."
        )
        out += [
            "",
            "| statistic | chi2 | dof | p | Holm p | rejected | detects TV (80 %) | "
            "simulated power there |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for t in cert.tests:
            out.append(
                f"| {t.name} | {_f(t.statistic)} | {t.dof} | {_f(t.pvalue)} | "
                f"{_f(t.adjusted_p)} | {'**yes**' if t.rejected else 'no'} | "
                f"{_f(t.min_detectable_tv)} | {_f(t.simulated_power, '.2f')} |"
            )
        out.append("")
        out.append(
            "'Detects TV': the smallest total-variation distance on the pooled categories, "
            "present in every prompt, that the statistic's test finds with 80 % probability "
            "at alpha / 4 (analytic, noncentral chi-square); 'simulated power' re-checks it "
            f"with {p['power_trials']} seeded simulations of the very test, the spec-on side "
            "moved by that TV in proportion from the heavier to the lighter half of the "
            "observed pooled frequencies (the least detectable shape when the halves weigh "
            "the same; with a dominant category easier, so the check is optimistic there; "
            "n/a when no such shift exists)."
        )
    out += _pertoken_section(cert)
    out += ["", "## Power", "", md_text(cert.power_line())]  # it may quote a server
    out += _timing_section(cert)
    out += ["", "## What this cannot show", ""]
    out += [f"- {limit}" for limit in LIMITS]
    return "\n".join(out) + "\n"


def write_certificate(cert: EndpointCertificate, out_dir: str | Path) -> tuple[Path, Path]:
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    j = d / "certificate.json"
    m = d / "certificate.md"
    j.write_text(json.dumps(cert.to_dict(), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    m.write_text(render_markdown(cert), encoding="utf-8")
    return j, m


def _pertoken_section(cert: EndpointCertificate) -> list[str]:
    out = ["", "## Per-token test", ""]
    pt = cert.pertoken
    if pt is None:
        return [*out, f"Not run: {md_text(cert.pertoken_note or 'no sampled part')}."]
    u = pt.uniformity
    out.append(
        f"{pt.n_tokens} tokens of {pt.n_completions} spec-on completions, each scored against "
        f"the spec-off server's row at its position (prompt_logprobs, top {pt.top} by rank + "
        "one category for the rest of the vocabulary); randomised PIT, Anderson-Darling and "
        "a 20-bin chi-square of uniformity (Bonferroni), in the Holm family with the sampled "
        "statistics."
    )
    out += [
        "",
        "| tokens | in top N | impossible | AD p | chi2 p | p | Holm p | rejected | KS | "
        "TV lower bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {pt.n_tokens} | {_f(pt.in_top, '.1%')} | {pt.impossible} | {_f(u.ad_pvalue)} | "
        f"{_f(u.chi2_pvalue)} | {_f(pt.pvalue)} | {_f(pt.adjusted_p)} | "
        f"{'**yes**' if pt.rejected else 'no'} | {_f(u.ks_statistic)} | {_f(u.tv_lower)} |",
        "",
        "Smallest per-token TV (on the top-N + rest categories) found with 80 % probability "
        "at the level of Holm's first step (simulated): "
        + ", ".join(f"{a} {_f(pt.min_detectable_tv.get(a))}" for a in ALTERNATIVES)
        + " (shift-half: mass moved between the likelier and the less likely half of the "
        "order; tail-5%: into the 5 % of the order that holds the most likely tokens; "
        "bump-10%: into a middle 10 %).",
    ]
    return out


def _timing_section(cert: EndpointCertificate) -> list[str]:
    t = cert.timing
    if not t:
        return []
    out = ["", "## Time", ""]
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in t.get("phases_s", {}).items())
    out.append(f"Wall time {t.get('total_s', math.nan):.0f} s: {phases}.")
    for side in ("on", "off", "score"):
        s = t.get(side)
        if not s or not s.get("requests"):
            continue
        out.append(
            f"- {side}: {s['requests']} timed requests, {s['seconds']:.1f} s in all, median "
            f"{_f(s['median_s'])} s, max {_f(s['max_s'])} s, {s['retries']} retries"
        )
    if t.get("reused_from_progress"):
        out.append(f"- {t['reused_from_progress']} replies read back from the progress file")
    if t.get("slow_side"):
        out.append(f"- warning: {t['slow_side']}")
    return out
