"""specdec.certify.certify_models: the Python entry point for people with their own backends
(any CausalLM pair; prompts as texts or token ids)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdec.certify import certify_models
from specdec.certify.common import torch_threads
from specdec.certify.faults import WrongRowsLM
from specdec.models.mock import mock_pair


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


def test_certify_models_pass_and_fail(tmp_path: Path) -> None:
    """A correct mock pair passes (status 'pass', files written, the CLI's verdict line);
    the same pair with a wrong-rows target fails."""
    draft, target = mock_pair("close", vocab_size=8)
    prompts: list[str | list[int]] = ["hello there", [0, 5, 6, 7], "abc", "xyz"]
    cert = certify_models(draft, target, prompts, quick=True, seeds=4, out=tmp_path)
    assert cert.status == "pass", cert.verdict_line()
    assert cert.verdict_line().startswith("VERDICT: PASS")
    doc = json.loads((tmp_path / "certificate.json").read_text())
    assert doc["verdict"]["status"] == "pass" and doc["levels"]["3"]["pertoken"] is not None
    bad = certify_models(draft, WrongRowsLM(target), prompts, quick=True, seeds=4)
    assert bad.status == "fail"


def test_certify_models_rejects_an_empty_token_prompt() -> None:
    """A prompt given as an empty token list is a user error (ValueError subclass)."""
    draft, target = mock_pair("close", vocab_size=8)
    with pytest.raises(ValueError, match="empty"):
        certify_models(draft, target, [[]], quick=True)
