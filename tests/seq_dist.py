"""Level-2 style check shared by drafter tests: the distribution of the first generated tokens
against the exactly computed target distribution (as in test_decoding.py, but for any prompt
and any drafter, reused across sequences: each generation resets it)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from scipy import stats

from specdec.core.drafter import Drafter
from specdec.core.loop import generate
from specdec.core.result import GenerationResult
from specdec.core.sampling import SamplingConfig, logits_to_probs
from specdec.models.mock import MockLM


def exact_first_tokens(
    target: MockLM, prompt: list[int], cfg: SamplingConfig, n: int
) -> dict[tuple[int, ...], float]:
    """P(first n generated tokens) computed exactly from the mock's known distribution."""
    out: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        nxt: dict[tuple[int, ...], float] = {}
        for seq, pr in out.items():
            probs = logits_to_probs(target.logits_for_context(prompt + list(seq)), cfg).double()
            for tok in torch.nonzero(probs).flatten().tolist():
                nxt[(*seq, tok)] = pr * float(probs[tok])
        out = nxt
    return out


def first_tokens_pvalue(
    target: MockLM,
    drafter: Drafter,
    prompt: list[int],
    *,
    k: int,
    cfg: SamplingConfig,
    n_tokens: int,
    n_seq: int,
    seed0: int,
    on_result: Callable[[GenerationResult], None] | None = None,
) -> float:
    """Chi-square p-value of n_seq independent generations (one seed each) of n_tokens tokens
    against the exact distribution; cells with expected count < 5 are pooled. 0.0 when a
    sequence of target probability 0 appears."""
    exact = exact_first_tokens(target, prompt, cfg, n_tokens)
    keys = sorted(exact)
    counts = dict.fromkeys(keys, 0)
    for s in range(n_seq):
        res = generate(
            target,
            drafter,
            prompt,
            max_new_tokens=n_tokens,
            k=k,
            sampling=cfg,
            seed=seed0 + s,
            stop_on_eos=False,
        )
        if on_result is not None:
            on_result(res)
        t = tuple(res.tokens)
        if t not in counts:
            return 0.0
        counts[t] += 1
    obs = np.array([counts[key] for key in keys], dtype=float)
    exp = np.array([exact[key] for key in keys])
    exp = exp / exp.sum() * n_seq
    small = exp < 5
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    return float(stats.chisquare(obs, exp).pvalue)
