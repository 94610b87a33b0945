"""Log-probabilities from the rows the passes already computed (core.logprobs): their values,
speculative runs equal to plain decoding's bit for bit where the rows are (mock models; the
real target with exact numerics, marked), the prompt scored in bounded passes, and every
end-of-generation token of a model stopping the generation (mock, transformers, llama.cpp)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from specdec.core.logprobs import LogprobSpec, row_logprob, rows_logprobs
from specdec.core.loop import generate, score_prompt
from specdec.core.processors import LogitBias, Penalties, chain
from specdec.core.sampling import SamplingConfig
from specdec.drafters import NgramDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.errors import ConfigError
from specdec.models.mock import MockLM, MockSpec, mock_pair
from specdec.request import make_request
from tiny_models import llama_cpp_or_skip, store_model_or_skip, threads

VOCAB = 40


def test_row_logprob_is_log_softmax_with_rank_and_top() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        row = torch.randn(VOCAB, generator=gen) * 4
        row[3] = row[7]  # a tie
        row[11] = float("-inf")  # a token ruled out
        full = torch.log_softmax(row.double(), dim=-1)
        for tok in (3, 7, 11, 0):
            got = row_logprob(row, tok, 5, with_rank=True)
            assert abs(got.logprob - float(full[tok])) < 1e-6 or tok == 11
            assert got.rank == 1 + int((row > row[tok]).sum())
            order = sorted(range(VOCAB), key=lambda i: (-float(row[i]), i))[:5]
            assert [i for i, _ in got.top] == order
            assert all(abs(lp - float(full[i])) < 1e-6 for i, lp in got.top)
        assert row_logprob(row, 11, 0).logprob == float("-inf")
    with pytest.raises(ConfigError, match="top_logprobs"):
        LogprobSpec(21)
    with pytest.raises(ConfigError, match="logprobs_mode"):
        LogprobSpec(1, "logits")
    with pytest.raises(ConfigError, match="prompt_logprobs"):
        make_request("x", prompt_logprobs=-1)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        make_request("x", max_new_tokens=0)
    assert make_request("x", max_new_tokens=0, prompt_logprobs=0).max_new_tokens == 0


def drafters(draft: MockLM) -> list[object]:
    return [None, draft, NgramDrafter(2), SuffixDrafter()]


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_speculative_logprobs_equal_plain_decodings_bit_for_bit(mode: str) -> None:
    draft, target = mock_pair("close", vocab_size=VOCAB, order=2)
    rnd = random.Random(3)
    for trial in range(4):
        prompt = [rnd.randrange(VOCAB) for _ in range(rnd.randint(2, 8))]
        prompt += prompt  # something for the lookup drafters to copy

        def run(d: object, k: int, prompt: Sequence[int] = prompt, trial: int = trial) -> object:
            # odd trials: a logit bias and penalties, processed along the draft's path
            proc = None
            if trial % 2:
                bias = LogitBias({1: 3.0}, VOCAB)
                proc = chain([bias, Penalties(len(prompt), VOCAB, frequency=1.0)])
            return generate(
                target,
                d,
                prompt,
                max_new_tokens=30,
                k=k,
                stop_on_eos=False,
                processor=proc,
                logprobs=LogprobSpec(4, mode),
            )

        plain = run(None, 0)
        for d in drafters(draft)[1:]:
            spec = run(d, 4)
            assert spec.tokens == plain.tokens  # type: ignore[attr-defined]
            assert spec.logprobs == plain.logprobs  # type: ignore[attr-defined]
        assert len(plain.logprobs) == 30  # type: ignore[attr-defined]


class PassSizeMock(MockLM):
    """A target whose rows depend on how many tokens share the pass (as llama.cpp's default
    numerics do, here the logits scaled by 1 + 1e-4 per extra token): not batch-invariant."""

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        rows = super().extend(tokens, last_only=last_only)  # [n, V]
        return rows * (1.0 + 1e-4 * (len(tokens) - 1))


def test_a_target_whose_rows_depend_on_the_pass_size_is_caught() -> None:
    """The opposite verdict of the bit-for-bit test: the same comparison on a target that is
    not batch-invariant finds the speculative log-probabilities differ from plain decoding's
    (the tokens stay the same: scaling a row never reorders it)."""
    draft, good = mock_pair("close", vocab_size=VOCAB, order=2)
    target = PassSizeMock(good.spec)
    prompt = [3, 9, 4, 3, 9, 4]
    plain = generate(target, None, prompt, max_new_tokens=30, k=0, logprobs=LogprobSpec(4))
    spec = generate(target, draft, prompt, max_new_tokens=30, k=4, logprobs=LogprobSpec(4))
    assert spec.accepted_tokens > 0 and spec.tokens == plain.tokens
    assert spec.logprobs != plain.logprobs


def test_sampled_logprobs_are_each_tokens_own_row() -> None:
    draft, target = mock_pair("close", vocab_size=VOCAB, order=2)
    cfg = SamplingConfig(0.8, top_k=6)
    prompt = [1, 2, 3]
    res = generate(
        target,
        draft,
        prompt,
        max_new_tokens=25,
        k=3,
        sampling=cfg,
        seed=5,
        logprobs=LogprobSpec(2),
        stop_on_eos=False,
    )
    assert res.drafted_tokens > res.accepted_tokens > 0  # rounds with rejections
    ctx = list(prompt)
    for tok, lp in zip(res.tokens, res.logprobs or [], strict=True):
        want = torch.log_softmax(target.logits_for_context(ctx).double(), -1)[tok]
        assert lp.token == tok and abs(lp.logprob - float(want)) < 1e-6
        ctx.append(tok)
    processed = generate(
        target,
        draft,
        prompt,
        max_new_tokens=25,
        k=3,
        sampling=cfg,
        seed=5,
        logprobs=LogprobSpec(6, "processed"),
        stop_on_eos=False,
    )
    for lp in processed.logprobs or []:
        kept = [v for _, v in lp.top if v > float("-inf")]
        assert len(kept) == 6 and abs(sum(torch.tensor(kept).exp()) - 1.0) < 1e-5


class CountingMock(MockLM):
    """Records the size of each pass."""

    def __init__(self, spec: MockSpec) -> None:
        super().__init__(spec)
        self.passes: list[int] = []

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        self.passes.append(len(tokens))
        return super().extend(tokens, last_only=last_only)


def test_the_prompt_is_scored_in_bounded_passes_from_an_empty_cache() -> None:
    target = CountingMock(MockSpec(vocab_size=VOCAB, order=3))
    prompt = [random.Random(1).randrange(VOCAB) for _ in range(150)]
    generate(target, None, prompt[:100], max_new_tokens=2, k=0)  # a cached prefix to drop
    target.passes.clear()
    scored = score_prompt(target, prompt, 3, rows_per_pass=16)
    assert max(target.passes) <= 16 and sum(target.passes) == len(prompt) - 1
    assert scored[0] is None and len(scored) == len(prompt)
    for j in range(1, len(prompt)):
        row = target.logits_for_context(prompt[:j])
        assert scored[j] == row_logprob(row, prompt[j], 3, with_rank=True)
    assert score_prompt(target, prompt, 3, rows_per_pass=64) == scored
    res = generate(target, None, prompt, max_new_tokens=0, prompt_logprobs=3)
    assert res.tokens == [] and res.prompt_logprobs == scored and res.finish_reason == "length"
    draft, _ = mock_pair("close", vocab_size=VOCAB, order=3)
    with_rounds = generate(
        target, draft, prompt, max_new_tokens=5, k=3, prompt_logprobs=3, logprobs=LogprobSpec()
    )
    assert with_rounds.prompt_logprobs == scored and len(with_rounds.logprobs or []) == 5
    assert rows_logprobs(torch.zeros(2, VOCAB), [0], 0)[0].logprob == pytest.approx(
        -torch.log(torch.tensor(float(VOCAB))).item()
    )


# -- end of generation ---------------------------------------------------------------------


def test_every_end_of_generation_id_stops_every_drafter() -> None:
    draft, target = mock_pair("close", vocab_size=VOCAB, order=2)
    prompt = [4, 5, 6]
    free = target.greedy_continuation(prompt, 40)
    stop_at = next(i for i in range(3, len(free)) if free[i] not in free[:i] and free[i] != 1)
    spec = MockSpec(vocab_size=VOCAB, order=2, more_eos=(free[stop_at], VOCAB - 1))
    eog = MockLM(spec)
    assert eog.eos_token_ids == {1, free[stop_at], VOCAB - 1}
    for d in drafters(draft):
        res = generate(eog, d, prompt, max_new_tokens=40, k=0 if d is None else 4)
        assert res.tokens == free[: stop_at + 1] and res.finish_reason == "eos"
    from specdec.api import Pair

    done = Pair(eog, draft).generate(prompt, max_new_tokens=40, k=4)
    assert done.tokens == free[: stop_at + 1]
    assert done.text == "".join(f"<{t}>" for t in free[:stop_at])  # the EOG adds no text


def test_transformers_generation_config_lists_several_end_ids(tmp_path: object) -> None:
    pytest.importorskip("transformers")
    from pathlib import Path

    from specdec.models.hf import HFCausalLM
    from tiny_models import make_tiny_hf

    path = make_tiny_hf(Path(str(tmp_path)) / "tiny", seed=0)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path))
    model.generation_config.eos_token_id = [1, 40, 41]
    lm = HFCausalLM(model, AutoTokenizer.from_pretrained(str(path)), torch.device("cpu"), 256)
    assert lm.eos_token_ids == {1, 40, 41}


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_llama_cpp_stops_at_every_end_of_generation_token_of_qwen() -> None:
    llama_cpp_or_skip()
    from specdec.models.llamacpp import LlamaCppLM

    path = store_model_or_skip("qwen2.5-coder-0.5b-instruct-q4_k_m")
    lm = LlamaCppLM(path, n_ctx=64, n_threads=threads(), check_kernels=False)
    # <|endoftext|>, <|im_end|>, <|fim_pad|>, <|repo_name|>, <|file_sep|> (llama.cpp's set)
    assert {151643, 151645, 151662, 151663, 151664} <= lm.eos_token_ids
    assert 151644 not in lm.eos_token_ids  # <|im_start|> is no end


@pytest.mark.real_model
@pytest.mark.llamacpp
@pytest.mark.slow
def test_exact_numerics_give_plain_decodings_logprobs_bit_for_bit(tmp_path: Path) -> None:
    """The default pair (1.5B target, 0.5B draft model and the suffix drafter) with exact
    numerics: greedy speculative log-probabilities equal those of k=0, bit for bit. In a fresh
    process: ggml reads its row-invariant switch once, so a model run earlier in this one
    (another test's) would leave it off."""
    llama_cpp_or_skip()
    target = store_model_or_skip("qwen2.5-coder-1.5b-instruct-q4_k_m")
    draft = store_model_or_skip("qwen2.5-coder-0.5b-instruct-q4_k_m")
    code = f"""
import json
from specdec.core.logprobs import LogprobSpec
from specdec.core.loop import generate
from specdec.drafters.suffix import SuffixDrafter
from specdec.models.llamacpp import LlamaCppLM
target = LlamaCppLM({str(target)!r}, n_ctx=512, n_threads={threads()}, exact=True)
draft = LlamaCppLM({str(draft)!r}, n_ctx=512, n_threads={threads()}, exact=False)
prompt = target.tokenizer.encode("def fibonacci(n):\\n    # return the n-th Fibonacci number\\n")
spec = LogprobSpec(5)
plain = generate(target, None, prompt, max_new_tokens=48, k=0, logprobs=spec)
out = []
for d in (draft, SuffixDrafter()):
    res = generate(target, d, prompt, max_new_tokens=48, k=4, logprobs=spec)
    out.append([res.drafted_tokens, res.tokens == plain.tokens, res.logprobs == plain.logprobs])
print(json.dumps({{"n": len(plain.logprobs), "runs": out}}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_CPU_")}
    env["SPECDEC_EXACT_CHECKS"] = str(tmp_path)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["n"] == 48
    for drafted, same_tokens, same_logprobs in out["runs"]:
        assert drafted > 0 and same_tokens and same_logprobs, out
