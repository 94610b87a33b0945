"""certificate.json (every number) and certificate.md (what was shown, what was not, and a
verdict), from the level results."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.util.jsonable import json_ready
from specdec.util.printable import md_code

from .common import FAIL, PASS, SKIPPED, WARN, fmt, worst_status
from .constrained import ConstrainedResult
from .invariance import InvarianceResult
from .mock_level import Level2Result
from .real import Level3Result
from .synthetic import Level1Result

NUMERICS_WORDS = {
    "exact": "exact (a token's logits are bit-identical in a pass of any size; checked at load "
    "and by the batch-invariance probe below), so plain decoding means the same numerics",
    "default": "the backend's default (a token's logits may depend on how many tokens share "
    "its pass)",
}

VERDICT_WORDS = {
    PASS: "PASS: no evidence of loss",
    WARN: "PASS WITH CAVEATS",
    FAIL: "FAIL",
    SKIPPED: "NOTHING CHECKED",
}


@dataclass
class Certificate:
    """Everything a certificate states; ``header`` holds the run's configuration."""

    header: dict[str, Any]
    level1: Level1Result | None = None
    level2: Level2Result | None = None
    level3: Level3Result | None = None
    constrained: ConstrainedResult | None = None  # --levels constrained
    probe: InvarianceResult | None = None  # --levels probe (without Level 3)
    draft_probe: InvarianceResult | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        levels = (self.level1, self.level2, self.constrained, self.level3)
        return worst_status([r.status for r in levels if r is not None])

    # -------------------------------------------------------------- verdict
    def key_numbers(self) -> list[str]:
        out = []
        if self.level1 is not None:
            s = self.level1.summary()
            out.append(
                f"L1 {s['status']}: exact max deviation {s['exact_max_deviation']:.2g} on "
                f"{s['exact_cases']} cases, {s['mc_rejected']}/{s['mc_tests']} Monte Carlo "
                "tests rejected"
            )
        if self.level2 is not None:
            s = self.level2.summary()
            out.append(
                f"L2 {s['status']}: greedy {s['greedy_units'] - s['greedy_mismatches']}/"
                f"{s['greedy_units']} bit-exact, {s['sampled_rejected']}/{s['sampled_tests']} "
                "sampled tests rejected"
            )
        if self.constrained is not None:
            s = self.constrained.summary()
            out.append(
                f"constrained ({', '.join(s['grammars'])}) {s['status']}: greedy "
                f"{s['greedy_units'] - s['greedy_mismatches']}/{s['greedy_units']} bit-exact, "
                f"{s['sampled_rejected']}/{s['sampled_tests']} sampled tests rejected (min p "
                f"{fmt(s['sampled_min_p'])}), {s['outside_support']} observations outside the "
                "constrained support"
            )
        if self.level3 is not None:
            r = self.level3
            s = r.summary()
            text = f"L3 {s['status']}:"
            if r.greedy:
                text += (
                    f" greedy {s['greedy_agree_plain']}/{s['greedy_prompts']} agree"
                    f" ({s['greedy_near_ties']} near-ties, {s['greedy_real_bugs']} real bugs)"
                )
            pt = r.pertoken
            if pt is not None:
                a = pt.shape_matched
                text += (
                    f"; per-token vs shape-matched rows p = {fmt(a.pvalue)}"
                    f"{' REJECTED' if a.rejected else ''} ({a.n} tokens, detects per-token TV "
                    f">= {fmt(pt.worst_power(pt.power_shape_matched))})"
                )
                if pt.plain is not None:
                    text += (
                        f"; vs plain p = {fmt(pt.plain.pvalue)}"
                        f"{' REJECTED' if pt.plain.rejected else ''}, measured per-token TV "
                        f"{fmt(pt.tv_plain)} ("
                        + (
                            f"95 % upper {fmt(pt.tv_plain_high)}"
                            if pt.n_plain_sequences > 1
                            else "no bound from 1 sequence"
                        )
                        + "; threshold "
                        f"{pt.tv_threshold:g}"
                        + (", EXCEEDED: batch-shape numerics" if pt.plain_effect_too_large else "")
                        + ")"
                    )
            if r.probe is not None:
                text += f"; batch-invariance gap {r.probe.max_abs:.3g}"
                if r.rollback_broken:
                    text += f", ROLLBACK ERROR {r.probe.rollback_max_abs:.3g}"
            out.append(text)
        if self.probe is not None:
            out.append(
                f"probe: max |logit diff| {self.probe.max_abs:.3g}, "
                f"{self.probe.argmax_flips} argmax flips"
            )
        return out

    def verdict_line(self) -> str:
        words = VERDICT_WORDS[self.status]
        if self.status == SKIPPED and self.probe is not None:
            words = "PROBE ONLY (no losslessness check was run)"
        prefix = ""
        if self.header.get("fault"):
            prefix = f"SELF-TEST with injected fault {self.header['fault']!r}: "
        suffix = " [quick run: a smoke test with low power, not a certificate]" * bool(
            self.header.get("quick")
        )
        return f"VERDICT: {prefix}{words} — " + "; ".join(self.key_numbers()) + suffix

    # -------------------------------------------------------------- outputs
    def to_dict(self) -> dict[str, Any]:
        return {
            "certificate": "specdec losslessness certificate",
            **self.header,
            "levels": {
                "1": self.level1.to_dict() if self.level1 else None,
                "2": self.level2.to_dict() if self.level2 else None,
                "3": self.level3.to_dict() if self.level3 else None,
                "constrained": self.constrained.to_dict() if self.constrained else None,
                "probe": self.probe.to_dict() if self.probe else None,
                "draft_probe": self.draft_probe.to_dict() if self.draft_probe else None,
            },
            "verdict": {"status": self.status, "line": self.verdict_line()},
            "not_shown": self.not_shown(),
            "notes": self.notes,
        }

    def not_shown(self) -> list[str]:
        out = [
            "Statistical tests cannot prove equality: a difference smaller than the stated "
            "detectable TV (80 % power) may be present and undetected.",
        ]
        if self.header.get("quick"):
            out.append(
                "This is a --quick run: sample sizes are small and the power is low; run "
                "without --quick for the certificate."
            )
        if self.level1 is None:
            out.append("Level 1 (the accept/reject walk on synthetic distributions) was not run.")
        else:
            out.append(
                "Level 1 covers one verification round on the listed case kinds (float32 "
                "inputs); exactness is to the stated tolerance, not bit-level."
            )
        if self.level2 is None:
            out.append("Level 2 (the decoding loop on exactly known mock models) was not run.")
        else:
            c = self.level2.config
            out.append(
                f"Level 2 uses mock models only; its sampled tests look at the token windows "
                f"{list(c.windows)} (start position, length), not at whole sequences."
            )
        if self.constrained is None:
            out.append(
                "The constrained level (the decoding loop under a grammar) was not run: nothing "
                "is shown about constrained decoding (--levels constrained)."
            )
        else:
            cc = self.constrained.config
            out.append(
                f"The constrained level uses mock models and the built-in grammars "
                f"{list(cc.grammars)} only, and looks at the token windows {list(cc.windows)}; "
                "the grammar engine's masks are taken as right (the reference uses the same "
                "engine), so what is shown is how the decoder applies them, not the engine."
            )
        if self.level3 is None:
            out.append(
                "Level 3 (the real draft/target/backend setup) was not run: nothing is shown "
                "about real models, their backends or their numerics."
            )
        else:
            c3 = self.level3.config
            out += [
                f"Level 3 holds for these models, backend, dtype, K = {c3.k} and sampling "
                f"(T = {c3.temperature:g}, top-k {c3.top_k}, top-p {c3.top_p:g}) on the "
                f"{len(self.level3.greedy)} greedy and {c3.sampled_prompts} sampled prompts "
                "used, not for other prompts or settings.",
                f"The per-token test covers the first {c3.sample_tokens} generated tokens of "
                f"each sequence on {c3.sampled_prompts} prompt(s); its power is stated for "
                "per-token differences whose excess mass sits in one region of the token order "
                "(draft-mixture, shift, tail, bump); a difference scattered finely over the "
                "order is not detectable by any test of this size.",
                "Reference (a) is the rows of the run's own verify passes, checked against the "
                "output and reproduced by a full replay on the plain-scored sequences; a backend "
                "whose logits change between identical calls fails that check.",
                self._plain_means(),
                "Speed is not certified here (see specdec bench).",
            ]
        return out

    def _plain_means(self) -> str:
        """What "plain decoding" is compared against, by the target's numerics."""
        runtime = self.header.get("target_runtime") or {}
        if runtime.get("numerics") == "exact":
            kv = runtime.get("kv_cache")
            cache = f", {kv.upper()} keys/values" if kv else ""
            return (
                "Plain decoding here is the target one token per pass in the same exact "
                f"numerics (llama.cpp with flash attention{cache}, only kernels whose rows do "
                "not depend on the pass size); llama.cpp's default settings compute other "
                "logits, so nothing is shown against plain decoding in those."
            )
        return (
            "Greedy bit-exactness with plain decoding is not expected on a backend whose "
            "logits depend on the batch shape; near-ties are explained, not excluded."
        )

    def to_markdown(self) -> str:
        h = self.header
        lines = [
            "# specdec certificate",
            "",
            f"**{self.verdict_line()}**",
            "",
            "## Setup",
            "",
            f"- specdec {h.get('specdec_version')}, created {h.get('created_utc')} "
            f"({'quick' if h.get('quick') else 'full'} run), seed {h.get('seed')}, "
            f"alpha {h.get('alpha')} (fixed before running), power target 80 %",
            f"- levels: {', '.join(h.get('levels_requested', []))}",
        ]
        if h.get("draft") or h.get("target"):
            lines.append(f"- draft: {md_code(h.get('draft'))}; target: {md_code(h.get('target'))}")
        numerics = (h.get("target_runtime") or {}).get("numerics")
        if numerics is not None:
            lines.append(f"- target numerics: {NUMERICS_WORDS.get(numerics, numerics)}")
        ggml_cpu = (h.get("target_runtime") or {}).get("ggml_cpu")
        if ggml_cpu is not None:
            lines.append(f"- llama.cpp: {ggml_cpu}")
        if h.get("prompts"):
            lines.append(f"- prompts: {h['prompts']}")
        if h.get("predictions"):
            lines.append(f"- predictions: {h['predictions']}")
        if h.get("constraints"):
            names = ", ".join(f"`{n}` ({d})" for n, d in h["constraints"].items())
            lines.append(f"- constrained decoding (the constrained level), grammars: {names}")
        if h.get("fault"):
            lines.append(f"- **fault injected on purpose: {h['fault']}** (self-test)")
        lines += ["", "## What was shown", ""]
        levels: tuple[tuple[str, Any], ...] = (
            ("Level 1: the accept/reject walk (synthetic p, q)", self.level1),
            ("Level 2: the decoding loop on mock models", self.level2),
            ("Constrained: the decoding loop under a grammar on mock models", self.constrained),
            ("Level 3: the real setup", self.level3),
        )
        for title, res in levels:
            if res is None:
                continue
            lines += [f"### {title} — {res.status.upper()}", ""]
            lines += [f"- {x}" for x in res.shown()]
            if isinstance(res, Level3Result):
                lines += [f"- Note: {x}" for x in res.notes()]
                if res.probe is not None:
                    lines += ["", res.probe.to_markdown()]
            lines.append("")
        if self.probe is not None:
            lines += ["### Batch-invariance probe", "", self.probe.to_markdown(), ""]
        if self.draft_probe is not None:
            lines += ["### Batch-invariance probe of the draft", ""]
            lines += [self.draft_probe.to_markdown(), ""]
        lines += ["## What was NOT shown", ""]
        lines += [f"- {x}" for x in self.not_shown()]
        lines += [f"- {x}" for x in self.notes]
        lines += [
            "",
            "## Method",
            "",
            "Nulls: the implementation's output has the target's distribution (Levels 1-2: "
            "the exactly known one; constrained: the exactly known one masked by the grammar "
            "and renormalised; Level 3: the rows of the target itself, recomputed in the "
            "speculative passes' shapes, and separately one token per pass). Units are "
            "independent (one round, or one sequence with its own seed); in Levels 1-2 and the "
            "constrained level rare categories are pooled to expected counts >= 5, Holm "
            "corrects within each family, the TV interval is distribution-free (95 %, over the "
            "full support; constrained: over the law's support) and the "
            "detectable TV is the TV on the pooled categories at which the chi-square test has "
            "80 % power (noncentral chi-square approximation, hardest-to-detect shape). Level 3 "
            "turns every sampled token into a randomised PIT value (i.i.d. U(0, 1) under the "
            "null, Rosenblatt 1952), tests uniformity with Anderson-Darling and a binned "
            "chi-square, and states its power by simulation. See docs/certify.md.",
            "",
            f"Reproduce: {md_code(h.get('command', 'specdec certify'))}",
            "",
        ]
        return "\n".join(lines)


def write_certificate(cert: Certificate, out_dir: Path) -> tuple[Path, Path]:
    """Write certificate.json and certificate.md into out_dir; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pj, pm = out_dir / "certificate.json", out_dir / "certificate.md"
    pj.write_text(
        json.dumps(json_ready(cert.to_dict()), indent=2, allow_nan=False) + "\n", encoding="utf-8"
    )
    pm.write_text(cert.to_markdown(), encoding="utf-8")
    return pj, pm
