"""Snapshots of a model's cache for earlier prompts, so that a request sharing a long prefix
with any of them (not only with the last one) skips that prefix's prefill.

An editor sends the same file many times, with other requests in between; a model keeps one
cache, which the request in between overwrites. Before a backend's cache loses content (a new
prompt diverges from what it holds), the content is copied out as a snapshot (llama.cpp:
``llama_state_seq_get_data``: the sequence's keys and values, a few tens of kilobytes per token
for a 1.5B model); when a later prompt shares a longer prefix with a snapshot than with the
cache, the snapshot is copied back in and only the rest is prefilled. Snapshots are kept
least-recently-used first out under a byte bound (``max_bytes``), and one that is a prefix of
a newer one is dropped (the newer holds it).

The keys and values copied back are the bits computed when the snapshot was taken, so a
restored prefix gives what the cache gave then: with exact numerics (every row the same
whatever the pass) that is what a fresh prefill computes, bit for bit; with llama.cpp's own
numerics it is the same approximation as the single-cache prefix reuse always made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# a snapshot is taken only of content at least this long past the shared prefix (smaller
# prefills cost less than the copy is worth), and restored only when it saves at least this
# many tokens of prefill over what the cache holds
MIN_TOKENS = 64
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Snapshot:
    tokens: tuple[int, ...]
    state: bytes  # the backend's serialized cache for ``tokens``
    used: int = 0  # the pool's clock at the last use


@dataclass
class PromptCache:
    """A bounded pool of cache snapshots (module docstring); pure bookkeeping, the backend
    takes and restores the states."""

    max_bytes: int = DEFAULT_MAX_BYTES
    min_tokens: int = MIN_TOKENS
    snapshots: list[Snapshot] = field(default_factory=list)
    clock: int = 0
    hits: int = 0
    saved: int = 0

    def __post_init__(self) -> None:
        if self.max_bytes < 0:
            raise ValueError(f"the prompt cache bound must be >= 0 bytes, got {self.max_bytes}")

    @property
    def size(self) -> int:
        """Bytes the snapshots hold."""
        return sum(len(s.state) for s in self.snapshots)

    def worth_keeping(self, cached: Sequence[int], kept: int) -> bool:
        """Whether cache content ``cached`` that is about to be cut to ``kept`` tokens should be
        snapshotted first."""
        return self.max_bytes > 0 and len(cached) - kept >= self.min_tokens

    def keep(self, tokens: Sequence[int], state: bytes) -> None:
        """Add a snapshot of ``tokens``; drop the ones it covers, then the least recently used
        ones while the pool is over its bound (a state larger than the bound is not kept)."""
        if len(state) > self.max_bytes:
            return
        toks = tuple(int(t) for t in tokens)
        self.snapshots = [
            s for s in self.snapshots if common_prefix(s.tokens, toks) < len(s.tokens)
        ]
        self.clock += 1
        self.snapshots.append(Snapshot(toks, state, self.clock))
        self.saved += 1
        while self.size > self.max_bytes:
            oldest = min(self.snapshots, key=lambda s: s.used)
            self.snapshots.remove(oldest)

    def best(self, tokens: Sequence[int], have: int) -> tuple[Snapshot, int] | None:
        """The snapshot sharing the longest prefix with ``tokens`` and that prefix's length,
        when it beats ``have`` (what the cache already shares) by at least ``min_tokens``."""
        best: tuple[Snapshot, int] | None = None
        for s in self.snapshots:
            n = common_prefix(s.tokens, tokens)
            if n >= have + self.min_tokens and (best is None or n > best[1]):
                best = (s, n)
        if best is not None:
            self.clock += 1
            best[0].used = self.clock
            self.hits += 1
        return best


def reuse_prefix(
    pool: PromptCache | None,
    cached: Sequence[int],
    tokens: Sequence[int],
    take: Callable[[], bytes],
    put: Callable[[tuple[int, ...], bytes], bool],
) -> int:
    """A backend's ``reuse_prefix``: the length of the longest prefix of ``tokens`` its cache
    (holding ``cached``) or a snapshot in ``pool`` shares. Content of the cache that would be
    lost is snapshotted first (``take`` serializes the cache); a better snapshot is brought in
    (``put`` replaces the cache by it, False where the backend refuses it: the cache is then
    empty and the prefix 0)."""
    have = common_prefix(cached, tokens)
    if pool is None:
        return have
    found = pool.best(tokens, have)
    kept = have if found is None else common_prefix(cached, found[0].tokens)
    if pool.worth_keeping(cached, kept):
        pool.keep(cached, take())
    if found is None:
        return have
    snap, n = found
    return n if put(snap.tokens, snap.state) else 0
