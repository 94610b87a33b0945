"""Where the output's last few tokens occur in a long token sequence (a prediction), found at a
cost per lookup that does not grow with the sequence.

Built once per sequence: for each n-gram size n in ``LEVELS`` the hashes of all its n-grams,
sorted, with the positions that follow them (numpy; O(N log N) time, 12 bytes per token and
level). A lookup of the output's suffix is at most two binary searches per level (about
2 log2 N probes) and the ``NEAREST`` occurrences on each side of the position where the
output is expected, each compared token by token for at most ``MAX_MATCH`` tokens:

    probes per ``resync`` <= len(LEVELS) * (2 * ceil(log2(N + 1)) + 2 * NEAREST * MAX_MATCH)

(``resync_bound``), and a ``skip_to`` scans at most ``SKIP_WINDOW`` positions. Before this,
re-synchronising walked every occurrence of the output's last token pair: a 3.98 MB
repetitive prediction had hundreds of thousands of them, and each round scanned them all.

What a bounded lookup gives up: a match of ``MAX_MATCH`` tokens is found wherever it is (the
nearest one ahead of the expected position, else behind); a shorter one only among the
``NEAREST`` occurrences on each side of the expected position of the longest n-gram size
that occurs. The target verifies every draft, so a worse choice costs speed, never output.

``probes`` counts the work of every lookup (binary-search steps, candidates compared, token
comparisons, positions scanned), so tests and tools can bound it without timing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

LEVELS = (8, 4, 2)  # n-gram sizes indexed, longest first
MAX_MATCH = 8  # longest output suffix compared (a longer one counts as this long)
NEAREST = 8  # occurrences compared on each side of the expected position, per level
SKIP_WINDOW = 64  # positions a single-token anchor looks through (``skip_to``)
_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd: the polynomial hash's base (mod 2^64)

assert LEVELS[0] == MAX_MATCH and min(LEVELS) >= 2


def _hashes(arr: np.ndarray, n: int) -> np.ndarray:
    """Polynomial hashes (mod 2^64) of the n-grams arr[s:s+n], s = 0..len(arr)-n [N-n+1]."""
    h = np.zeros(len(arr) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(n):
            h = h * _MULT + arr[i : len(arr) - n + 1 + i]
    return h


def _hash_of(tokens: Sequence[int]) -> np.uint64:
    return _hashes(np.asarray(tokens, dtype=np.uint64) + np.uint64(1), len(tokens))[0]


def resync_bound(n_tokens: int) -> int:
    """The most probes one ``resync`` can make on a sequence of ``n_tokens`` (see the module
    docstring): logarithmic in the length, which the bound's tests hold fixed by length."""
    search = 2 * math.ceil(math.log2(n_tokens + 1))
    return len(LEVELS) * (search + 2 * NEAREST * MAX_MATCH)


class SpanIndex:
    """The n-gram levels of one token sequence; see the module docstring."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = [int(t) for t in tokens]
        arr = np.asarray(self.tokens, dtype=np.uint64) + np.uint64(1)  # [N]; 0 never a token
        # n -> (hashes sorted [M], the position after each n-gram in that order [M])
        self._levels: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for n in LEVELS:
            if len(arr) < n:
                continue
            h = _hashes(arr, n)  # [N - n + 1]: the n-gram ending before position s + n
            order = np.argsort(h, kind="stable")  # equal hashes keep increasing positions
            self._levels[n] = (h[order], (order + n).astype(np.int64))
        self.probes = 0  # work done by lookups, cumulative (see the module docstring)

    def __len__(self) -> int:
        return len(self.tokens)

    def _search(self, keys: np.ndarray, h: np.uint64) -> tuple[int, int]:
        self.probes += 2 * math.ceil(math.log2(len(keys) + 1))
        return int(np.searchsorted(keys, h, "left")), int(np.searchsorted(keys, h, "right"))

    def _match_len(self, j: int, output: Sequence[int]) -> int:
        """Tokens of ``output``'s suffix equal to those before position j (<= MAX_MATCH)."""
        m, toks = 0, self.tokens
        limit = min(MAX_MATCH, j, len(output))
        while m < limit and toks[j - m - 1] == output[-m - 1]:
            m += 1
        self.probes += m + 1
        return m

    def resync(self, output: Sequence[int], expected: int) -> tuple[int, int] | None:
        """(position after the match, match length) of the longest suffix of ``output``
        (2..MAX_MATCH tokens) found in the sequence, ties broken by distance from
        ``expected``: ahead (>= expected) before behind, nearest first; a shorter match is
        looked for only near ``expected`` (see the module docstring). None without one."""
        for n in LEVELS:
            if n not in self._levels or len(output) < n:
                continue
            keys, positions = self._levels[n]
            lo, hi = self._search(keys, _hash_of(output[-n:]))
            if lo == hi:
                continue
            group = positions[lo:hi]  # increasing
            i = int(np.searchsorted(group, expected, "left"))
            self.probes += math.ceil(math.log2(len(group) + 1))
            near = [*group[i : i + NEAREST].tolist(), *group[max(0, i - NEAREST) : i].tolist()]
            best: tuple[int, int, int, int] | None = None  # (-length, behind, distance, j)
            for j in near:
                m = self._match_len(j, output)
                if m < n:  # a hash collision
                    continue
                key = (-m, int(j < expected), abs(j - expected), j)
                if best is None or key < best:
                    best = key
            if best is not None:
                return best[3], -best[0]
        return None

    def skip_to(self, token: int, start: int, window: int = SKIP_WINDOW) -> int | None:
        """The position after the first occurrence of ``token`` in [start, start + window)
        (the output skipped part of the sequence), or None."""
        lo = max(0, start)
        hi = min(len(self.tokens), lo + window)
        toks = self.tokens
        for j in range(lo, hi):
            if toks[j] == token:
                self.probes += j - lo + 1
                return j + 1
        self.probes += hi - lo
        return None
