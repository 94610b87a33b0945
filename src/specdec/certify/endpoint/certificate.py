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
3. **Per-token test** (``pertoken``), where both servers speak token ids
   (vLLM): every token of every spec-on sample scored against the spec-off server's row at
   its position; a fifth member of the Holm family.

Modules: ``plan`` (the sizes, quick or full), ``seeds``, ``greedy`` (part 1), ``sampled``
(part 2 and the joint Holm family), ``pertoken`` (part 3), ``run`` (the requests: resumable,
both servers at once), ``pace`` (where the time goes), this module (the certificate and what
a remote test cannot show, ``LIMITS``), ``report`` (its markdown and JSON files). The
statistics are ``specdec.stats``'; the HTTP client is ``specdec.endpoint``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from specdec.certify.common import FAIL, PASS, WARN
from specdec.util.jsonable import json_ready

from .greedy import GreedyCase
from .pertoken import EndpointPerTokenResult
from .sampled import StatisticTest

VERDICT = {PASS: "PASS", WARN: "PASS WITH CAVEATS", FAIL: "FAIL"}

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
    pertoken: EndpointPerTokenResult | None = None
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
