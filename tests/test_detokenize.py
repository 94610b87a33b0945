"""Streaming text: the tokenizers library's DecodeStream for transformers fast tokenizers, a
windowed incremental decoder for the others; both give exactly the full decode."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from specdec.core.detokenize import IncrementalDecoder
from specdec.models.hf import HFTokenizer
from specdec.models.mock import MockTokenizer

TEXT = "héllo wörld 東京は日本の首都です 🙂🚀 def f(x):\n    return x  # done\n" * 3


@pytest.fixture(scope="module")
def byte_bpe() -> HFTokenizer:
    """A small byte-level BPE fast tokenizer (GPT-2 style), trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<eos>"],
    )
    tok.train_from_iterator([TEXT, "hello world the capital"], trainer)
    return HFTokenizer(PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>"))


class CountingDecodes(HFTokenizer):
    def __init__(self, inner: HFTokenizer) -> None:
        super().__init__(inner.tok)
        self.decoded_ids = 0

    def decode(self, ids: Sequence[int]) -> str:
        self.decoded_ids += len(ids)
        return super().decode(ids)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_decode_stream_pieces_join_to_the_full_decode(byte_bpe: HFTokenizer, chunk: int) -> None:
    ids = byte_bpe.encode(TEXT, add_special_tokens=False)
    counting = CountingDecodes(byte_bpe)
    dec = IncrementalDecoder(counting)
    assert dec._step is not None  # the library's DecodeStream, not the window
    pieces = [dec.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    assert counting.decoded_ids == 0  # nothing re-decoded while streaming
    pieces.append(dec.flush())
    assert "".join(pieces) == byte_bpe.decode(ids) == TEXT
    assert not any("\ufffd" in p for p in pieces)


def test_decode_stream_on_random_ids_matches_the_full_decode(byte_bpe: HFTokenizer) -> None:
    """Arbitrary id sequences (broken UTF-8 included) stream to what one decode gives."""
    rnd = random.Random(0)
    for _ in range(20):
        ids = [rnd.randrange(400) for _ in range(rnd.randint(1, 40))]
        dec = IncrementalDecoder(byte_bpe)
        text = "".join(dec.push([t]) for t in ids) + dec.flush()
        assert text == byte_bpe.decode(ids)


class WindowCounting(MockTokenizer):
    def __init__(self) -> None:
        super().__init__(300)
        self.decoded_ids = 0

    def decode(self, ids: Sequence[int]) -> str:
        self.decoded_ids += len(ids)
        return super().decode(ids)


def test_the_fallback_decodes_a_window_not_the_whole_output() -> None:
    """Tokenizers without a stream decoder (llama.cpp, mocks): work per round is bounded by
    the round's tokens, not the output so far (linear overall, not quadratic)."""
    tok = WindowCounting()
    dec = IncrementalDecoder(tok)
    n_rounds, per_round = 400, 3
    out = "".join(dec.push([5, 6, 7]) for _ in range(n_rounds)) + dec.flush()
    assert out == tok.decode([5, 6, 7] * n_rounds)
    streamed = tok.decoded_ids - n_rounds * per_round  # minus the check decode above
    assert streamed <= 4 * n_rounds * per_round
