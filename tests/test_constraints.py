"""Grammars as row processors on mock models (``specdec.constraints``): the rows of a round are
those of plain decoding position by position whatever order the calls come in, the drafts a
grammar rules out are cut before the pass, greedy output under a grammar is plain decoding's
under it for every drafter, and sampled output has its exact distribution.

Thresholds (fixed before running): the sampled test draws 4,000 independent sequences (one
seed each) of 4 tokens and requires the chi-square p-value against the exactly computed law
(plain decoding under the grammar, enumerated) to exceed 1e-3; each fault fixture (the
grammar not advanced along the draft's path, not rolled back after rejected drafts, the mask
applied to the draft model's rows only) must give a p-value below 1e-3 on the same test, or
a sequence outside the law's support. Masking the target's rows only is not a fault: the
accept/reject walk is exact for whatever distribution the drafts were sampled from, so that
setup must pass.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.constraints import Constraint, ConstraintError
from specdec.constraints.grammars import Grammars
from specdec.constraints.processor import GrammarProcessor
from specdec.core.drafter import Draft
from specdec.core.loop import generate
from specdec.core.model_drafter import ModelDrafter
from specdec.core.processors import RowProcessor
from specdec.core.sampling import SamplingConfig, logits_to_probs
from specdec.drafters import NgramDrafter
from specdec.drafters.prediction import PredictionDrafter
from specdec.models.mock import MockLM, MockTokenizer, mock_pair

pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")

VOCAB = 12
# over the mock's pieces (id 3 is "a", 4 "b", ...): items "ab" (ids 3 4), "c" (5), or "d" (6)
# then maybe "e" (7)
GRAMMAR = 'start: item+\nitem: "ab" | "c" | "d" "e"?\n'


_GRAMMARS: dict[int, Grammars] = {}  # one per mock target (its checker's worker starts once)


def processor(model: MockLM, prompt_len: int, grammar: str = GRAMMAR) -> GrammarProcessor:
    """A fresh processor (a new matcher) of ``grammar`` over ``model``'s vocabulary."""
    grammars = _GRAMMARS.setdefault(id(model), Grammars(model))
    return grammars.processor(Constraint("lark", grammar, "grammar"), prompt_len)


@pytest.fixture(scope="module")
def target() -> MockLM:
    return mock_pair("close", vocab_size=VOCAB, order=2)[1]


def one_at_a_time(
    proc: RowProcessor, context: list[int], path: list[int], logits: torch.Tensor
) -> torch.Tensor:
    return torch.stack(
        [proc.rows(context + path[:i], [], logits[i : i + 1])[0] for i in range(len(path) + 1)]
    )


def legal_walk(target: MockLM, prompt_len: int, context: list[int], path: list[int]) -> int:
    """How many of ``path`` are legal, from the masks of fresh processors (one per step)."""
    n = 0
    for i, tok in enumerate(path):
        row = processor(target, prompt_len).rows(context + path[:i], [], torch.zeros(1, VOCAB))[0]
        if not torch.isfinite(row[tok]):
            break
        n += 1
    return n


def grammar_path(rnd: random.Random, n: int) -> list[int]:
    """A token sequence the grammar allows (items drawn at random), n tokens or a bit more."""
    out: list[int] = []
    while len(out) < n:
        out += rnd.choice([[3, 4], [5], [6], [6, 7]])
    return out


