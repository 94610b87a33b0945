"""The metric fields of a GenerationResult, by hand on made-up rounds and in --json."""

from __future__ import annotations

import json
import math

import pytest

from specdec.cli import main
from specdec.core.result import GenerationResult, Round


def result(rounds: list[tuple[int, int, int]], finish: str = "length") -> GenerationResult:
    stats = [Round(k, a, [5] * e, 0.0, 0.0, 0.0, 0.0) for k, a, e in rounds]
    tokens = [5] * sum(e for _, _, e in rounds)
    return GenerationResult([0], tokens, stats, finish, 0.0, 1.0)


def test_the_fields_match_their_definitions() -> None:
    # K=4 each round: all four kept, two kept, none kept; the last round was cut by EOS to 1
    res = result([(4, 4, 5), (4, 2, 3), (4, 0, 1), (4, 3, 1)], finish="eos")
    assert res.drafted_tokens == 16  # llama.cpp draft_n
    assert res.accepted_tokens == 9  # llama.cpp draft_n_accepted
    assert res.draft_acceptance_rate == pytest.approx(9 / 16)  # vLLM's per drafted token
    assert res.mean_acceptance_length == pytest.approx((9 + 4) / 4)  # before the EOS cut
    assert res.mean_tokens_per_round == pytest.approx(10 / 4)  # after it
    assert res.accepted_length_histogram() == [1, 0, 1, 1, 1]
    # conditional by position: reached 4, 3, 3, 2 times; accepted 3, 3, 2, 1
    assert res.acceptance_by_position() == pytest.approx([3 / 4, 3 / 3, 2 / 3, 1 / 2])
    d = res.to_dict()
    assert d["verification_rounds"] == 4 and d["accepted_length_histogram"] == [1, 0, 1, 1, 1]


def test_plain_decoding_and_no_rounds() -> None:
    plain = result([(0, 0, 1)] * 3)
    assert plain.drafted_tokens == 0 and plain.mean_acceptance_length == 1.0
    assert math.isnan(plain.draft_acceptance_rate)
    assert plain.accepted_length_histogram() == [3]
    empty = result([])
    assert math.isnan(empty.mean_acceptance_length) and empty.accepted_length_histogram() == [0]


def test_generate_json_has_the_fields_and_is_valid_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "hi", "--target", "mock:target", "--target-backend", "mock"]
    argv += ["--draft", "mock:close", "--draft-backend", "mock", "-n", "12", "--json", "-k", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    d = json.loads(out)  # allow_nan=False upstream: NaN would have raised
    assert d["draft_acceptance_rate"] is None and d["mean_acceptance_length"] == 1.0
    assert d["drafted_tokens"] == 0 and d["verification_rounds"] == d["rounds"]


def test_ttft_is_prefill_plus_the_first_round() -> None:

    r1 = Round(
        k=2, n_accepted=2, tokens=[5, 6, 7], t_draft=0.1, t_verify=0.2, t_sampling=0.0, t_round=0.35
    )
    r2 = Round(
        k=2, n_accepted=0, tokens=[8], t_draft=0.1, t_verify=0.2, t_sampling=0.0, t_round=0.3
    )
    res = GenerationResult([1, 2], [5, 6, 7, 8], [r1, r2], "length", t_prefill=1.25, t_total=2.0)
    assert res.ttft == pytest.approx(1.6)
    assert res.to_dict()["ttft"] == pytest.approx(1.6)
    empty = GenerationResult([1], [], [], "length", t_prefill=0.5, t_total=0.5)
    assert math.isnan(empty.ttft)
