"""Row processors (logit bias, penalties) on mock models: the rows of a round are those of
plain decoding position by position, greedy output is plain decoding's with the same
processor for every drafter, and sampled output has its exact distribution.

Thresholds (fixed before running): the sampled test draws 4,000 independent sequences (one
seed each) of 3 tokens and requires the chi-square p-value against the exactly computed law
to exceed 1e-3; the fault fixtures (rows not advanced along the draft's path; the processor
applied to the draft's rows only, the target's left as they are) must give a p-value below
1e-3 on the same test. Processing the target's rows and not the draft's is NOT a fault: the
accept/reject walk keeps the target's (processed) law for any draft distribution the drafts
were really drawn from, so it must pass (it only lowers acceptance).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.core.loop import generate
from specdec.core.model_drafter import ModelDrafter
from specdec.core.processors import (
    LogitBias,
    Penalties,
    ProcessorChain,
    RowProcessor,
    chain,
    legal_prefix,
)
from specdec.core.sampling import SamplingConfig, logits_to_probs
from specdec.drafters import NgramDrafter
from specdec.errors import ConfigError
from specdec.models.mock import MockLM, mock_pair
from specdec.request import make_request

VOCAB = 12


def penalties(prompt_len: int) -> Penalties:
    return Penalties(prompt_len, VOCAB, presence=0.7, frequency=1.5, repetition=1.3)


def one_at_a_time(
    proc: RowProcessor, context: list[int], path: list[int], logits: torch.Tensor
) -> torch.Tensor:
    return torch.stack(
        [proc.rows(context + path[:i], [], logits[i : i + 1])[0] for i in range(len(path) + 1)]
    )


@pytest.mark.parametrize("make", ["bias", "penalties", "chain"])
def test_rows_along_a_path_are_the_rows_of_each_prefix(make: str) -> None:
    rnd = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    for trial in range(40):
        prompt_len = rnd.randint(1, 6)
        context = [rnd.randrange(VOCAB) for _ in range(prompt_len + rnd.randint(0, 8))]
        path = [rnd.randrange(VOCAB) for _ in range(rnd.randint(0, 6))]
        logits = torch.randn(len(path) + 1, VOCAB, generator=gen) * 3  # [n, V]
        bias = LogitBias({1: 5.0, 3: -100.0, 7: 2.5}, VOCAB)
        proc: RowProcessor = {
            "bias": bias,
            "penalties": penalties(prompt_len),
            "chain": ProcessorChain([bias, penalties(prompt_len)]),
        }[make]
        fresh = {"bias": bias, "penalties": penalties(prompt_len)}.get(make, proc)
        got = proc.rows(context, path, logits)
        assert got.shape == logits.shape
        expected = one_at_a_time(fresh, context, path, logits)
        assert torch.equal(got, expected), trial
        assert legal_prefix(proc, context, path) == len(path)


def test_penalties_state_never_changes_a_result() -> None:
    # calls in any order (drafts, then the round's rows, a rollback) give what a fresh
    # processor gives for the same arguments
    rnd = random.Random(1)
    gen = torch.Generator().manual_seed(1)
    used = penalties(3)
    for _ in range(60):
        context = [rnd.randrange(VOCAB) for _ in range(rnd.randint(1, 14))]
        path = [rnd.randrange(VOCAB) for _ in range(rnd.randint(0, 4))]
        logits = torch.randn(len(path) + 1, VOCAB, generator=gen)
        assert torch.equal(
            used.rows(context, path, logits), penalties(3).rows(context, path, logits)
        )


def test_penalties_follow_vllm_rules() -> None:
    p = Penalties(2, 5, presence=0.5, frequency=0.25, repetition=2.0)
    logits = torch.tensor([[1.0, -1.0, 2.0, 3.0, -3.0]])
    # prompt [0, 1], output [2, 2]: token 2 twice in the output, 0 and 1 in the prompt only
    row = p.rows([0, 1, 2, 2], [], logits)[0]
    expected = torch.tensor([1.0 / 2.0, -1.0 * 2.0, 2.0 / 2.0 - 0.25 * 2 - 0.5, 3.0, -3.0])
    assert torch.allclose(row, expected)


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="outside"):
        LogitBias({VOCAB: 1.0}, VOCAB)
    with pytest.raises(ConfigError, match="-100, 100"):
        LogitBias({1: 101.0}, VOCAB)
    with pytest.raises(ConfigError, match="presence_penalty"):
        Penalties(1, VOCAB, presence=2.5)
    with pytest.raises(ConfigError, match="frequency_penalty"):
        Penalties(1, VOCAB, frequency=float("nan"))
    with pytest.raises(ConfigError, match="repetition_penalty"):
        Penalties(1, VOCAB, repetition=0.0)
    with pytest.raises(ConfigError, match="logit_bias"):
        make_request("x", logit_bias={"1": 1.0})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="logit_bias"):
        make_request("x", logit_bias={1: float("inf")})
    assert chain([None, None]) is None


def processors_for(prompt_len: int) -> list[RowProcessor]:
    return [
        LogitBias({2: 4.0, 5: -100.0}, VOCAB),
        penalties(prompt_len),
        ProcessorChain([LogitBias({4: 3.0}, VOCAB), penalties(prompt_len)]),
    ]


@pytest.mark.parametrize("closeness", ["identical", "close", "far"])
def test_greedy_output_is_plain_decodings_with_the_same_processor(closeness: str) -> None:
    draft, target = mock_pair(closeness, vocab_size=VOCAB, order=2)
    rnd = random.Random(2)
    changed = 0
    for _ in range(6):
        prompt = [rnd.randrange(VOCAB) for _ in range(rnd.randint(1, 6))]
        bare = generate(target, None, prompt, max_new_tokens=30, k=0, stop_on_eos=False)
        for i, proc in enumerate(processors_for(len(prompt))):
            plain = generate(
                target, None, prompt, max_new_tokens=30, k=0, stop_on_eos=False, processor=proc
            )
            changed += plain.tokens != bare.tokens
            for k in (1, 3, 6):
                fresh = processors_for(len(prompt))[i]
                spec = generate(
                    target,
                    draft,
                    prompt,
                    max_new_tokens=30,
                    k=k,
                    stop_on_eos=False,
                    processor=fresh,
                )
                assert spec.tokens == plain.tokens, (prompt, i, k)
            lookup = generate(
                target,
                NgramDrafter(2),
                prompt,
                max_new_tokens=30,
                k=4,
                stop_on_eos=False,
                processor=processors_for(len(prompt))[i],
            )
            assert lookup.tokens == plain.tokens
    assert changed >= 12  # the processors do change the output (the test is not vacuous)


class NotAlongThePath:
    """Fault fixture: every row of a round processed with the round's starting context, as
    a processor that forgot the draft's path would (its draft rows are right)."""

    def __init__(self, inner: RowProcessor) -> None:
        self.inner = inner

    def rows(
        self, context: Sequence[int], path: Sequence[int], logits: torch.Tensor
    ) -> torch.Tensor:
        return torch.cat(
            [self.inner.rows(context, [], logits[i : i + 1]) for i in range(len(logits))]
        )

    def legal_prefix(self, context: Sequence[int], path: Sequence[int]) -> int:
        return len(path)


