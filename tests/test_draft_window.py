"""The draft window (issue 16): a ModelDrafter whose model sees only the last W tokens of the
context. The target verifies every draft, so the output must stay the target's exactly;
the draft cache must hold exactly the window (and slide when it would overflow the draft
model's own context); the option must reach the hybrid drafter, load_pair, the bench
configuration, the CLI and the API, and refuse bad values with a ConfigError.

Thresholds (fixed before running): the sampled-distribution test uses 20,000 independent
sequences and requires the chi-square p-value of the first-four-token distribution against
the exact one to exceed 1e-3, as in test_decoding.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from seq_dist import first_tokens_pvalue
from specdec import api
from specdec.bench.configs import BenchConfig, parse_config
from specdec.bench.plan import BenchPlan
from specdec.bench.results import read_results
from specdec.bench.runner import run_bench
from specdec.cli import main
from specdec.core.loop import context_limit, generate, generate_stream
from specdec.core.model_drafter import ModelDrafter
from specdec.core.result import GenerationResult
from specdec.core.sampling import GREEDY, SamplingConfig, make_generator
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.suffix import SuffixDrafter, SuffixOptions
from specdec.errors import ConfigError
from specdec.models.loader import ModelConfig
from specdec.models.mock import MockLM, MockSpec, mock_pair
from specdec.pairs import DEFAULT_DRAFT, HybridRef, load_pair

VOCAB = 12


def models(
    *, draft_n_ctx: int, order: int = 6, noise: float = 0.6, vocab: int = VOCAB
) -> tuple[MockLM, MockLM]:
    """(draft, target): a draft whose logits depend on more tokens than small windows hold,
    so that the window changes what it proposes (never what the output is)."""
    target = MockLM(MockSpec(vocab_size=vocab, order=order))
    draft = MockLM(
        MockSpec(vocab_size=vocab, order=order, noise=noise, noise_seed=5, n_ctx=draft_n_ctx)
    )
    return draft, target


def prompts(n: int, seed: int, lo: int = 2, hi: int = 40) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(3, VOCAB) for _ in range(rnd.randint(lo, hi))] for _ in range(n)]


def assert_cache_is_the_view(d: ModelDrafter, draft: MockLM, ctx: list[int]) -> None:
    """The draft cache holds a prefix of context[offset:] and nothing before the offset."""
    cached = draft.cached_tokens
    assert cached == d._fed
    assert cached == ctx[d.offset : d.offset + len(cached)], (d.offset, cached)
    assert draft.n_cached <= draft.n_ctx


# -- output: the target's, with and without slides ---------------------------------------------


@pytest.mark.parametrize("window", [1, 3, 8])
@pytest.mark.parametrize("k", [1, 4, 7])
def test_greedy_output_equals_plain_target_decoding_across_slides(window: int, k: int) -> None:
    draft, target = models(draft_n_ctx=24)
    d = ModelDrafter(draft, window=window)
    slid = 0
    for prompt in prompts(5, seed=window * 10 + k):
        plain = generate(target, None, prompt, max_new_tokens=50, k=0, stop_on_eos=False)
        ctx = list(prompt)
        run = generate_stream(target, d, prompt, max_new_tokens=50, k=k, stop_on_eos=False)
        for ev in run:
            ctx += ev.tokens
            assert_cache_is_the_view(d, draft, ctx)
        assert run.result is not None
        assert ctx[len(prompt) :] == plain.tokens == run.result.tokens
        assert run.result.finish_reason == "length"  # not bounded by the draft's 24 tokens
        slid += d.rebases
    assert slid > 0  # the slides were exercised


def test_the_window_changes_the_drafts_and_not_the_output() -> None:
    draft, target = models(draft_n_ctx=4096)
    prompt = prompts(1, seed=3, lo=30, hi=30)[0]
    full = generate(target, ModelDrafter(draft), prompt, max_new_tokens=40, k=4)
    fresh, _ = models(draft_n_ctx=4096)
    windowed = generate(target, ModelDrafter(fresh, window=2), prompt, max_new_tokens=40, k=4)
    assert windowed.tokens == full.tokens
    accepted = [r.n_accepted for r in windowed.rounds], [r.n_accepted for r in full.rounds]
    assert accepted[0] != accepted[1]  # the draft model did see another context


# -- the cache holds exactly the window --------------------------------------------------------


def test_prefill_caches_exactly_the_last_window_tokens() -> None:
    draft, _ = models(draft_n_ctx=64)
    d = ModelDrafter(draft, window=8)
    ctx = list(range(3, 12)) * 4  # 36 tokens
    d.prefill(ctx)
    assert d.offset == 28 and draft.cached_tokens == ctx[-8:] and draft.n_cached == 8
    assert draft.tokens_processed == 8  # the prompt's other 28 tokens were never fed
    short = [3, 4, 5]
    d.reset()
    d.prefill(short)  # shorter than the window: all of it
    assert d.offset == 0 and draft.cached_tokens == short


def test_a_slide_rebases_to_the_last_window_tokens_and_is_counted() -> None:
    draft, _ = models(draft_n_ctx=16)
    d = ModelDrafter(draft, window=6)
    ctx = [3, 4, 5, 6, 7, 8, 9, 10, 11, 3]  # 10 tokens
    d.prefill(ctx[:-1])
    assert draft.cached_tokens == ctx[3:9] and d.rebases == 0
    ctx += [4, 5, 6, 7, 8, 9]  # 16 tokens: the view (13) + 3 drafts + 1 to spare > 16
    out = d.propose(ctx, 3, GREEDY, make_generator(0))
    assert len(out) == 3 and d.rebases == 1 and d.offset == len(ctx) - 6
    assert draft.cached_tokens == ctx[-6:] + out.tokens[:-1]  # the window, then the drafts
    assert d.report() == {"draft_window": 6, "draft_rebases": 1}
    d.rollback(ctx)  # all drafts rejected: back to exactly the window
    assert draft.cached_tokens == ctx[-6:]
    d.reset()
    assert d.rebases == 0 and d.offset == 0  # counted per generation


def test_the_result_records_the_window_and_the_rebases() -> None:
    draft, target = models(draft_n_ctx=20)
    d = ModelDrafter(draft, window=5)
    res = generate(target, d, list(range(3, 12)), max_new_tokens=40, k=3, stop_on_eos=False)
    assert res.extra == {"draft_window": 5, "draft_rebases": d.rebases} and d.rebases > 0
    out = res.to_dict()
    assert out["draft_window"] == 5 and out["draft_rebases"] == d.rebases
    plain = generate(target, ModelDrafter(models(draft_n_ctx=64)[0]), [3, 4], max_new_tokens=3)
    assert "draft_window" not in plain.to_dict()  # no window: the result is as before


def test_without_a_window_the_draft_bounds_the_context_and_with_one_it_does_not() -> None:
    draft, target = models(draft_n_ctx=24)
    assert ModelDrafter(draft).n_ctx == 24 and ModelDrafter(draft, window=4).n_ctx is None
    assert context_limit(target, ModelDrafter(draft)) == 24
    assert context_limit(target, ModelDrafter(draft, window=4)) == target.n_ctx
    prompt = list(range(3, 12))
    bounded = generate(target, ModelDrafter(draft), prompt, max_new_tokens=40, k=3)
    assert bounded.finish_reason == "context" and len(prompt) + len(bounded.tokens) == 24


def test_the_draft_never_takes_an_id_it_lacks_and_drafts_once_it_left_the_window() -> None:
    """Padded vocabularies (``_known``) on the view: an id beyond the draft model's
    vocabulary inside the window means no drafts; outside it, drafting goes on."""
    draft, _ = mock_pair("close", vocab_size=8, draft_vocab_size=6)
    d = ModelDrafter(draft, vocab_size=8, window=3)
    inside = [0, 4, 5, 7, 3]  # 7 is beyond the draft's 6 ids
    d.prefill(inside)
    assert draft.cached_tokens == [5]  # the view [5, 7, 3] up to the id it lacks
    out = d.propose([*inside, 4], 2, SamplingConfig(1.0), make_generator(0))
    assert out.tokens == []
    d.reset()
    outside = [0, 7, 4, 5, 3, 4]
    d.prefill(outside)
    assert draft.cached_tokens == [5, 3, 4]
    out = d.propose([*outside, 5], 2, SamplingConfig(1.0), make_generator(0))
    assert len(out) == 2 and out.probs is not None and out.probs.shape == (2, 8)
    assert all(t < 6 for t in draft.cached_tokens)


# -- the hybrid -------------------------------------------------------------------------------


def test_a_hybrid_with_a_windowed_model_is_lossless_and_unbounded() -> None:
    draft, target = models(draft_n_ctx=20)
    model = ModelDrafter(draft, window=6)
    h = HybridDrafter(SuffixDrafter(SuffixOptions(min_match=2)), model, model_max_k=3)
    assert h.window == 6 and context_limit(target, h) == target.n_ctx
    model_rounds = 0
    for prompt in prompts(4, seed=11, lo=25, hi=40):  # longer than the draft's 20
        plain = generate(target, None, prompt, max_new_tokens=40, k=0, stop_on_eos=False)
        ctx = list(prompt)
        for ev in generate_stream(target, h, prompt, max_new_tokens=40, k=5, stop_on_eos=False):
            ctx += ev.tokens
            assert_cache_is_the_view(model, draft, ctx)
        assert ctx[len(prompt) :] == plain.tokens
        model_rounds += h.model_rounds
    assert model_rounds > 0  # the windowed model drafted, although prompts exceed its context


# -- the exact distribution -------------------------------------------------------------------

N_SEQ = 20_000


@pytest.mark.slow
def test_sampled_sequences_follow_the_exact_target_distribution_across_slides() -> None:
    """A far draft that sees 6 of the context's tokens (its logits depend on 8), in a
    context of 10 that slides after the first round: the output follows the target."""
    target = MockLM(MockSpec(vocab_size=5, order=2, sharpness=1.0))
    draft = MockLM(MockSpec(vocab_size=5, order=8, sharpness=1.0, seed=7919, n_ctx=10))
    d = ModelDrafter(draft, window=6)
    results: list[GenerationResult] = []
    p = first_tokens_pvalue(
        target,
        d,
        [3, 4, 2, 3, 4, 0, 2, 3, 4, 2],
        k=2,
        cfg=SamplingConfig(1.0),
        n_tokens=4,
        n_seq=N_SEQ,
        seed0=70_000,
        on_result=results.append,
    )
    rounds = [r for res in results for r in res.rounds if r.k > 0]
    assert sum(1 for r in rounds if r.n_accepted < r.k) > N_SEQ // 20  # rejections happened
    assert sum(res.extra["draft_rebases"] for res in results) > N_SEQ // 4  # and slides
    assert p > 1e-3


# -- where users pass it ----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "8"])
def test_bad_windows_are_config_errors(bad: object) -> None:
    draft, _ = models(draft_n_ctx=32)
    with pytest.raises(ConfigError, match="draft window"):
        ModelDrafter(draft, window=bad)  # type: ignore[arg-type]


def test_a_window_must_leave_room_in_the_draft_model() -> None:
    draft, _ = models(draft_n_ctx=32)
    with pytest.raises(ConfigError, match=r"smaller than the draft model's context window \(32\)"):
        ModelDrafter(draft, window=32)
    assert ModelDrafter(draft, window=31).window == 31


def test_load_pair_wraps_a_windowed_draft_and_refuses_one_without_a_model() -> None:
    target = ModelConfig("mock:target", backend="mock")
    draft_cfg = ModelConfig("mock:close", backend="mock")
    d, _ = load_pair(draft_cfg, target, draft_window=16)
    assert isinstance(d, ModelDrafter) and d.window == 16
    h, _ = load_pair(HybridRef(draft_cfg), target, draft_window=16)
    assert isinstance(h, HybridDrafter) and h.model.window == 16
    plain, _ = load_pair(draft_cfg, target)
    assert isinstance(plain, MockLM)  # no window: the draft model as before
    for ref in ("ngram", "suffix", "planned"):
        with pytest.raises(ConfigError, match="draft window applies to a draft model"):
            load_pair(ref, target, draft_window=16)
    with pytest.raises(ConfigError, match="integer >= 1"):
        load_pair(draft_cfg, target, draft_window=0)
    with pytest.raises(ConfigError, match="smaller than"):
        load_pair(ModelConfig("mock:close", backend="mock", n_ctx=16), target, draft_window=16)


def test_the_api_takes_a_draft_window() -> None:
    pair = api.load("mock:target", "mock:close", draft_window=4, n_ctx=64)
    assert isinstance(pair.draft, ModelDrafter) and pair.draft.window == 4
    c = pair.generate([3, 4, 5, 6, 7, 8, 9], max_new_tokens=8, k=3, stop_on_eos=False)
    assert c.result.extra["draft_window"] == 4
    with pytest.raises(ConfigError, match="named draft model"):
        api.load("mock:target", draft_window=4)  # the machine default chooses the drafter


def test_bench_configurations_parse_and_check_the_window() -> None:
    cfg = parse_config("draft=mock:close,target=mock:target,draft_window=256")
    assert cfg.draft_window == 256 and cfg.label == "mock:close-w256->mock:target"
    assert BenchConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    h = parse_config("draft=hybrid:mock:close,target=mock:target,draft_window=64")
    assert h.hybrid and h.draft_window == 64
    for bad, msg in [
        ("draft=mock:close,target=t,draft_window=0", "draft_window must be an integer"),
        ("draft=mock:close,target=t,draft_window=x", "draft_window needs an integer"),
        ("draft=mock:close,target=t,n_ctx=64,draft_window=64", r"in 1\.\.63"),
        ("draft=ngram,target=t,draft_window=8", "draft_window needs a draft model"),
        ("draft=suffix,target=t,draft_window=8", "draft_window needs a draft model"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            parse_config(bad)


def test_a_mock_bench_records_the_window(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "ab ab ab ab ab ab", "category": "c"}) + "\n")
    cfg = parse_config("draft=mock:close,target=mock:target,n_ctx=40,draft_window=4")
    plan = BenchPlan(
        configs=(cfg,),
        ks=(2,),
        prompt_source=str(f),
        categories=None,
        prompts_per_category=0,
        max_new_tokens=12,
        stop_on_eos=False,
        profile_repeats=1,
        verify_max=4,
        profile_context_tokens=10,
        warmup=False,
    )
    out = tmp_path / "r.jsonl"
    run_bench(plan, out, progress=False)
    res = read_results(out)
    by_k = {m["k"]: m for m in res.measurements}
    assert by_k[2]["draft_window"] == 4 and isinstance(by_k[2]["draft_rebases"], int)
    assert by_k[0]["draft_window"] is None  # plain decoding has no draft
    assert by_k[2]["tokens"] == by_k[0]["tokens"]
    prof = res.profile_for(cfg.label)
    assert prof is not None and prof["draft_kind"] == "model"  # profiled as a draft model


MOCK = ["--draft", "mock:close", "--target", "mock:target"]
MOCK += ["--draft-backend", "mock", "--target-backend", "mock"]


def test_generate_json_shows_the_window_and_the_rebases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["generate", "a prompt of some length", *MOCK, "--raw", "--no-stop", "--json"]
    rc = main([*argv, "-k", "3", "-n", "20", "--n-ctx", "64", "--draft-window", "5"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    res = json.loads(out)
    assert res["draft_window"] == 5 and isinstance(res["draft_rebases"], int)
    rc = main(["generate", "hello", *MOCK, "-k", "3", "-n", "5", "--draft-window", "5"])
    _, err = capsys.readouterr()
    assert rc == 0 and "draft window 5 (0 re-bases)" in err


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--draft-window", "0"], "--draft-window must be >= 1, got 0"),
        (["--draft-window", "-5"], "--draft-window must be >= 1, got -5"),
        (["--draft-window", "64", "--n-ctx", "64"], "must be smaller than --n-ctx (64)"),
        (["--draft-window", "8", "--auto"], "--auto chooses the drafter itself"),
        (["--draft-window", "8", "--draft", "ngram"], "applies to a draft model"),
    ],
)
def test_bad_cli_windows_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    rc = main(["generate", "a prompt", *MOCK, *extra])
    _, err = capsys.readouterr()
    assert rc == 2
    lines = err.strip().splitlines()
    assert lines[-1].startswith("specdec: error:") and needle in lines[-1], err
    assert "Traceback" not in err


def test_a_non_integer_cli_window_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["generate", "a prompt", *MOCK, "--draft-window", "lots"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--draft-window: invalid int value" in err and "Traceback" not in err


def test_certify_runs_the_windowed_pair_and_names_the_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mocks = ["--draft", "mock:close:8", "--target", "mock:target:8"]
    mocks += ["--draft-backend", "mock", "--target-backend", "mock"]
    argv = ["certify", "--levels", "3", "--quick", "--seeds", "4", "--n-prompts", "2", *mocks]
    out = tmp_path / "cert"
    assert main([*argv, "--draft-window", "4", "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("VERDICT: PASS")
    doc = json.loads((out / "certificate.json").read_text())
    assert doc["draft"].endswith("(window 4)") and "--draft-window 4" in doc["command"]
    assert doc["draft_runtime"]["class"] == "ModelDrafter"


def test_serve_loads_the_windowed_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    import specdec.serve.server
    from specdec.cli import build_parser
    from specdec.cli.common import draft_reference

    alone = ["serve", "--draft-window", "6"]
    assert draft_reference(build_parser(alone).parse_args(alone)) == DEFAULT_DRAFT  # a model
    seen: dict[str, object] = {}
    monkeypatch.setattr(specdec.serve.server, "run", lambda app, **kw: seen.update(app=app))
    assert main(["serve", "--draft-window", "6", "--n-ctx", "64", "--port", "0", *MOCK]) == 0
    pair = seen["app"].state.specdec.pair  # type: ignore[attr-defined]
    assert isinstance(pair.draft, ModelDrafter) and pair.draft.window == 6
