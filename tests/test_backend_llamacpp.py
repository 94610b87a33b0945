"""llama.cpp backend on the real SmolLM2-135M (Q4_1, 98 MB) from the store.

Skipped with a reason when the file or llama-cpp-python is absent; `make test` fetches it.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from specdec.core.loop import generate
from specdec.core.model import CausalLM
from specdec.core.vocab import check_same_vocabulary
from specdec.errors import ModelLoadError
from tiny_models import llama_cpp_or_skip, store_model_or_skip, threads

pytestmark = [pytest.mark.real_model, pytest.mark.llamacpp]


@pytest.fixture(scope="module")
def smol() -> Path:
    llama_cpp_or_skip()
    return store_model_or_skip()


def _lm(path: Path, n_ctx: int = 256) -> CausalLM:
    from specdec.models.llamacpp import LlamaCppLM

    return LlamaCppLM(path, n_ctx=n_ctx, n_threads=threads())


def test_protocol_and_shapes(smol: Path) -> None:
    lm = _lm(smol)
    assert isinstance(lm, CausalLM)
    assert lm.vocab_size == 49152 and lm.n_ctx == 256 and lm.eos_token_ids
    ids = lm.tokenizer.encode("The capital of France is", add_special_tokens=False)
    out = lm.extend(ids)
    assert out.shape == (len(ids), 49152) and out.dtype == torch.float32
    assert lm.tokenizer.decode(ids) == "The capital of France is"
    assert lm.extend([42], last_only=True).shape == (1, 49152)
    assert lm.n_cached == len(ids) + 1


def test_long_prefill_spans_several_llama_batches(smol: Path) -> None:
    lm = _lm(smol, n_ctx=512)
    ids = [random.Random(0).randrange(100, 40000) for _ in range(300)]  # > n_batch = 128
    rows = lm.extend(ids)
    assert rows.shape[0] == 300 and torch.isfinite(rows).all()
    last = lm.extend(ids[:5], last_only=True)
    assert last.shape == (1, 49152)


@pytest.mark.parametrize("seed", range(2))
def test_extend_truncate_equals_fresh_with_the_same_batch_shapes(smol: Path, seed: int) -> None:
    rnd = random.Random(seed)
    lm, fresh = _lm(smol), _lm(smol)
    chunks: list[list[int]] = []
    for _ in range(10):
        if chunks and rnd.random() < 0.35:
            chunks = chunks[: rnd.randrange(len(chunks))]
            lm.truncate(sum(map(len, chunks)))
        else:
            c = [rnd.randrange(100, 40000) for _ in range(rnd.randint(1, 6))]
            got = lm.extend(c)
            chunks.append(c)
            fresh.truncate(0)
            for ch in chunks[:-1]:
                fresh.extend(ch)
            assert torch.equal(got, fresh.extend(chunks[-1]))


def test_greedy_speculative_on_llamacpp_pair_runs(smol: Path) -> None:
    target, draft = _lm(smol), _lm(smol)
    ids = target.tokenizer.encode("def add(a, b):", add_special_tokens=False)
    res = generate(target, draft, ids, max_new_tokens=20, k=4, stop_on_eos=False)
    assert len(res.tokens) == 20
    # identical draft and target (same file): almost everything is accepted; batch-shape
    # differences of the quantized backend may flip a rare near-tie, so not asserted == 1
    acc = [a for a in res.acceptance_by_position() if a == a]
    assert sum(acc) / len(acc) > 0.8


def test_mixed_backends_end_to_end(
    smol: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp draft -> transformers fp32 target (the GGUF dequantized by transformers):
    runs, shares one tokenizer, and greedy output equals the target's own greedy output."""
    from specdec.models.hf import load_hf

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))  # the converted copy goes here
    target = load_hf(smol, device="cpu", dtype="float32", n_ctx=256)
    draft = _lm(smol)
    check_same_vocabulary(draft, target)
    assert (tmp_path / "hf-converted").is_dir()
    # the padded-vocabulary check compares these lists: both backends give the same strings
    texts = draft.tokenizer.token_texts(draft.vocab_size + 3)  # type: ignore[attr-defined]
    assert texts == target.tokenizer.token_texts(draft.vocab_size + 3)  # type: ignore[attr-defined]
    assert texts[-3:] == [None] * 3 and texts[1000] is not None
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = target.tokenizer.apply_chat(msgs)
    assert ids == draft.tokenizer.apply_chat(msgs)
    plain = generate(target, None, ids, max_new_tokens=16, k=0)
    spec = generate(target, draft, ids, max_new_tokens=16, k=3)
    assert spec.tokens == plain.tokens
    assert "Paris" in target.tokenizer.decode(spec.tokens)


def test_corrupt_and_truncated_files_are_load_errors(smol: Path, tmp_path: Path) -> None:
    from specdec.models.llamacpp import LlamaCppLM

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelLoadError):
        LlamaCppLM(bad)
    cut = tmp_path / "cut.gguf"
    with smol.open("rb") as f:
        cut.write_bytes(f.read(5_000_000))
    with pytest.raises(ModelLoadError):
        LlamaCppLM(cut)
