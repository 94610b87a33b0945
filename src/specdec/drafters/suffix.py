"""Suffix / prompt-lookup drafting over the prompt and everything generated so far.

Model-free, in the spirit of SuffixDecoding (arXiv 2411.04975): the context's longest suffix
that occurred earlier (up to ``max_match`` tokens) selects the earlier positions that followed
it, and the draft follows what came after them. Two things size each draft:

* the match length: at most ``ceil(draft_per_match * match_length)`` tokens (and at most K and
  ``max_draft``), so a long verbatim match may draft far ahead while a 2-token match only a
  little;
* the agreement of the earlier continuations: token by token, the draft takes the token most
  of the still-agreeing candidates continue with, and stops once the product of the voting
  shares falls below ``min_confidence``.

A draft never runs past a token that ends generation (``ends``, the target's end-of-generation
set, given by the pair): no token after it can be emitted, and in a chat the context runs on
from the prompt's end through the template's control tokens into the answer itself, so a copy
of the prompt's last lines would otherwise draft the template and the answer's first lines
(a 47-token draft of which 4 were kept, on a fresh HumanEval completion; issue 61). The end
token itself stays in the draft: an answer that ends where its copy ends saves its last round.

No match means an empty draft, so the round is a plain target step that costs nothing extra.
The draft carries no probabilities (one-hot q), which the accept/reject rule handles exactly.

The index is incremental: a hash map per n-gram size from the n tokens before a position to
the positions (in increasing order) that followed them. Indexing a new accepted token is
O(max_match - min_match + 1) dict updates; rollback removes exactly the entries of the
dropped positions (the latest ones of their lists). Rejected drafts are never indexed, since
only the accepted context passed to ``propose`` / ``rollback`` / ``prefill`` is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from specdec.core.drafter import Draft
from specdec.core.processors import RowProcessor
from specdec.core.sampling import SamplingConfig
from specdec.errors import ConfigError

# Shared tokens compared when syncing the index to a context (see SuffixDrafter._agreed).
SYNC_CHECK = 16


@dataclass(frozen=True)
class SuffixOptions:
    """How the suffix drafter matches and sizes drafts.

    max_draft        never draft more than this many tokens (K caps it too)
    min_match        shortest suffix (in tokens) that counts as a match
    max_match        longest suffix looked up (the n-gram sizes indexed are min..max)
    draft_per_match  a match of m tokens drafts at most ceil(draft_per_match * m) tokens
    min_confidence   stop drafting once the product of the candidates' voting shares drops
                     below this (0 = follow the majority as far as the length cap allows)
    max_candidates   the most recent earlier occurrences that vote (older ones are ignored)
    """

    max_draft: int = 16
    min_match: int = 2
    max_match: int = 8
    draft_per_match: float = 2.0
    min_confidence: float = 0.5
    max_candidates: int = 16

    def __post_init__(self) -> None:
        if self.max_draft < 1:
            raise ConfigError(f"suffix max_draft must be >= 1, got {self.max_draft}")
        if not 1 <= self.min_match <= self.max_match:
            raise ConfigError(
                "suffix match sizes need 1 <= min_match <= max_match, got "
                f"{self.min_match}, {self.max_match}"
            )
        if self.max_match > 64:
            raise ConfigError(f"suffix max_match must be <= 64, got {self.max_match}")
        if not (math.isfinite(self.draft_per_match) and self.draft_per_match > 0):
            raise ConfigError(f"suffix draft_per_match must be > 0, got {self.draft_per_match}")
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ConfigError(f"suffix min_confidence must be in [0, 1], got {self.min_confidence}")
        if self.max_candidates < 1:
            raise ConfigError(f"suffix max_candidates must be >= 1, got {self.max_candidates}")


def parse_suffix_options(text: str, base: SuffixOptions | None = None) -> SuffixOptions:
    """Options from ``"max_draft=16,min_match=3"`` over ``base`` (default: the defaults; the
    empty string gives ``base``), for command lines; unknown names and bad values are
    ConfigErrors."""
    types = {f.name: f.type for f in fields(SuffixOptions)}
    values: dict[str, int | float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, raw = (x.strip() for x in item.partition("="))
        if not sep or name not in types:
            raise ConfigError(
                f"suffix option {item!r}: expected NAME=VALUE with NAME one of {', '.join(types)}"
            )
        try:
            values[name] = float(raw) if types[name] in (float, "float") else int(raw)
        except ValueError as e:
            raise ConfigError(f"suffix option {name}: {raw!r} is not a number") from e
    return replace(base or SuffixOptions(), **values)  # type: ignore[arg-type]


class SuffixIndex:
    """Tokens plus, for each n in min_n..max_n, a map n-gram -> positions that followed it.

    Entry invariant: position j is in ``maps[n][tuple(tokens[j-n:j])]`` for every
    n <= j < len(tokens), each list is increasing, and nothing else is stored. So every
    indexed position has a known continuation token ``tokens[j]``.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        assert 1 <= min_n <= max_n
        self.min_n = min_n
        self.max_n = max_n
        self.tokens: list[int] = []
        self.maps: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: {} for n in range(min_n, max_n + 1)
        }
        self.appended = 0  # tokens indexed over the lifetime (tests check incrementality)

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token: int) -> None:
        """Index one more token: O(max_n - min_n + 1) dict updates."""
        j = len(self.tokens)
        toks = self.tokens
        toks.append(int(token))
        for n in range(self.min_n, min(self.max_n, j) + 1):
            self.maps[n].setdefault(tuple(toks[j - n : j]), []).append(j)
        self.appended += 1

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.append(t)

    def truncate(self, n_keep: int) -> None:
        """Forget positions >= n_keep, removing exactly their index entries."""
        assert 0 <= n_keep <= len(self.tokens)
        toks = self.tokens
        for j in range(len(toks) - 1, n_keep - 1, -1):
            for n in range(self.min_n, min(self.max_n, j) + 1):
                key = tuple(toks[j - n : j])
                positions = self.maps[n][key]
                assert positions[-1] == j, "suffix index out of order"
                positions.pop()
                if not positions:
                    del self.maps[n][key]
        del toks[n_keep:]

    def longest_match(self) -> tuple[int, list[int]]:
        """(m, positions): the longest suffix of the tokens (m in min_n..max_n) that occurred
        earlier, and the positions that followed its earlier occurrences (increasing). (0, [])
        when no suffix of at least min_n tokens occurred before."""
        toks = self.tokens
        length = len(toks)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            positions = self.maps[n].get(tuple(toks[length - n :]))
            if positions:
                return n, positions
        return 0, []


