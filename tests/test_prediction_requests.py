"""Requests with a prediction, end to end on mock models: what a user is told, where the
prediction is drafted (and where it is not), and bad input (issue 42, items 4 and 5)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import specdec
from specdec.api import Pair
from specdec.core.loop import generate
from specdec.drafters.suffix import SuffixDrafter
from specdec.models.mock import MockLM, MockSpec

PROMPT = [3, 9, 4, 1]


def test_the_first_prediction_says_that_it_measures_the_costs() -> None:
    """A pair without a planned drafter measures the target's costs for the first request
    with a prediction (seconds on a real model): the log says so, once per machine."""
    logs: list[str] = []
    pair = specdec.load("mock:target", "none", log=logs.append)
    assert logs == []
    for _ in range(2):
        pair.generate(PROMPT, max_new_tokens=8, prediction=[5, 6, 7])
    measuring = [m for m in logs if "measuring the target's verify cost" in m]
    assert len(measuring) == 1, logs


def _server_usage(pair: Pair, prediction: list[int]) -> dict[str, object]:
    from fastapi.testclient import TestClient

    from specdec.serve import ServeConfig, ServeSettings, create_app

    body = {
        "prompt": PROMPT,
        "max_tokens": 24,
        "temperature": 0,
        "prediction": {"type": "content", "content": ""},
    }
    app = create_app(pair, ServeConfig(settings=ServeSettings(model_name="m", k=None)))
    # the prediction as ids: the app tokenizes text, so give it the text of those ids
    text = bytes(t - 3 for t in prediction).decode("latin-1")
    body["prediction"] = {"type": "content", "content": text}
    with TestClient(app) as client:
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        usage: dict[str, object] = r.json()["usage"]
    return usage


def test_a_server_without_a_drafter_decodes_every_request_plainly() -> None:
    """``serve --draft none`` (and ``-k 0``) loads no drafter: a request's prediction is
    checked and counted, never drafted (the operator chose plain decoding); with a drafter
    the same prediction is drafted and kept."""
    target = MockLM(MockSpec(vocab_size=64, order=2, seed=1, sharpness=4.0))
    truth = generate(target, None, PROMPT, max_new_tokens=24, k=0, stop_on_eos=False).tokens
    prediction = [t for t in truth if 3 <= t < 3 + 128]  # ids the mock tokenizer can spell
    assert len(prediction) >= 12
    plain = _server_usage(Pair(target, None), prediction)
    assert plain["drafted_tokens"] == 0
    assert plain["completion_tokens_details"] == {
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    }
    drafting = _server_usage(Pair(target, SuffixDrafter()), prediction)
    details = drafting["completion_tokens_details"]
    assert isinstance(details, dict) and details["accepted_prediction_tokens"] > 0


def test_a_fifo_as_prediction_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``generate --prediction FIFO``: one error line and exit 2, never a wait for a writer
    (docs/usage.md: a pipe is an error, not a hang). Run in a thread: if the read blocks, a
    writer opens and closes the FIFO to release it, and the test fails saying so."""
    from specdec.cli import main

    fifo = tmp_path / "prediction"
    os.mkfifo(fifo)
    argv = ["generate", "--target", "mock:target", "--raw", "hi", "--prediction", str(fifo)]
    rc: list[int] = []
    worker = threading.Thread(target=lambda: rc.append(main([*argv, "-n", "2"])), daemon=True)
    worker.start()
    worker.join(5)  # an error is immediate: the prediction is read before anything loads
    hung = worker.is_alive()
    if hung:  # release the blocked open() so that the thread can end
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join(10)
    assert not hung, "--prediction FIFO blocked waiting for a writer"
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == [2] and len(err) == 1 and err[0].startswith("specdec: error:"), err