def test_rows_are_a_function_of_their_arguments(target: MockLM) -> None:
    """One processor asked in random order (contexts that grow, shrink, diverge) gives the
    rows a fresh processor gives, row i masked after context + path[:i]; legal_prefix counts
    what the masks allow."""
    rnd = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    prompt = [2, 9, 9]
    used = processor(target, len(prompt))
    masked_any = 0
    for trial in range(60):
        out = grammar_path(rnd, rnd.randint(0, 8))
        cut = rnd.randint(0, len(out))
        if rnd.random() < 0.3 and cut < len(out):  # an illegal token somewhere in the path
            out[rnd.randrange(cut, len(out))] = rnd.randrange(VOCAB)
        context, path = prompt + out[:cut], out[cut:]
        logits = torch.randn(len(path) + 1, VOCAB, generator=gen)  # [n, V]
        got = used.rows(context, path, logits)
        n_legal = used.legal_prefix(context, path)
        assert n_legal == legal_walk(target, len(prompt), context, path), trial
        fresh = one_at_a_time(processor(target, len(prompt)), context, path, logits)
        # rows past the first ruled-out token are never used (their context cannot occur)
        assert torch.equal(got[: n_legal + 1], fresh[: n_legal + 1]), trial
        assert torch.isfinite(got).any(dim=1).all()
        masked_any += int(torch.isinf(got).any())
    assert masked_any > 30  # the grammar does mask (the test is not vacuous)


def test_the_output_follows_the_grammar_and_ends_where_it_may(target: MockLM) -> None:
    prompt = [2, 9]
    eos = min(target.eos_token_ids)
    for seed in range(20):
        res = generate(
            target,
            None,
            prompt,
            max_new_tokens=12,
            k=0,
            sampling=SamplingConfig(1.0),
            seed=seed,
            processor=processor(target, len(prompt)),
        )
        text = "".join(MockTokenizer.PIECES[t - 3] for t in res.tokens if t != eos)
        assert re.fullmatch(r"(ab|c|de?)*a?", text), text
        if res.finish_reason == "eos":
            assert re.fullmatch(r"(ab|c|de?)+", text), text


@pytest.mark.parametrize("closeness", ["identical", "close", "far"])
def test_greedy_output_is_plain_decodings_under_the_grammar(closeness: str) -> None:
    draft, target = mock_pair(closeness, vocab_size=VOCAB, order=2)
    rnd = random.Random(2)
    for _ in range(5):
        prompt = [rnd.randrange(3, VOCAB) for _ in range(rnd.randint(1, 5))]

        def run(drafter: object, k: int, prompt: list[int] = prompt) -> list[int]:
            return generate(
                target,
                drafter,  # type: ignore[arg-type]
                prompt,
                max_new_tokens=24,
                k=k,
                stop_on_eos=False,
                processor=processor(target, len(prompt)),
            ).tokens

        plain = run(None, 0)
        for k in (1, 3, 6):
            assert run(draft, k) == plain, (prompt, k)
        assert run(NgramDrafter(2), 4) == plain
        # a prediction that is partly the output, partly tokens the grammar rules out
        wrong = [t if i % 3 else 8 for i, t in enumerate(plain)]
        for predicted in (plain, wrong):
            drafter = PredictionDrafter(predicted, costs=None, fallback=None)
            assert run(drafter, 8) == plain


# -- the exact law, and faults that must break it --------------------------------------------


class NotAlongThePath:
    """Fault: every row of a round masked with the round's starting context."""

    def __init__(self, inner: GrammarProcessor) -> None:
        self.inner = inner

    def rows(
        self, context: Sequence[int], path: Sequence[int], logits: torch.Tensor
    ) -> torch.Tensor:
        return torch.cat(
            [self.inner.rows(context, [], logits[i : i + 1]) for i in range(len(logits))]
        )

    def legal_prefix(self, context: Sequence[int], path: Sequence[int]) -> int:
        return self.inner.legal_prefix(context, path)


class NoRollback(GrammarProcessor):
    """Fault: the matcher keeps every token it was ever given; a context that went back
    (rejected drafts) is not rolled back to."""

    def _sync(self, output: Sequence[int]) -> None:
        for tok in output[len(self._seen) :]:
            self._push(int(tok))

    def rows(
        self, context: Sequence[int], path: Sequence[int], logits: torch.Tensor
    ) -> torch.Tensor:
        self._sync(context[self.prompt_len :])
        out = logits.to(torch.float32).clone()
        for i in range(out.shape[0]):
            allowed = self.allowed()
            if allowed is not None:
                out[i].masked_fill_(~allowed, float("-inf"))
            if i < len(path):
                self._push(int(path[i]), allowed)  # drafts stay in the state
        return out


