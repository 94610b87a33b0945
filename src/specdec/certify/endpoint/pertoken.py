"""The per-token test of ``certify --endpoint``: every token the spec-on server sampled,
scored against the spec-off server's next-token distribution at that position.

Where both servers speak token ids (vLLM: ``return_tokens_as_token_ids`` on the spec-on side,
``prompt_logprobs`` and token-id prompts on the spec-off side, ``/tokenize`` for the prompt's
ids), each spec-on completion c_1..c_n of prompt P is sent back to the spec-off server as the
prompt P + c with ``prompt_logprobs = N``: one prefill pass that returns, for every position,
the top-N tokens by rank with their log-probabilities and the log-probability of the token
that is there. No re-tokenisation happens anywhere: the ids are the spec-on server's own.

The transform is the randomised PIT of ``specdec.stats.pit`` on a coarsened row: the top-N
tokens in rank order, then one category for the rest of the vocabulary (mass 1 - sum of the
top N). With V ~ U(0, 1) drawn by the client,

    U = F(x-) + V p(x)                 when x is among the top N,
    U = S_N + V (1 - S_N)              otherwise (S_N: the top N's mass),

is exactly U(0, 1) given the tokens before it when x is drawn from the spec-off row, so the U
of all tokens of all completions are i.i.d. U(0, 1) under the null (each is uniform given
everything before it; stopping at EOS depends only on the past). The sampled requests must
use temperature 1, top-p 1 and no top-k (the rows are the model's raw distribution).

What it cannot see: a difference confined to the tokens outside the top N (they are one
category); differences smaller than the numerics between the spec-off server's prefill pass
and its decoding passes. The stated power is for the TV on the coarsened categories.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from specdec.endpoint.client import EndpointClient, PromptRow, Request
from specdec.endpoint.errors import BadReply, EndpointError
from specdec.stats.alternatives import alternatives, common_uniforms, min_detectable_tv
from specdec.stats.pit import top_n_pit
from specdec.stats.uniformity import UniformityResult, uniformity_test

TOKEN_IDS: Mapping[str, Any] = MappingProxyType({"return_tokens_as_token_ids": True})
DEFAULT_TOP = 20  # vLLM's default --max-logprobs
# the order is the reference's own (most probable first), so the stated alternatives are the
# shapes of pit.alternatives() that do not assume a draft-ratio order
ALTERNATIVES = ("shift-half", "tail-5%", "bump-10%")


def scoring_request(
    prompt_ids: Sequence[int], completion: Sequence[int], top: int, *, label: str = "scoring"
) -> Request:
    """The spec-off request that returns the rows of every position of P + c."""
    return Request(
        tuple(prompt_ids) + tuple(completion),
        1,
        temperature=0.0,
        seed=0,
        stream=False,
        extra={"prompt_logprobs": top},
        label=label,
    )


async def probe_pertoken(on: EndpointClient, off: EndpointClient, top: int) -> str | None:
    """None when the per-token test can run against these servers, else why not (one line).
    Three small requests: /tokenize on the spec-off side, a sampled spec-on request asking for
    token ids, and a scoring request on the spec-off side."""
    if on.config.api != "completions":
        return "the per-token test needs the completions API"
    ids = await off.tokenize("Hello")
    if not ids:
        return f"{off.config.url} has no /tokenize route that returns token ids"
    try:
        r_on = await on.generate(
            Request(
                "Hello",
                2,
                temperature=1.0,
                seed=1,
                logprobs=1,
                stream=False,
                extra=TOKEN_IDS,
                label="per-token probe",
            )
        )
    except BadReply:
        raise
    except EndpointError as e:
        return f"the spec-on server refused a request for token ids ({e})"
    if not r_on.token_ids:
        return f"{on.config.url} returns no token ids (return_tokens_as_token_ids)"
    try:
        r_off = await off.generate(
            scoring_request(ids, r_on.token_ids, top, label="per-token probe")
        )
    except BadReply:
        raise
    except EndpointError as e:
        return f"the spec-off server refused a prompt_logprobs request ({e})"
    rows = r_off.prompt_logprobs
    if rows is None or len(rows) != len(ids) + len(r_on.token_ids):
        return f"{off.config.url} returns no prompt_logprobs for a token-id prompt"
    for j, tid in enumerate(r_on.token_ids):
        row = rows[len(ids) + j]
        if row is None or tid not in row or not any(1 <= r <= top for _, r in row.values()):
            return f"{off.config.url}'s prompt_logprobs rows lack the tokens or their ranks"
    return None


def pit_of_completion(
    rows: Sequence[PromptRow | None], completion: Sequence[int], v: np.ndarray, top: int
) -> list[float]:
    """U for each token of one completion; ``rows`` are the scoring reply's rows for the
    completion's positions (the last len(completion) prompt rows), v [n] the client's uniforms.
    nan for a token the reference gives probability 0 (impossible under the null)."""
    if len(rows) != len(completion) or v.shape[0] < len(completion):
        raise EndpointError("the scoring reply's rows do not line up with the completion")
    out: list[float] = []
    for j, tid in enumerate(completion):
        row = rows[j]
        if row is None or tid not in row:
            raise EndpointError("the scoring reply lacks the row of a sampled token")
        out.append(top_n_pit(row, tid, float(v[j]), top))
    return out


@dataclass(frozen=True)
class EndpointPerTokenResult:
    """The per-token test of an endpoint: the uniformity test of the pooled PIT values, where
    it stands in the certificate's Holm family, and its power."""

    uniformity: UniformityResult  # at the level of Holm's first step
    n_completions: int
    top: int  # N of the coarsened rows (top N + the rest)
    in_top: float  # fraction of sampled tokens among the spec-off row's top N
    min_detectable_tv: dict[str, float]  # per alternative, at the level of Holm's first step
    adjusted_p: float  # Holm, in the certificate's family
    rejected: bool

    @property
    def n_tokens(self) -> int:
        return self.uniformity.n

    @property
    def impossible(self) -> int:
        return self.uniformity.impossible

    @property
    def pvalue(self) -> float:
        """Bonferroni over the two tests of uniformity (0 with an impossible token)."""
        return self.uniformity.pvalue

    def to_dict(self) -> dict[str, Any]:
        u = self.uniformity
        return {
            "n_tokens": u.n,
            "n_completions": self.n_completions,
            "top": self.top,
            "impossible": u.impossible,
            "ad_pvalue": u.ad_pvalue,
            "chi2_pvalue": u.chi2_pvalue,
            "pvalue": u.pvalue,
            "adjusted_p": self.adjusted_p,
            "rejected": self.rejected,
            "ks_statistic": u.ks_statistic,
            "tv_lower": u.tv_lower,  # lower (1 - alpha) bound on the PIT's TV (DKW)
            "min_detectable_tv": dict(self.min_detectable_tv),
            "in_top": self.in_top,
        }


def pertoken_test(
    u: Sequence[float],
    *,
    n_completions: int,
    top: int,
    in_top: float,
    level: float,
    power: float,
    trials: int,
    rng: np.random.Generator,
) -> EndpointPerTokenResult:
    """The uniformity test of the pooled U (at ``level``; Holm is applied by the caller) and
    the smallest per-token TV it detects with ``power`` for each stated alternative (from
    ``trials`` simulated samples drawn once from ``rng``)."""
    arr = np.asarray(u, dtype=np.float64)
    res = uniformity_test(arr, level)
    alts = {a.name: a for a in alternatives()}
    base = common_uniforms(trials, res.n, rng)  # [trials, n]
    mdt = {name: min_detectable_tv(alts[name], base, level, power) for name in ALTERNATIVES}
    return EndpointPerTokenResult(res, n_completions, top, in_top, mdt, res.pvalue, res.rejected)
