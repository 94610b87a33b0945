"""Draft references: parsing, pair loading (model, suffix, hybrid) and the CLI wiring."""

from __future__ import annotations

import json

import pytest

from specdec.cli import main
from specdec.core.loop import generate
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.errors import ConfigError, VocabMismatchError
from specdec.models.loader import ModelConfig
from specdec.pairs import HybridRef, draft_label, is_model_free, load_pair, parse_drafter


def test_model_free_references_parse() -> None:
    assert parse_drafter("none") is None
    assert isinstance(parse_drafter("ngram:4"), NgramDrafter)
    s = parse_drafter("suffix:max_draft=4,min_match=3")
    assert isinstance(s, SuffixDrafter) and s.options.max_draft == 4
    assert is_model_free("suffix") and is_model_free("ngram") and not is_model_free("hybrid:x")
    for bad in ("suffix:bogus=1", "ngram:x", "nonsense"):
        with pytest.raises(ConfigError):
            parse_drafter(bad)


def test_hybrid_reference_loads_a_hybrid_drafter_and_checks_the_vocabulary() -> None:
    target = ModelConfig("mock:target:16", backend="mock")
    draft, _ = load_pair(HybridRef(ModelConfig("mock:close:16", backend="mock")), target)
    assert isinstance(draft, HybridDrafter)
    assert draft_label(HybridRef(ModelConfig("mock:close:16", backend="mock"))) == (
        "hybrid:mock:close:16@mock"
    )
    with pytest.raises(VocabMismatchError):
        load_pair(HybridRef(ModelConfig("mock:close:32", backend="mock")), target)


@pytest.mark.parametrize("draft", ["suffix", "suffix:max_draft=6", "hybrid:mock:close", "ngram"])
def test_generate_cli_with_every_drafter_gives_the_greedy_output(
    draft: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["generate", "--target", "mock:target", "--target-backend", "mock"]
    base += ["--draft-backend", "mock", "--max-new-tokens", "24", "--no-stop", "--json"]
    prompt = "abcabcabc abcabcabc abcabc"
    assert main([*base, "-k", "0", prompt]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*base, "--draft", draft, "-k", "6", prompt]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["tokens"] == plain["tokens"]
    assert spec["drafter"] != "none"


def test_a_pair_generates_with_a_suffix_drafter_on_repetitive_text() -> None:
    draft, target = load_pair("suffix", ModelConfig("mock:target:16", backend="mock"))
    res = generate(target, draft, [3, 4, 5, 6] * 8, max_new_tokens=30, k=8, stop_on_eos=False)
    plain = generate(target, None, [3, 4, 5, 6] * 8, max_new_tokens=30, k=0, stop_on_eos=False)
    assert res.tokens == plain.tokens


def test_load_takes_every_model_option_under_its_own_name() -> None:
    """The command line hands ``specdec.load`` its ModelOptions as keywords (asdict): a field
    renamed on one side only would break generate and serve."""
    import dataclasses
    import inspect

    import specdec
    from specdec.pairs import ModelOptions

    keywords = inspect.signature(specdec.load).parameters
    for f in dataclasses.fields(ModelOptions):
        assert f.name in keywords, f.name
        assert keywords[f.name].default == f.default, f.name


def test_k_left_to_the_pair_is_decided_in_one_place() -> None:
    """``Pair.default_k``: the profile's policy for a pair it chose (not for a prediction),
    PLANNED_K for planned drafts and predictions, DEFAULT_K for a named drafter; the API runs
    it (the server and the command line pass K through as None)."""
    from specdec.api import Pair
    from specdec.pairs import DEFAULT_K, PLANNED_K

    named_draft, target = load_pair("suffix", ModelConfig("mock:target:16", backend="mock"))
    from specdec.theory import Costs

    flat = Costs(verify_s=tuple(1.0 + 0.02 * n for n in range(65)), prefill_tps=1e3)
    planned, _ = load_pair(
        "planned", ModelConfig("mock:target:16", backend="mock"), costs=lambda *_: flat
    )

    class Choice:
        def policy(self) -> object:
            raise AssertionError("not asked here")

    assert Pair(target, named_draft).default_k() == DEFAULT_K
    assert Pair(target, named_draft).default_k(prediction=True) == PLANNED_K
    assert Pair(target, planned).default_k() == PLANNED_K
    assert Pair(target, None).default_k() == DEFAULT_K  # no drafter: plain whatever K
    chosen = Pair(target, planned, Choice())  # type: ignore[arg-type]
    assert chosen.default_k() is None  # the profile's policy decides
    assert chosen.default_k(prediction=True) == PLANNED_K
    # the request runs what default_k says: a planned pair's drafts may be longer than 6
    text = "alpha beta gamma delta " * 12
    done = Pair(target, planned).generate(text, raw=True, max_new_tokens=40, stop_on_eos=False)
    assert max(r.k for r in done.result.rounds) > DEFAULT_K


def test_a_raw_request_takes_no_system_prompt_or_messages() -> None:
    from specdec.request import make_request

    with pytest.raises(ConfigError, match="raw prompt takes no system prompt"):
        make_request("x", raw=True, system="Be brief.")
    with pytest.raises(ConfigError, match="raw prompt takes no system prompt"):
        make_request("x", raw=True, messages=[{"role": "user", "content": "hi"}])
    assert make_request("x", raw=True).chat is False