class DraftRowsBy(ModelDrafter):
    """A draft model whose rows are processed by ``own`` instead of the round's processor:
    ``own`` None with the grammar on the round masks the target's rows only (lossless: the
    walk is exact for whatever distribution the drafts come from); ``own`` the grammar with
    none on the round masks the draft's rows only (a fault: the target's rows keep tokens
    the grammar rules out)."""

    def __init__(self, model: MockLM, own: RowProcessor | None) -> None:
        super().__init__(model)
        self.own = own

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        *,
        processor: RowProcessor | None = None,
    ) -> Draft:
        return super().propose(context, k, sampling, generator, processor=self.own)


def exact_law(
    target: MockLM, prompt: list[int], cfg: SamplingConfig, n: int
) -> dict[tuple[int, ...], float]:
    """Plain decoding's law of the first n tokens under the grammar (fresh processors)."""
    out: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        nxt: dict[tuple[int, ...], float] = {}
        for seq, pr in out.items():
            ctx = prompt + list(seq)
            row = processor(target, len(prompt)).rows(
                ctx, [], target.logits_for_context(ctx)[None]
            )[0]
            probs = logits_to_probs(row, cfg).double()
            for tok in torch.nonzero(probs).flatten().tolist():
                nxt[(*seq, tok)] = pr * float(probs[tok])
        out = nxt
    return out


def pvalue(kind: str) -> float:
    draft, target = mock_pair("close", vocab_size=10, order=1, sharpness=1.0)
    prompt = [2, 9]
    cfg = SamplingConfig(1.0)
    n_tokens = 4

    def setup() -> tuple[ModelDrafter, RowProcessor | None]:
        """(the drafter, the round's processor) of one sequence."""
        inner = processor(target, len(prompt))
        if kind == "not-along-path":
            return ModelDrafter(draft), NotAlongThePath(inner)
        if kind == "no-rollback":
            return ModelDrafter(draft), NoRollback(inner.matcher, 10, inner.eos, len(prompt))
        if kind == "draft-only":
            return DraftRowsBy(draft, inner), None
        if kind == "target-only":
            return DraftRowsBy(draft, None), inner
        return ModelDrafter(draft), inner

    exact = exact_law(target, prompt, cfg, n_tokens)
    keys = sorted(exact)
    counts = dict.fromkeys(keys, 0)
    n_seq = 4000
    for s in range(n_seq):
        drafter, proc = setup()
        res = generate(
            target,
            drafter,
            prompt,
            max_new_tokens=n_tokens,
            k=3,
            sampling=cfg,
            seed=s,
            stop_on_eos=False,
            processor=proc,
        )
        t = tuple(res.tokens)
        if t not in counts:
            return 0.0  # outside the support of the constrained law
        counts[t] += 1
    obs = np.array([counts[key] for key in keys], dtype=float)
    exp = np.array([exact[key] for key in keys])
    exp = exp / exp.sum() * n_seq
    small = exp < 5
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["correct", "target-only"])
def test_sampled_output_has_the_constrained_distribution(kind: str) -> None:
    assert pvalue(kind) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["not-along-path", "no-rollback", "draft-only"])
def test_a_grammar_applied_wrongly_is_caught(kind: str) -> None:
    assert pvalue(kind) < 1e-3


# -- the trigger, errors, the checker ----------------------------------------------------------