def draft_length_cap(match_len: int, k: int, options: SuffixOptions) -> int:
    """Most tokens a match of match_len tokens may draft when K = k."""
    if match_len <= 0:
        return 0
    by_match = math.ceil(options.draft_per_match * match_len)
    return max(0, min(k, options.max_draft, by_match))


def vote_draft(
    tokens: Sequence[int], candidates: Sequence[int], cap: int, min_confidence: float
) -> list[int]:
    """Follow the candidates' continuations for up to ``cap`` tokens.

    ``candidates`` are positions (increasing, all < len(tokens)) whose continuation
    ``tokens[c], tokens[c+1], ...`` is a possible future; a continuation that runs past the
    end of ``tokens`` continues with the draft itself (the text the draft would make), so
    periodic text drafts past the end. Each step takes the token most of the still-agreeing
    candidates continue with (ties: the most recent candidate's token), drops the ones that
    disagree, and multiplies the confidence by the winner's share; drafting stops before the
    confidence would fall below ``min_confidence``.
    """
    return voted(tokens, candidates, cap, min_confidence)[0]


def voted(
    tokens: Sequence[int], candidates: Sequence[int], cap: int, min_confidence: float
) -> tuple[list[int], int | None]:
    """``vote_draft``'s draft and its source: the most recent candidate whose continuation
    is the whole draft (None for an empty draft)."""
    length = len(tokens)
    draft: list[int] = []
    alive = list(candidates)
    confidence = 1.0
    for d in range(cap):
        votes: dict[int, int] = {}
        latest: dict[int, int] = {}
        for c in alive:
            i = c + d
            tok = tokens[i] if i < length else draft[i - length]
            votes[tok] = votes.get(tok, 0) + 1
            latest[tok] = c  # alive is increasing, so this ends as the latest candidate
        best = max(votes, key=lambda t: (votes[t], latest[t]))
        share = votes[best] / len(alive)
        if confidence * share < min_confidence:
            break
        confidence *= share
        draft.append(best)
        alive = [c for c in alive if _token_at(tokens, draft, c + d) == best]
    return draft, (alive[-1] if draft else None)


