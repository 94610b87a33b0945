"""The decoding loop under a grammar on mock pairs, for the certificate's constrained level
(``certify.constrained``).

A grammar (``MOCK_GRAMMARS``: a Lark grammar and a JSON schema, each over the characters the
mock vocabulary spells, ``MockTokenizer.PIECES``) is applied the way a request's constraint
is: one ``GrammarProcessor`` per generation (``constraints.processor``, over the engine's
matcher), handed to the loop as its ``processor``, so the round masks the target's rows along
the draft's path, cuts drafts the grammar rules out and the draft model masks its own rows.

The reference is computed without that processor: ``GrammarOnMock.allowed(output)`` asks the
engine for the mask after ``output`` with a fresh matcher fed exactly those tokens (no state
carried between calls, nothing rolled back), the mock gives its logits after the context
(``MockLM.logits_for_context``), and ``logits_to_probs`` the sampling transform. From those:

- ``constrained_row``: plain decoding's row after a context under the grammar (masked logits
  [V] -> probabilities [V]);
- ``exact_constrained_window``: the exact law of the tokens in a window of positions, by
  enumerating every output prefix the grammar and the target allow (the grammar's state is
  the prefix itself, so nothing is merged: exact, and small for these grammars);
- ``constrained_greedy_path``: the argmax path under the grammar (the greedy reference);
- ``constrained_greedy_runs`` / ``constrained_setup_windows``: the loop's outputs and window
  counts (``mock_runs.greedy_outputs`` / ``sample_windows`` with a processor per generation).

The grammar engine's masks are taken as right (the reference and the loop use the same
engine); what is tested is how specdec applies them. Needs the ``structured`` extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from specdec.constraints.engine import grammar_text, vocabulary
from specdec.constraints.probe import first_mask_error, new_matcher
from specdec.constraints.processor import GrammarProcessor
from specdec.constraints.spec import Constraint, ConstraintError, json_schema
from specdec.constraints.tokens import token_table
from specdec.core.sampling import SamplingConfig, logits_to_probs
from specdec.errors import ConfigError
from specdec.mock_runs import (
    PREDICTIONS,
    SampledSetup,
    SpecOutputs,
    greedy_outputs,
    level_pair,
    sample_windows,
    setup_length,
)
from specdec.models.mock import MockLM

FIELD = "--constraint"


@dataclass(frozen=True)
class MockGrammar:
    """A built-in grammar of the constrained level: the constraint, the mock vocabulary it is
    written over (ids 3.. spell ``MockTokenizer.PIECES``: 3 is "a"), and what it says."""

    name: str
    constraint: Constraint
    vocab: int
    description: str


# items "ab" | "c" | "d" then maybe "e", one or more: after "a" only "b"; after "d" also "e";
# EOS only after a whole item (ids 3-7 are a-e at V = 8, the vocabulary of Level 2's tests)
ITEMS = 'start: item+\nitem: "ab" | "c" | "d" "e"?\n'
# a JSON object with a boolean "a" and an integer "b", nothing else (the engine's JSON schema
# converter, with JSON's whitespace between tokens); '{', '"', digits and ' ' need V = 99
JSON_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "boolean"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
MOCK_GRAMMARS: dict[str, MockGrammar] = {
    "items": MockGrammar(
        "items",
        Constraint("lark", ITEMS, FIELD),
        8,
        'Lark grammar `start: item+; item: "ab" | "c" | "d" "e"?` over ids 3-7 (a-e), V = 8',
    ),
    "json": MockGrammar(
        "json",
        json_schema(JSON_SCHEMA, FIELD),
        99,
        'JSON schema {"a": boolean, "b": integer} (both required, no other key) over the '
        "mock's 96 characters, V = 99",
    ),
}

MAX_PREFIXES = 200_000  # output prefixes an exact law may enumerate (a grammar too wide: error)


def mock_grammar(name: str) -> MockGrammar:
    """The built-in grammar ``name``, or ConfigError naming the known ones."""
    if name not in MOCK_GRAMMARS:
        raise ConfigError(f"{FIELD}: unknown grammar {name!r}; known: {', '.join(MOCK_GRAMMARS)}")
    return MOCK_GRAMMARS[name]


class GrammarOnMock:
    """One grammar over one mock target's vocabulary: fresh processors for the loop, and the
    reference mask after an output straight from the engine."""

    def __init__(self, grammar: MockGrammar, target: MockLM) -> None:
        table = token_table(target)
        self.vocab_size = table.vocab_size
        self.eos = table.eos
        vocab = vocabulary(table)
        text = grammar_text(grammar.constraint)
        error = first_mask_error(vocab, text)
        if error:
            raise ConstraintError(FIELD, f"grammar {grammar.name!r}: {error}")
        self._first: Any = new_matcher(vocab, text)
        self._eos_only = torch.zeros(self.vocab_size, dtype=torch.bool)  # [V]
        self._eos_only[list(self.eos)] = True
        self._words = np.zeros((self.vocab_size + 31) // 32, dtype=np.int32)  # [ceil(V/32)]
        self._masks: dict[tuple[int, ...], torch.Tensor] = {}

    def processor(self, prompt_len: int) -> GrammarProcessor:
        """A fresh processor for one generation after ``prompt_len`` prompt tokens (what
        ``constraints.grammars.Grammars.processor`` makes, without the checker's worker)."""
        return GrammarProcessor(self._first.deep_copy(), self.vocab_size, self.eos, prompt_len)

    def allowed(self, output: Sequence[int]) -> torch.Tensor:
        """The tokens the grammar allows after ``output`` (the generated tokens) [V] bool:
        a fresh matcher fed ``output``; only EOS after an EOS. ValueError for an output the
        grammar rules out (no law visits one)."""
        key = tuple(int(t) for t in output)
        if key not in self._masks:
            self._masks[key] = self._compute(key)
        return self._masks[key]

    def _compute(self, output: tuple[int, ...]) -> torch.Tensor:
        if any(t in self.eos for t in output):
            return self._eos_only
        matcher = self._first.deep_copy()
        if output and not matcher.consume_tokens(list(output)):
            raise ValueError(f"the grammar rules out the output {list(output)}")
        matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")[: self.vocab_size]
        allowed = torch.from_numpy(bits.astype(np.bool_))  # [V]
        # an empty mask (the engine failed) ends the output, as the processor does
        return allowed if bool(allowed.any()) else self._eos_only


def constrained_row(
    target: MockLM,
    grammar: GrammarOnMock,
    prompt: Sequence[int],
    output: Sequence[int],
    sampling: SamplingConfig,
) -> torch.Tensor:
    """Plain decoding's next-token distribution [V] after prompt + output under the grammar:
    the target's logits, the tokens the grammar rules out at -inf, the sampling transform."""
    logits = target.logits_for_context([*prompt, *output])  # [V]
    masked = logits.masked_fill(~grammar.allowed(output), float("-inf"))  # [V]
    return logits_to_probs(masked, sampling)  # [V]


def exact_constrained_window(
    target: MockLM,
    grammar: GrammarOnMock,
    prompt: Sequence[int],
    start: int,
    m: int,
    sampling: SamplingConfig,
) -> np.ndarray:
    """Exact law [V^m] of the generated tokens at positions start..start+m-1 (1-based;
    category index sum_i y_i * V^i) of plain decoding under the grammar with no stop at EOS:
    every output prefix with positive probability enumerated, position by position."""
    vocab = target.vocab_size
    prefixes: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(start + m - 1):
        nxt: dict[tuple[int, ...], float] = {}
        for out, prob in prefixes.items():
            row = constrained_row(target, grammar, prompt, out, sampling).double().numpy()  # [V]
            for tok in np.flatnonzero(row > 0):
                nxt[(*out, int(tok))] = prob * float(row[tok])
        if len(nxt) > MAX_PREFIXES:
            raise ValueError(f"more than {MAX_PREFIXES} output prefixes: too wide to enumerate")
        prefixes = nxt
    law = np.zeros(vocab**m)  # [V^m]
    for out, prob in prefixes.items():
        law[sum(t * vocab**i for i, t in enumerate(out[start - 1 :]))] += prob
    return law


def constrained_greedy_path(
    target: MockLM, grammar: GrammarOnMock, prompt: Sequence[int], max_new_tokens: int
) -> list[int]:
    """The argmax path under the grammar (first index on ties), stopping after EOS: the
    greedy reference, independent of the loop and of the processor."""
    out: list[int] = []
    while len(out) < max_new_tokens:
        logits = target.logits_for_context([*prompt, *out])  # [V]
        tok = int(torch.argmax(logits.masked_fill(~grammar.allowed(out), float("-inf"))))
        out.append(tok)
        if tok in target.eos_token_ids:
            break
    return out


def constrained_pair(
    grammar: MockGrammar, closeness: str, pair_seed: int
) -> tuple[MockLM, MockLM, GrammarOnMock]:
    """(draft, target, the grammar over the target) of one unit."""
    draft, target = level_pair(closeness, grammar.vocab, pair_seed)
    return draft, target, GrammarOnMock(grammar, target)


def constrained_greedy_runs(
    grammar: MockGrammar,
    closeness: str,
    pair_seed: int,
    prompts: Sequence[Sequence[int]],
    foreign_seeds: Sequence[int],
    max_new_tokens: int,
    drafters: Sequence[str],
    ks: Sequence[int],
) -> list[tuple[list[int], list[int], SpecOutputs]]:
    """Per prompt, under the grammar: (the greedy reference path, plain decoding, speculative
    decoding for every (drafter, K)), each generation with a fresh processor; predictions
    are made from the reference path."""
    draft, target, on_mock = constrained_pair(grammar, closeness, pair_seed)
    out = []
    for prompt, foreign in zip(prompts, foreign_seeds, strict=True):
        ref = constrained_greedy_path(target, on_mock, prompt, max_new_tokens)
        out.append(
            greedy_outputs(
                draft,
                target,
                prompt,
                ref,
                max_new_tokens,
                drafters,
                ks,
                foreign,
                processors=partial(on_mock.processor, len(prompt)),
            )
        )
    return out


def constrained_setup_windows(
    grammar: MockGrammar,
    setup: SampledSetup,
    prompt: Sequence[int],
    windows: Sequence[tuple[int, int]],
    pair_seed: int,
    seeds: Sequence[int],
    foreign_seed: int,
) -> list[tuple[tuple[int, int], np.ndarray, np.ndarray]]:
    """One sampled setup under the grammar: per window, (window, counts [V^m] of one
    sequence per seed of ``seeds``, each with a fresh processor, exact law [V^m])."""
    draft, target, on_mock = constrained_pair(grammar, setup.closeness, pair_seed)
    exact = {
        (s, m): exact_constrained_window(target, on_mock, prompt, s, m, setup.sampling)
        for s, m in windows
    }
    right = None
    if setup.drafter in PREDICTIONS:
        right = constrained_greedy_path(target, on_mock, prompt, setup_length(setup, windows))
    counts = sample_windows(
        setup,
        draft,
        target,
        prompt,
        right,
        windows,
        seeds,
        foreign_seed,
        processors=partial(on_mock.processor, len(prompt)),
    )
    return [((s, m), counts[s, m], exact[s, m]) for s, m in windows]