def test_a_trigger_leaves_the_output_free_until_the_trigger_token(target: MockLM) -> None:
    grammar = 'start: "f" ("a" | "c")+ "g"\n'  # ids 8, then 3 or 5, ..., then 9
    c = Constraint("lark", grammar, "tools", trigger="f")
    proc = Grammars(target).processor(c, 1)
    logits = torch.zeros(4, VOCAB)
    free = proc.rows([2], [4, 8, 6], logits)
    assert torch.isfinite(free[0]).all() and torch.isfinite(free[1]).all()  # before <8>
    assert torch.isinf(free[2]).sum() == VOCAB - 2  # after "f": "a" or "c" only
    assert proc.legal_prefix([2], [4, 8, 6]) == 2
    assert proc.legal_prefix([2], [4, 8, 3, 5, 9]) == 5


@pytest.mark.parametrize(
    ("kind", "source", "said"),
    [
        ("json_schema", '{"type": "foo"}', "Invalid type"),
        ("json_schema", '{"type": "integer", "minimum": 5, "maximum": 3}', "nsatisfiable"),
        ("lark", "start: (((", "Expected"),
        ("regex", "(", None),
        ("lark", 'start: a\na: a "x"\n', None),
        ("lark", 'start: x\nx: "a" x\n', r"the grammar can never end: .* \(start, x\)$"),
        ("gbnf", 'root ::= x\nx ::= "a" x\n', "never end.*GBNF's root is 'start'"),
        (
            "json_schema",
            '{"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}',
            "no finite JSON value",
        ),
    ],
)
def test_a_bad_constraint_is_one_error_naming_its_field(
    target: MockLM, kind: str, source: str, said: str | None
) -> None:
    with pytest.raises(ConstraintError, match=said) as e:
        Grammars(target).check(Constraint(kind, source, "response_format"))  # type: ignore[arg-type]
    assert e.value.field == "response_format"
    assert "\n" not in str(e.value)


def test_an_engine_that_gives_up_mid_output_is_an_error_not_unmasked_rows(target: MockLM) -> None:
    """A grammar past the engine's limits that its first mask does not reveal (a pattern of a
    million repetitions: the lexer gives up on the first "a"): the row after that token was
    left unmasked, so the output silently left the grammar (a JSON schema's pattern on the
    real target returned '"Hello, world!"'). Now a ConstraintError names the field; the same
    pattern a hundred times smaller keeps every row masked."""
    blown = processor(target, 0, "start: /(a{1000}){1000}/\n")
    with pytest.raises(ConstraintError, match=r"grammar: the grammar engine gave up") as e:
        blown.rows([], [3], torch.zeros(2, VOCAB))
    assert e.value.field == "grammar" and "\n" not in str(e.value)
    again = processor(target, 0, "start: /(a{1000}){1000}/\n")  # the next request: the same
    with pytest.raises(ConstraintError, match="gave up"):
        again.rows([], [3], torch.zeros(2, VOCAB))
    fine = processor(target, 0, "start: /(a{100}){100}/\n")
    rows = fine.rows([], [3, 3], torch.zeros(3, VOCAB))  # [3, V]
    assert [int(torch.isfinite(r).sum()) for r in rows] == [1, 1, 1]  # "a" only, each row


def test_text_that_is_not_a_schema_is_refused_before_the_engine() -> None:
    with pytest.raises(ConstraintError, match="not valid JSON"):
        Constraint("json_schema", "{nope", "response_format")
    with pytest.raises(ConstraintError, match="nested"):
        Constraint("json_schema", "[" * 100 + "]" * 100, "response_format")
    with pytest.raises(ConstraintError, match="a schema is a JSON object"):
        Constraint("json_schema", "[1]", "response_format")


def test_the_engine_missing_is_one_line(monkeypatch: pytest.MonkeyPatch, target: MockLM) -> None:
    import builtins

    real_import = builtins.__import__

    def no_engine(name: str, *args: object, **kwargs: object) -> object:
        if name == "llguidance" or name.startswith("llguidance."):
            raise ImportError("No module named 'llguidance'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_engine)
    with pytest.raises(ConstraintError, match=r"specdec\[structured\]") as e:
        Grammars(target).check(Constraint("json_object", "", "response_format"))
    assert "\n" not in str(e.value)
