"""Deterministic mock models with exactly known next-token distributions.

The logits after a context are a pure function of (seed, the last ``order`` tokens): a
standard-normal vector scaled by ``sharpness`` drawn from a generator seeded with a stable hash
of that window. A draft "close to" a target uses the target's logits plus a perturbation of
size ``noise`` drawn the same way from another seed; noise 0 gives a draft identical to the
target, a different base seed gives an unrelated ("far") draft.

The cache is real bookkeeping: it stores the window keys of every cached position, and logits
are computed from the cached keys, so a wrong ``truncate`` changes later logits (tests rely on
that). Call counters let tests check how often the loop calls each model.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from specdec.core.model import check_extend_args, check_truncate_args


class MockTokenizer:
    """Bytes -> ids (byte b maps to id 3 + b mod (V - 3)); ids 0..2 are special."""

    BOS, EOS, PAD = 0, 1, 2

    def __init__(self, vocab_size: int) -> None:
        assert vocab_size >= 4
        self.vocab_size = vocab_size

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = [3 + b % (self.vocab_size - 3) for b in text.encode("utf-8")]
        return ([self.BOS] if add_special_tokens else []) + ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(f"<{int(i)}>" for i in ids)


@dataclass(frozen=True)
class MockSpec:
    """What defines a mock model's distribution."""

    vocab_size: int = 16
    seed: int = 0
    order: int = 2
    sharpness: float = 2.0
    noise_seed: int = 0
    noise: float = 0.0
    n_ctx: int = 4096
    eos_token_id: int = MockTokenizer.EOS
    # more end-of-generation ids (as llama.cpp's EOG set and a generation config may list
    # several): generation stops at any of them
    more_eos: tuple[int, ...] = ()
    # Gaussians are drawn at this length and cut to vocab_size (0: vocab_size), so models of
    # different vocabulary sizes (padded pairs) can share their first ids' logits.
    draw_vocab: int = 0


def _window_seed(seed: int, window: Sequence[int]) -> int:
    data = struct.pack(f"<q{len(window)}q", seed, *window)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def _gaussian(seed: int, window: Sequence[int], vocab_size: int) -> torch.Tensor:
    g = torch.Generator(device="cpu")
    g.manual_seed(_window_seed(seed, window))
    return torch.randn(vocab_size, generator=g, dtype=torch.float32)  # [V]


class MockLM:
    """A ``CausalLM`` whose logits are an exactly known function of the context."""

    def __init__(self, spec: MockSpec | None = None, **kwargs: float | int) -> None:
        self.spec = spec if spec is not None else MockSpec(**kwargs)  # type: ignore[arg-type]
        s = self.spec
        self.vocab_size = s.vocab_size
        self.n_ctx = s.n_ctx
        self.eos_token_ids = frozenset({s.eos_token_id, *s.more_eos})
        self._tokenizer = MockTokenizer(s.vocab_size)
        self._tokens: list[int] = []
        self._keys: list[tuple[int, ...]] = []  # the cached "KV": one window key per position
        self.extend_calls = 0
        self.tokens_processed = 0

    # -- the exactly known distribution -------------------------------------------------
    def logits_for_context(self, context: Sequence[int]) -> torch.Tensor:
        """Next-token logits [V] after ``context`` (a pure function of the last window)."""
        return self._logits_for_key(tuple(int(t) for t in context[-self.spec.order :]))

    def greedy_continuation(self, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation straight from ``logits_for_context`` (argmax, first index on
        ties), stopping after EOS: the exact greedy path, independent of any decoding loop."""
        ctx = [int(t) for t in prompt]
        out: list[int] = []
        while len(out) < max_new_tokens:
            tok = int(torch.argmax(self.logits_for_context(ctx)))
            out.append(tok)
            ctx.append(tok)
            if tok in self.eos_token_ids:
                break
        return out

    def _logits_for_key(self, key: tuple[int, ...]) -> torch.Tensor:
        s = self.spec
        n = s.draw_vocab or s.vocab_size
        assert n >= s.vocab_size, "draw_vocab must cover the vocabulary"
        out = s.sharpness * _gaussian(s.seed, key, n)
        if s.noise:
            out = out + s.noise * _gaussian(s.noise_seed, key, n)
        return out[: s.vocab_size]

    # -- CausalLM ------------------------------------------------------------------------
    @property
    def tokenizer(self) -> MockTokenizer:
        return self._tokenizer

    @property
    def n_cached(self) -> int:
        return len(self._tokens)

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        check_extend_args(self, tokens)
        self.extend_calls += 1
        self.tokens_processed += len(tokens)
        rows = []
        order = self.spec.order
        for t in tokens:
            self._tokens.append(int(t))
            prev = self._keys[-1] if self._keys else ()
            key = (*prev, int(t))[-order:]
            self._keys.append(key)
            rows.append(self._logits_for_key(key))
        out = torch.stack(rows)  # [n, V]
        return out[-1:] if last_only else out

    def truncate(self, n_keep: int) -> None:
        check_truncate_args(self, n_keep)
        del self._tokens[n_keep:]
        del self._keys[n_keep:]

    @property
    def cached_tokens(self) -> list[int]:
        return list(self._tokens)


def mock_pair(
    closeness: str = "close",
    *,
    vocab_size: int = 16,
    seed: int = 0,
    order: int = 2,
    sharpness: float = 2.0,
    draft_vocab_size: int | None = None,
) -> tuple[MockLM, MockLM]:
    """(draft, target) mock models; closeness is 'identical', 'close' or 'far'.

    ``draft_vocab_size`` (default: vocab_size) makes a padded pair: the draft has that many
    ids, and both models draw their logits at the larger size and cut them to their own, so
    the ids they share keep the closeness asked for ('identical' then means equal logits on
    the shared ids)."""
    dvocab = vocab_size if draft_vocab_size is None else draft_vocab_size
    draw = 0 if dvocab == vocab_size else max(dvocab, vocab_size)
    base = MockSpec(
        vocab_size=vocab_size, seed=seed, order=order, sharpness=sharpness, draw_vocab=draw
    )
    target = MockLM(base)
    if closeness == "identical":
        dspec = base
    elif closeness == "close":
        dspec = replace(base, noise_seed=seed + 1000, noise=0.7)
    elif closeness == "far":
        dspec = replace(base, seed=seed + 7919)
    else:
        raise ValueError(f"closeness must be identical, close or far, got {closeness!r}")
    return MockLM(replace(dspec, vocab_size=dvocab)), target
