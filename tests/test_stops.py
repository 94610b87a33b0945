"""Stop strings: exact across tokens and multi-token rounds, never a byte of text after one."""

from __future__ import annotations

import json
import random

import pytest

import specdec
from specdec.api import Pair
from specdec.cli import main
from specdec.core.stops import StopMatcher, check_stops, cut_at_stop, held_suffix_len
from specdec.errors import ConfigError

MOCK = {"target_backend": "mock", "draft_backend": "mock", "n_ctx": 256}


def stream_pieces(pieces: list[str], stops: list[str]) -> tuple[list[str], bool]:
    m = StopMatcher(stops)
    out = [m.push(p) for p in pieces]
    return [*out, m.flush()], m.stopped


def test_false_alarm_prefix_is_released_and_the_real_stop_cuts() -> None:
    out, stopped = stream_pieces(["ab", "X", "ab", "c", "tail"], ["abc"])
    assert out == ["", "abX", "", "", "", ""] and stopped
    assert "".join(out) == cut_at_stop("abXabctail", ["abc"]) == "abX"


def test_held_text_is_released_when_the_text_ends_without_a_stop() -> None:
    out, stopped = stream_pieces(["hello a", "b"], ["abc"])
    assert out == ["hello ", "", "ab"] and not stopped


def test_the_earliest_of_several_stops_wins_even_when_a_longer_one_started_first() -> None:
    # "xyz1" starts at 0 but never completes; "yz" completes first and ends the text at 1
    out, stopped = stream_pieces(["x", "y", "z", "2"], ["xyz1", "yz"])
    assert "".join(out) == "x" and stopped
    assert held_suffix_len("aaxy", ["xyz1", "yz"]) == 2


@pytest.mark.parametrize("seed", range(40))
def test_any_split_of_the_text_streams_exactly_the_cut_text(seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(rng.choice("ab") for _ in range(40))
    stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 5))) for _ in range(2)]
    cuts = sorted(rng.sample(range(1, 40), 8))
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, 40], strict=True)]
    m = StopMatcher(stops)
    shown = ""
    for p in pieces:
        shown += m.push(p)
        assert cut_at_stop(text, stops).startswith(shown)  # never text that is cut later
    shown += m.flush()
    assert shown == cut_at_stop(text, stops)


def test_validation() -> None:
    with pytest.raises(ConfigError, match="empty"):
        check_stops(["ok", ""])
    with pytest.raises(ConfigError, match="at most 4"):
        check_stops(["a", "b", "c", "d", "e"], limit=4)
    assert check_stops("abc") == ("abc",)
    assert check_stops(["a", "a", "b"]) == ("a", "b")
    assert check_stops(None) == ()


# -- through the generation: mock rounds that accept several tokens at once ------------------


def identical_pair() -> Pair:
    return specdec.load("mock:target", "mock:identical", **MOCK)  # type: ignore[arg-type]


def full_text(pair: Pair, k: int = 4) -> str:
    return pair.generate([0, 4, 5], max_new_tokens=30, k=k, stop_on_eos=False).text


def test_stops_that_cross_token_and_round_boundaries() -> None:
    pair = identical_pair()
    free = pair.generate([0, 4, 5], max_new_tokens=30, k=4, stop_on_eos=False)
    assert {r.n_accepted for r in free.result.rounds} == {4}  # 5 tokens per round
    text = free.text
    # a stop that spans the tokens 4..6 (the 5th and 6th tokens are in different rounds)
    tok_text = [pair.target.tokenizer.decode([t]) for t in free.tokens]
    start = sum(len(t) for t in tok_text[:4]) + 1  # inside token 5 (round 1)
    stop = text[start : start + len(tok_text[4]) + 2]  # ... into token 6 (round 2)
    for k in (4, 1, 0):  # one round, several rounds and plain steps hold the same text
        done = pair.generate([0, 4, 5], max_new_tokens=30, k=k, stop_on_eos=False, stop=stop)
        assert done.text == text[: text.find(stop)], k
        assert done.finish_reason == "stop"
        stream = pair.stream([0, 4, 5], max_new_tokens=30, k=k, stop_on_eos=False, stop=[stop])
        shown = ""
        for piece in stream:
            shown += piece
            assert text[: text.find(stop)].startswith(shown)
        assert shown == done.text


def test_generation_stops_at_the_round_that_completes_the_stop() -> None:
    pair = identical_pair()
    text = full_text(pair)
    stop = text[11:17]  # "<8><2>": the 4th and 5th tokens, the end of the first round
    done = pair.generate([0, 4, 5], max_new_tokens=30, k=4, stop_on_eos=False, stop=stop)
    assert done.result.n_rounds == 1 and len(done.tokens) == 5
    assert done.text == text[: text.find(stop)]
    stats = done.result.to_dict()
    assert stats["finish_reason"] == "stop" and stats["verification_rounds"] == 1


def test_a_stop_that_never_occurs_changes_nothing() -> None:
    pair = identical_pair()
    done = pair.generate([0, 4, 5], max_new_tokens=30, k=4, stop_on_eos=False, stop="<99>")
    assert done.text == full_text(pair) and done.finish_reason == "length"


def test_cli_stop_is_exact_and_repeatable(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "hi", "--target", "mock:target", "--draft", "mock:identical"]
    argv += ["--draft-backend", "mock", "--target-backend", "mock", "-k", "4", "--no-stop"]
    argv += ["-n", "30"]
    assert main([*argv, "--json"]) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    stop = text[13:19]
    assert main([*argv, "--stop", "<999>", "--stop", stop]) == 0
    out = capsys.readouterr().out
    assert out == text[: text.find(stop)] + "\n"
    assert main([*argv, "--stop", stop, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["text"] == text[: text.find(stop)] and res["finish_reason"] == "stop"
    assert main([*argv, "--stop", ""]) == 2
    assert "empty" in capsys.readouterr().err


def test_compare_with_a_stop_compares_the_cut_text(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "hi", "--target", "mock:target", "--draft", "mock:identical"]
    argv += ["--draft-backend", "mock", "--target-backend", "mock", "-k", "4", "--no-stop"]
    argv += ["-n", "30", "--json"]
    assert main(argv) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    assert main([*argv, "--compare", "--stop", text[13:19]]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["identical_output"] is True and res["text"] == text[: text.find(text[13:19])]
    assert len(res["speculative"]["tokens"]) != len(res["plain"]["tokens"])  # rounds differ