def exact_first(
    target: MockLM, prompt: list[int], cfg: SamplingConfig, proc: RowProcessor, n: int
) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        nxt: dict[tuple[int, ...], float] = {}
        for seq, pr in out.items():
            ctx = prompt + list(seq)
            row = proc.rows(ctx, [], target.logits_for_context(ctx)[None])[0]
            probs = logits_to_probs(row, cfg).double()
            for tok in torch.nonzero(probs).flatten().tolist():
                nxt[(*seq, tok)] = pr * float(probs[tok])
        out = nxt
    return out


class DraftRowsWith:
    """A model drafter whose rows get ``processor`` whatever the round passes it: None for
    the target-only case, the processor itself for the draft-only fault."""

    def __init__(self, inner: ModelDrafter, processor: RowProcessor | None) -> None:
        self.inner = inner
        self.processor = processor

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def propose(self, ctx: Any, k: int, sampling: Any, gen: Any, processor: Any = None) -> Any:
        return self.inner.propose(ctx, k, sampling, gen, processor=self.processor)


def pvalue(fault: bool | str) -> float:
    """The chi-square p-value of 4,000 sampled sequences against the processed law; ``fault``
    True: rows not along the path; "draft-only": the target's rows unprocessed;
    "target-only": the draft's rows unprocessed (lossless)."""
    draft, target = mock_pair("close", vocab_size=6, order=1, sharpness=1.0)
    prompt = [0, 2]
    cfg = SamplingConfig(1.0)

    def penalties() -> Penalties:
        return Penalties(len(prompt), 6, frequency=2.0, presence=1.0)

    def proc() -> RowProcessor | None:
        if fault == "draft-only":
            return None
        return NotAlongThePath(penalties()) if fault is True else penalties()

    def drafter() -> Any:
        model_drafter = ModelDrafter(draft, vocab_size=6)
        if fault == "draft-only":
            return DraftRowsWith(model_drafter, penalties())
        if fault == "target-only":
            return DraftRowsWith(model_drafter, None)
        return draft

    exact = exact_first(
        target, prompt, cfg, Penalties(len(prompt), 6, frequency=2.0, presence=1.0), 3
    )
    keys = sorted(exact)
    counts = dict.fromkeys(keys, 0)
    n_seq = 4000
    for s in range(n_seq):
        res = generate(
            target,
            drafter(),
            prompt,
            max_new_tokens=3,
            k=3,
            sampling=cfg,
            seed=s,
            stop_on_eos=False,
            processor=proc(),
        )
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


def test_sampled_output_has_the_processed_distribution() -> None:
    assert pvalue(fault=False) > 1e-3


def test_rows_not_advanced_along_the_path_are_caught() -> None:
    assert pvalue(fault=True) < 1e-3


def test_processing_the_draft_rows_only_is_caught() -> None:
    assert pvalue(fault="draft-only") < 1e-3


def test_processing_the_target_rows_only_stays_lossless() -> None:
    assert pvalue(fault="target-only") > 1e-3
