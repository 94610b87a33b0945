"""specdec-vllm without vLLM: the wire format of ``prediction``, the step clock, and the
drafting adapter (``integrations/vllm``), driven by a simulated engine loop and by a recording
of a real vLLM server's steps (``tests/data/vllm-prediction-steps.jsonl``, written by the
plugin's SPECDEC_VLLM_RECORD; how it was made: ``docs/vllm-prediction.md``). The suite that
needs vLLM itself is ``test_vllm_plugin.py``."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integrations/vllm/src"))

from specdec_vllm import fault, settings, wire  # noqa: E402
from specdec_vllm.drafting import PredictionDrafts, Row  # noqa: E402
from specdec_vllm.step_costs import MIN_SAMPLES, PRIOR_SLOPE, WARMUP, StepClock  # noqa: E402

RECORDING = ROOT / "tests/data/vllm-prediction-steps.jsonl"


# -- the wire format ----------------------------------------------------------------------------


def test_prediction_text_takes_a_string_or_text_parts() -> None:
    assert wire.prediction_text({"type": "content", "content": "def f(): pass"}) == "def f(): pass"
    parts = {
        "type": "content",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    }
    assert wire.prediction_text(parts) == "ab"
    assert wire.prediction_text({"type": "content", "content": ""}) == ""


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ("def f(): pass", "prediction"),
        (None, "prediction"),
        ({"content": "x"}, "prediction.type"),
        ({"type": "text", "content": "x"}, "prediction.type"),
        ({"type": "content"}, "prediction.content"),
        ({"type": "content", "content": 3}, "prediction.content"),
        ({"type": "content", "content": [{"type": "image_url"}]}, "prediction.content.0"),
        ({"type": "content", "content": [{"type": "text", "text": 1}]}, "prediction.content.0"),
        ({"type": "content", "content": "x", "extra": 1}, "prediction.extra"),
        ({"type": "content", "content": "ok \ud800 no"}, "prediction.content"),
    ],
)
def test_a_wrong_prediction_is_refused_naming_the_field(value: object, param: str) -> None:
    with pytest.raises(wire.PredictionError) as e:
        wire.prediction_text(value)
    assert e.value.param == param


def test_lengths_and_fields_that_cannot_go_with_a_prediction() -> None:
    wire.check_length(2048, 2048)
    with pytest.raises(wire.PredictionError, match="longer than the model's window"):
        wire.check_length(2049, 2048)
    wire.check_request({"n": 1, "use_beam_search": False, "vllm_xargs": {"other": 1}})
    wire.check_request({"prompt": "x"})
    wire.check_request({"prompt": [1, 2, 3]})  # one prompt as token ids
    wire.check_request({"prompt": ["x"]})
    for fields, param in (
        ({"n": 2}, "n"),
        ({"prompt": ["x", "y"]}, "prompt"),
        ({"prompt": [[1], [2]]}, "prompt"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"vllm_xargs": {wire.XARG: [1, 2]}}, f"vllm_xargs.{wire.XARG}"),
    ):
        with pytest.raises(wire.PredictionError) as e:
            wire.check_request(fields)
        assert e.value.param == param


def test_token_ids_from_extra_args_are_checked() -> None:
    assert wire.token_ids([1, 2, 3], vocab=10, window=5) == [1, 2, 3]
    assert wire.token_ids([], vocab=10, window=5) == []
    for bad in (None, "123", [1, 10], [-1], [1.0], [True], list(range(6))):
        assert wire.token_ids(bad, vocab=10, window=5) is None


def _reply(drafted: int, accepted: int) -> dict[str, object]:
    spec = {"num_draft_tokens": drafted, "num_accepted_draft_tokens": accepted}
    return {
        "choices": [{"text": "x"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 9, "completion_tokens_details": None},
        "metrics": {"speculative_decoding": spec},
    }


def test_usage_counts_come_from_vllms_per_request_counters() -> None:
    body = _reply(drafted=40, accepted=31)
    assert wire.add_usage(body, predicted=True)
    details = body["usage"]["completion_tokens_details"]  # type: ignore[index]
    assert details == {wire.ACCEPTED: 31, wire.REJECTED: 9}
    body = _reply(drafted=40, accepted=31)  # drafts of the n-gram fallback: not a prediction's
    wire.add_usage(body, predicted=False)
    assert body["usage"]["completion_tokens_details"] == {wire.ACCEPTED: 0, wire.REJECTED: 0}  # type: ignore[index]
    assert not wire.add_usage({"choices": []}, predicted=True)  # no usage asked for
    assert wire.counts(None) == (0, 0)
    assert wire.counts({"speculative_decoding": None}) == (0, 0)


def test_only_the_final_usage_chunk_of_a_stream_is_rewritten() -> None:
    delta = 'data: {"choices":[{"delta":{"content":"x"}}],"usage":null}\n\n'
    assert wire.rewrite_sse(delta, predicted=True) is delta
    assert wire.rewrite_sse("data: [DONE]\n\n", predicted=True) == "data: [DONE]\n\n"
    final = _reply(drafted=5, accepted=5)
    final["choices"] = []
    item = "data: " + json.dumps(final) + "\n\n"
    out = wire.rewrite_sse(item.encode(), predicted=True)
    assert isinstance(out, bytes)
    chunk = json.loads(out.decode().split("\n")[0][len("data: ") :])
    assert chunk["usage"]["completion_tokens_details"] == {wire.ACCEPTED: 5, wire.REJECTED: 0}


def test_the_ngram_setting() -> None:
    assert settings.parse_ngram("2,4,4", k=16) == settings.Ngram(2, 4, 4)
    assert settings.parse_ngram("off", k=16) is None
    for bad in ("2,4", "4,2,4", "0,2,4", "2,4,17", "a,b,c"):
        with pytest.raises(ValueError, match=settings.NGRAM_ENV):
            settings.parse_ngram(bad, k=16)
    s = settings.Settings.from_env(16, {})
    assert s.ngram == settings.Ngram(2, 4, 4) and s.record is None and s.step_costs is None


def test_the_step_costs_setting_fixes_the_clocks_line() -> None:
    s = settings.Settings.from_env(16, {settings.STEP_COSTS_ENV: "1,0.02"})
    assert s.step_costs == (1.0, 0.02)
    for bad in ("1", "0,1", "1,-1", "x,1", "inf,0"):
        with pytest.raises(ValueError, match=settings.STEP_COSTS_ENV):
            settings.parse_step_costs(bad)
    clock = StepClock(skipped_warmup=WARMUP, fixed=(1.0, 0.5))
    for t, sec in ((1, 0.1), (9, 0.9)):
        for _ in range(MIN_SAMPLES):
            clock.observe(t, sec)
    assert clock.line() == (1.0, 0.5)  # what the steps took does not move a fixed line
    assert clock.seconds(3) == pytest.approx(2.0)


def test_the_fault_setting_keeps_every_draft_and_is_off_unless_asked() -> None:
    """The fault fixture of the vLLM checks (``SPECDEC_VLLM_FAULT=keep-drafts``) on a stand-in
    for vLLM's rejection module: the greedy kernel sees the drafts as the target's argmax
    (padded positions keep the target's), its other attributes are its own, and nothing is
    changed without the variable."""
    import torch

    assert settings.Settings.from_env(16, {}).fault is None
    assert settings.Settings.from_env(16, {fault.FAULT_ENV: "keep-drafts"}).fault == "keep-drafts"
    with pytest.raises(ValueError, match=fault.FAULT_ENV):
        settings.Settings.from_env(16, {fault.FAULT_ENV: "keep"})

    seen: list[list[int]] = []

    class Kernel:
        warmups = 1

        def __call__(self, out: Any, cu: Any, drafts: Any, argmax: Any, *rest: Any) -> None:
            seen.append(argmax.tolist())

    module = type("Module", (), {"_rejection_greedy_sample": Kernel()})()
    assert not fault.install_fault(None, module) and isinstance(
        module._rejection_greedy_sample, Kernel
    )
    assert fault.install_fault("keep-drafts", module)
    assert fault.install_fault("keep-drafts", module)  # once: not wrapped twice
    kernel = module._rejection_greedy_sample
    assert isinstance(kernel, fault.KeepDrafts) and isinstance(kernel.kernel, Kernel)
    assert kernel.warmups == 1
    argmax = torch.tensor([5, 6, 7, 8])
    kernel(None, torch.tensor([2, 4]), torch.tensor([1, 2, 3, -1]), argmax, 4)
    assert seen == [[1, 2, 3, 8]] and argmax.tolist() == [5, 6, 7, 8]
    with pytest.raises(RuntimeError, match="no _rejection_greedy_sample"):
        fault.install_fault("keep-drafts", type("OtherVllm", (), {})())


# -- the step clock -----------------------------------------------------------------------------


def test_before_any_step_the_curve_is_the_flat_prior() -> None:
    clock = StepClock()
    assert clock.line() == (1.0, PRIOR_SLOPE)
    costs = clock.costs(others=2, k=4)
    assert len(costs.verify_s) == 5  # a pass of 1..K+1 rows for this request
    assert costs.verify_s == pytest.approx([1.0 + PRIOR_SLOPE * (2 + n) for n in range(5)])


def test_the_clock_fits_a_line_through_medians_and_drops_warmup_and_idleness() -> None:
    clock = StepClock()
    for _ in range(WARMUP):
        assert not clock.observe(5, 100.0)  # first steps: compiled kernels, not kept
    for s in (0.10, 0.12, 0.11):
        assert clock.observe(1, s)
    a, b = clock.line()  # one count measured: the prior's slope, anchored there
    assert a == pytest.approx(0.11) and b == pytest.approx(PRIOR_SLOPE * 0.11)
    for s in (0.27, 0.26, 0.9, 0.27):  # one slow step among them: the median ignores it
        assert clock.observe(17, s)
    a, b = clock.line()
    assert a == pytest.approx(0.11) and b == pytest.approx(0.01)
    assert clock.seconds(9) == pytest.approx(0.19)
    assert not clock.observe(2, 10.0)  # a gap of 80 steps: the engine was idle
    assert len(clock.samples[1]) == MIN_SAMPLES


def test_the_fitted_line_never_falls_and_stays_positive() -> None:
    clock = StepClock(skipped_warmup=WARMUP)
    for t, s in ((1, 0.3), (9, 0.1), (17, 0.2)):
        for _ in range(MIN_SAMPLES):
            clock.observe(t, s)
    a, b = clock.line()
    assert a > 0 and b == 0.0
    clock = StepClock(skipped_warmup=WARMUP)
    for t, s in ((5, 0.05), (9, 0.5)):
        for _ in range(MIN_SAMPLES):
            clock.observe(t, s)
    a, b = clock.line()
    assert a > 0 and b > 0 and clock.seconds(1) == pytest.approx(a)


# -- the adapter in a simulated engine ----------------------------------------------------------


class Engine:
    """vLLM's loop for one greedy request whose output is fixed in advance: a step verifies
    the row's draft against it (the longest agreeing prefix, then the target's own token)."""

    def __init__(self, prompt: Sequence[int], output: Sequence[int], max_tokens: int) -> None:
        self.prompt, self.output, self.max_tokens = list(prompt), list(output), max_tokens
        self.done: list[int] = []
        self.drafted = self.accepted = 0

    def row(self, sampled: int, prediction: Sequence[int] | None, req_id: str = "r") -> Row:
        room = self.max_tokens - len(self.done) - 1
        return Row(req_id, self.prompt + self.done, len(self.prompt), sampled, room, prediction)

    def verify(self, draft: Sequence[int]) -> int:
        """Append what the step keeps; the tokens it sampled."""
        at = len(self.done)
        kept = 0
        while kept < len(draft) and draft[kept] == self.output[at + kept]:
            kept += 1
        self.drafted += len(draft)
        self.accepted += kept
        new = self.output[at : at + kept + 1]
        self.done += new[: self.max_tokens - at]
        return len(new)

    def run(self, drafts: PredictionDrafts, prediction: Sequence[int] | None) -> list[int]:
        sampled = self.verify([])  # the prefill step samples the first token
        while len(self.done) < self.max_tokens:
            (draft,) = drafts.step([self.row(sampled, prediction)], elapsed_s=None)
            sampled = self.verify(draft)
        return self.done


PROMPT = list(range(100, 130))
OUTPUT = [7, 8, 9, *list(range(200, 260)), 9, 8, 7, *list(range(300, 340))]


def test_a_prediction_equal_to_the_output_is_drafted_from_the_right_offset() -> None:
    engine = Engine(PROMPT, OUTPUT, max_tokens=len(OUTPUT))
    drafts = PredictionDrafts(k=16)
    # the first proposal comes after the first output token: it must continue from OUTPUT[1]
    engine.verify([])
    (first,) = drafts.step([engine.row(1, OUTPUT)], elapsed_s=None)
    assert first and first == OUTPUT[1 : 1 + len(first)]


def test_greedy_output_is_the_engines_whatever_the_prediction() -> None:
    rng = random.Random(0)
    edited = [*OUTPUT[:20], 1, 2, 3, *OUTPUT[25:50], *OUTPUT[52:]]
    shuffled = rng.sample(OUTPUT, len(OUTPUT))
    for prediction in (OUTPUT, edited, shuffled, [], OUTPUT[10:], None):
        engine = Engine(PROMPT, OUTPUT, max_tokens=len(OUTPUT))
        assert engine.run(PredictionDrafts(k=16), prediction) == OUTPUT
    exact = Engine(PROMPT, OUTPUT, max_tokens=len(OUTPUT))
    exact.run(PredictionDrafts(k=16), OUTPUT)
    assert exact.drafted == exact.accepted  # nothing of an exact prediction is rejected
    assert exact.accepted > 0.8 * len(OUTPUT)  # and nearly all of the output came from it


def test_edits_resync_and_are_counted_from_the_prediction_alone() -> None:
    edited = [*OUTPUT[:20], 1, 2, 3, *OUTPUT[25:]]
    engine = Engine(PROMPT, OUTPUT, max_tokens=len(OUTPUT))
    calls: list[list[int]] = []

    def fallback(idx: list[int]) -> list[list[int]]:
        calls.append(idx)
        return [[5, 5, 5] for _ in idx]

    drafts = PredictionDrafts(k=16)
    sampled = engine.verify([])
    steps = 0
    while len(engine.done) < engine.max_tokens:
        (d,) = drafts.step([engine.row(sampled, edited)], elapsed_s=None, fallback=fallback)
        sampled = engine.verify(d)
        steps += 1
    assert calls == []  # a request with a prediction never gets the fallback's drafts
    # it rejoined the prediction after the edit: 105 tokens in at most 16 steps (plain
    # decoding: 105), 7 of 16-token drafts fully kept, a few steps lost around the edit
    assert steps <= 16


def test_rows_without_a_prediction_get_the_fallback_and_room_caps_every_draft() -> None:
    drafts = PredictionDrafts(k=16)
    seen: list[list[int]] = []

    def fallback(idx: list[int]) -> list[list[int]]:
        seen.append(idx)
        return [[1, 2, 3, 4] for _ in idx]

    rows = [
        Row("a", PROMPT + OUTPUT[:1], len(PROMPT), 1, 2, None),  # room 2: cut to 2
        Row("b", PROMPT + OUTPUT[:1], len(PROMPT), 0, 10, None),  # a prefill chunk: none
        Row("c", PROMPT + OUTPUT[:1], len(PROMPT), 1, 3, OUTPUT),  # room 3
        Row("d", PROMPT + OUTPUT[:1], len(PROMPT), 1, 0, OUTPUT),  # no room
    ]
    out = drafts.step(rows, elapsed_s=None, fallback=fallback)
    assert seen == [[0]]
    assert out[0] == [1, 2] and out[1] == [] and out[3] == []
    assert out[2] == OUTPUT[1:4]
    assert set(drafts.requests) == {"c", "d"}
    drafts.step(rows[:1], elapsed_s=None, fallback=fallback)
    assert drafts.requests == {}  # requests that left the batch are forgotten


def test_only_back_to_back_steps_of_the_same_rows_are_timed() -> None:
    drafts = PredictionDrafts(k=4, clock=StepClock(skipped_warmup=WARMUP))
    a = Row("a", PROMPT + OUTPUT[:1], len(PROMPT), 1, 50, OUTPUT)
    b = Row("b", PROMPT + OUTPUT[:1], len(PROMPT), 1, 50, None)
    drafts.step([a], elapsed_s=None)
    drafts.step([a, b], elapsed_s=0.5)  # b joined: its prefill ran in that step
    assert drafts.clock.samples == {}
    first = drafts.step([a, b], elapsed_s=0.2, fallback=lambda idx: [[] for _ in idx])
    assert sum(drafts.clock.samples.keys()) == 1 + len(first[0]) + 1  # a's draft + b's token
    chunk = Row("b", b.context, b.prompt_len, 0, 50, None)
    drafts.step([a, chunk], elapsed_s=0.2, fallback=lambda idx: [[] for _ in idx])
    assert sum(len(s) for s in drafts.clock.samples.values()) == 1  # a prefill chunk: not timed


# -- a recording of vLLM's own steps ------------------------------------------------------------


def _recorded(drafts: dict[int, list[int]]) -> Callable[[list[int]], list[list[int]]]:
    """The fallback's drafts as the recording has them (vLLM's n-gram lookup ran there)."""
    return lambda idx: [drafts[i] for i in idx]


def _replay(
    lines: list[dict[str, Any]], k: int, step_costs: Sequence[float] | None = None
) -> tuple[int, int, int]:
    """Feed the recorded rows to a fresh adapter (the server's K and step-cost setting, from
    the recording's header); assert its drafts are the recorded ones and that each step kept
    a prefix of the draft before it. (steps, rows drafted, rows with a prediction)."""
    fixed = None if step_costs is None else (float(step_costs[0]), float(step_costs[1]))
    drafts = PredictionDrafts(k=k, clock=StepClock(fixed=fixed))
    contexts: dict[str, list[int]] = {}
    meta: dict[str, tuple[int, list[int]]] = {}
    last: dict[str, list[int]] = {}
    drafted = total = 0
    for line in lines:
        rows: list[Row] = []
        for item in line["rows"]:
            rid = item["id"]
            if "prediction" in item:
                meta[rid] = (item["prompt_len"], item["prediction"])
                contexts[rid] = []
            if "new" not in item:
                rows.append(Row(rid, (), 0, item["sampled"], item["room"], None))
                continue
            new = item["new"]
            if contexts[rid] and rid in last:  # a step keeps a prefix of its draft, then one
                assert new[:-1] == last[rid][: len(new) - 1]
            contexts[rid] += new
            prompt_len, prediction = meta[rid]
            rows.append(
                Row(rid, list(contexts[rid]), prompt_len, item["sampled"], item["room"], prediction)
            )
        recorded = [item["draft"] for item in line["rows"]]
        plain = {
            i: d
            for i, (r, d) in enumerate(zip(rows, recorded, strict=True))
            if r.prediction is None
        }
        assert drafts.step(rows, line["elapsed_s"], _recorded(plain)) == recorded
        for r, d in zip(rows, recorded, strict=True):
            last[r.req_id] = d
            if r.prediction is not None:
                total += 1
                drafted += bool(d)
    return len(lines), drafted, total


@pytest.mark.skipif(not RECORDING.exists(), reason="no recording committed")
def test_a_recording_of_vllm_steps_replays_to_the_same_drafts() -> None:
    lines = [json.loads(x) for x in RECORDING.read_text().splitlines() if x.strip()]
    header, body = lines[0], lines[1:]
    assert "k" in header and all("rows" in x for x in body), "one server run, one header"
    steps, drafted, rows = _replay(body, k=int(header["k"]), step_costs=header.get("step_costs"))
    assert steps == len(body) and drafted > 0 and rows > 0
