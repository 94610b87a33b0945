"""A model's vocabulary as a grammar engine needs it: the bytes every token id adds to the
text, which ids are control tokens (never part of constrained text), and which end a
generation (allowed where the grammar accepts).

A tokenizer takes part by implementing ``token_pieces(n)`` (the llama.cpp, transformers and
mock backends do); ``encode_piece`` (text -> ids, special text not parsed), when present, is
the tokenizer the engine calls back for text it must tokenize.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from specdec.core.model import CausalLM
from specdec.errors import ConfigError


@runtime_checkable
class PieceTokenizer(Protocol):
    def token_pieces(self, n: int) -> tuple[list[bytes], frozenset[int]]:
        """(the bytes each id 0..n-1 adds to the text, the ids of control tokens)."""
        ...


@dataclass(frozen=True)
class TokenTable:
    """One model's vocabulary for a grammar: ``pieces[i]`` the bytes id i adds to the text
    (b"" for ids that add none), ``special`` the control tokens, ``eos`` the ids that end a
    generation. ``encode``: text -> ids (no special tokens), for the engine's callbacks."""

    pieces: tuple[bytes, ...]
    special: frozenset[int]
    eos: tuple[int, ...]
    encode: Callable[[str], list[int]] | None = field(default=None, compare=False)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def id_of(self, text: str) -> int | None:
        """The one id whose piece is exactly ``text`` (the lowest such id), or None."""
        want = text.encode("utf-8")
        return next((i for i, p in enumerate(self.pieces) if p == want), None)


def token_table(model: CausalLM) -> TokenTable:
    """The vocabulary of ``model`` (the target: drafts and rows use its ids), or ConfigError
    for a backend whose tokenizer does not list its token bytes."""
    tok = model.tokenizer
    if not isinstance(tok, PieceTokenizer):
        raise ConfigError(
            "structured outputs need the token bytes of the model's vocabulary, which this "
            f"backend's tokenizer ({type(tok).__name__}) does not give"
        )
    pieces, special = tok.token_pieces(model.vocab_size)
    eos = tuple(sorted(t for t in model.eos_token_ids if 0 <= t < model.vocab_size))
    piece_encoder = getattr(tok, "encode_piece", None)
    encode: Callable[[str], list[int]] | None = None
    if callable(piece_encoder):

        def encode(text: str) -> list[int]:
            return list(piece_encoder(text, special=False))

    return TokenTable(tuple(pieces), frozenset(special) | frozenset(eos), eos, encode)


def greedy_encoder(pieces: Sequence[bytes]) -> Callable[[bytes], list[int]]:
    """Longest-match tokenization over ``pieces`` (for vocabularies without a tokenizer of
    their own, such as the mock's): bytes no piece starts are skipped."""
    by_first: dict[int, list[tuple[bytes, int]]] = {}
    for i, p in enumerate(pieces):
        if p:
            by_first.setdefault(p[0], []).append((p, i))
    for options in by_first.values():
        options.sort(key=lambda pi: -len(pi[0]))

    def encode(data: bytes) -> list[int]:
        out: list[int] = []
        at = 0
        while at < len(data):
            for p, i in by_first.get(data[at], ()):
                if data.startswith(p, at):
                    out.append(i)
                    at += len(p)
                    break
            else:
                at += 1
        return out

    return encode