def _token_at(tokens: Sequence[int], draft: Sequence[int], i: int) -> int:
    return tokens[i] if i < len(tokens) else draft[i - len(tokens)]


def suffix_draft(index: SuffixIndex, k: int, options: SuffixOptions) -> tuple[int, list[int]]:
    """(match length, draft) for the indexed context: (0, []) without a match of at least
    min_match tokens."""
    match_len, draft, _ = sourced_draft(index, k, options)
    return match_len, draft


def sourced_draft(
    index: SuffixIndex, k: int, options: SuffixOptions, ends: frozenset[int] = frozenset()
) -> tuple[int, list[int], int | None]:
    """``suffix_draft`` with the draft's source (``voted``): the context position it copies;
    the draft is cut after its first token in ``ends`` (see the module doc)."""
    match_len, positions = index.longest_match()
    cap = draft_length_cap(match_len, k, options)
    if cap == 0:
        return match_len, [], None
    candidates = positions[-options.max_candidates :]
    draft, source = voted(index.tokens, candidates, cap, options.min_confidence)
    return match_len, cut_after_end(draft, ends), source


def cut_after_end(draft: list[int], ends: frozenset[int]) -> list[int]:
    """``draft`` up to and including its first token in ``ends`` (all of it without one)."""
    if ends:
        for i, tok in enumerate(draft):
            if tok in ends:
                return draft[: i + 1]
    return draft


class SuffixDrafter:
    """Suffix-match drafter over the accepted context (one-hot q, no model).

    The index follows the context incrementally: each call indexes only the tokens added since
    the last one. The decoding loop only ever extends the accepted context (rejected drafts are
    never indexed), so syncing compares the last ``SYNC_CHECK`` shared tokens and falls back to
    a full comparison only when they differ. A context that differs earlier than that but
    agrees on those tokens would keep a stale index: drafts would be worse, never wrong, since
    the target verifies every draft.
    """

    def __init__(
        self,
        options: SuffixOptions | None = None,
        name: str | None = None,
        ends: frozenset[int] = frozenset(),
    ) -> None:
        self.options = options if options is not None else SuffixOptions()
        o = self.options
        self.name = name or f"suffix{o.min_match}-{o.max_match}"
        self.ends = ends  # the target's end-of-generation ids: no draft runs past one
        self.index = SuffixIndex(o.min_match, o.max_match)
        self.last_match_len = 0  # of the latest proposal (0 = no match)
        self.last_source: int | None = None  # the context position it copies (``voted``)

    def reset(self) -> None:
        self.index = SuffixIndex(self.options.min_match, self.options.max_match)
        self.last_match_len = 0
        self.last_source = None

    def _agreed(self, context: Sequence[int]) -> int:
        """Length of the prefix the index shares with context (see the class docstring)."""
        toks = self.index.tokens
        m = min(len(toks), len(context))
        lo = max(0, m - SYNC_CHECK)
        if list(context[lo:m]) == toks[lo:m]:
            return m
        i = 0
        while i < m and toks[i] == context[i]:
            i += 1
        return i

    def _sync(self, context: Sequence[int]) -> None:
        agreed = self._agreed(context)
        if agreed < len(self.index):
            self.index.truncate(agreed)
        if agreed < len(context):
            self.index.extend(context[agreed:])

    def prefill(self, context: Sequence[int]) -> None:
        self._sync(context)

    def rollback(self, context: Sequence[int]) -> None:
        agreed = self._agreed(context)
        if agreed < len(self.index):
            self.index.truncate(agreed)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        *,
        processor: RowProcessor | None = None,
    ) -> Draft:
        if k <= 0:
            self.last_match_len, self.last_source = 0, None
            return Draft([], None)
        self._sync(context)
        self.last_match_len, tokens, self.last_source = sourced_draft(
            self.index, k, self.options, self.ends
        )
        return Draft(tokens, None)
