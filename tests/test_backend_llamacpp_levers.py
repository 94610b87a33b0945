"""llama.cpp backend speed levers on the real SmolLM2-135M (Q4_1): repack switch, micro-batch
and batch-thread options, and padded verify passes.

Real-model tests skip with a reason when the file or llama-cpp-python is absent. Padded and
unpadded passes run different kernel shapes, so their logits are compared against the
backend's own batch-shape noise, measured in the same test, not for equality.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from specdec.core.loop import generate
from specdec.drafters.suffix import SuffixDrafter
from specdec.errors import ConfigError
from tiny_models import llama_cpp_or_skip, store_model_or_skip, threads


@pytest.fixture(scope="module")
def smol() -> Path:
    llama_cpp_or_skip()
    return store_model_or_skip()


def _lm(path: Path, n_ctx: int = 256, **kwargs: Any) -> Any:
    from specdec.models.llamacpp import LlamaCppLM

    return LlamaCppLM(path, n_ctx=n_ctx, n_threads=threads(), **kwargs)


def _ids(n: int, seed: int = 0) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(100, 40000) for _ in range(n)]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"pad_to": 16, "n_batch": 8}, "pad_to"),
        ({"pad_to": 16, "n_ubatch": 8}, "pad_to"),
        ({"pad_to": 1}, "pad_to"),
        ({"pad_to": 16, "pad_min": 16}, "pad_min"),
        ({"pad_to": 16, "pad_min": 0}, "pad_min"),
        ({"pad_min": 4}, "pad_min needs pad_to"),
        ({"n_ubatch": 0}, "n_ubatch"),
        ({"n_threads_batch": -1}, "n_threads_batch"),
        ({"n_batch": 0}, "n_batch"),
    ],
)
def test_bad_lever_options_are_config_errors(
    tmp_path: Path, kwargs: dict[str, int], message: str
) -> None:
    """Checked before the file is even opened (so no model is needed)."""
    from specdec.models.llamacpp import LlamaCppLM

    with pytest.raises(ConfigError, match=message):
        LlamaCppLM(tmp_path / "absent.gguf", **kwargs)


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_defaults_are_unchanged(smol: Path) -> None:
    lm = _lm(smol)
    assert lm.repack is True and bool(lm.llm.model_params.use_extra_bufts) is True
    assert lm.n_ubatch == lm.n_batch == 128
    assert lm.n_threads_batch == lm.n_threads == threads()
    assert lm.pad_to is None and not lm.will_pad(12)


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_repack_off_reaches_llama_cpp_and_leaves_the_library_as_it_was(smol: Path) -> None:
    import llama_cpp

    original = llama_cpp.llama_cpp.llama_model_default_params
    lm = _lm(smol, repack=False, n_ubatch=32, n_threads_batch=1)
    assert bool(lm.llm.model_params.use_extra_bufts) is False
    assert lm.n_ubatch == 32 and lm.n_threads_batch == 1
    assert llama_cpp.llama_cpp.llama_model_default_params is original
    assert bool(original().use_extra_bufts) is True
    ids = _ids(20)
    on = _lm(smol).extend(ids)
    off = lm.extend(ids)
    assert off.shape == on.shape
    # other kernels may run without repack: close, and the same greedy choice almost always
    assert (off.argmax(-1) == on.argmax(-1)).float().mean() >= 0.9
    assert float((off - on).abs().max()) < 2.0


def _noise_and_padding_gap(smol: Path, n: int, pad_to: int, seed: int) -> tuple[float, float]:
    """(batch-shape noise, padding gap) for n new tokens after a 40-token context: noise is
    the largest |logit| change of the n rows between an n-row pass and the first n rows of a
    pad_to-row pass of real tokens; the gap is the same between the n-row pass and the padded
    pass."""
    ctx, new = _ids(40, seed), _ids(pad_to, seed + 100)
    plain, padded = _lm(smol), _lm(smol, pad_to=pad_to, pad_min=1)
    for lm in (plain, padded):
        lm.extend(ctx)
    ref = plain.extend(new[:n])
    plain.truncate(len(ctx))
    wide = plain.extend(new)[:n]
    got = padded.extend(new[:n])
    assert padded.padded_calls == 1
    return float((wide - ref).abs().max()), float((got - ref).abs().max())


@pytest.mark.real_model
@pytest.mark.llamacpp
@pytest.mark.parametrize("n", [1, 5, 12])
def test_a_padded_pass_matches_an_unpadded_one_within_batch_shape_noise(smol: Path, n: int) -> None:
    noise, gap = _noise_and_padding_gap(smol, n, 16, seed=n)
    # the padded pass computes the real rows like a 16-row pass of real tokens, so its gap
    # is of the size of the batch-shape noise (a pad row's content never reaches them)
    assert gap <= max(1.5 * noise, 1e-4), (gap, noise)


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_pad_rows_never_reach_the_real_rows_or_stay_in_the_cache(smol: Path) -> None:
    ctx, new = _ids(30, 1), _ids(7, 2)
    a, b = _lm(smol, pad_to=16), _lm(smol, pad_to=16)
    for lm in (a, b):
        lm.extend(ctx)
    ra = a._extend_padded(new, filler=new[-1])
    rb = b._extend_padded(new, filler=12345)
    assert torch.equal(ra, rb)  # pad content is invisible to the real rows
    assert ra.shape == (7, a.vocab_size)
    for lm in (a, b):
        assert lm.n_cached == 37 and lm.cache_pos_max() == 36
    # the next pass sees exactly the real tokens: both models agree bit for bit
    assert torch.equal(a.extend([42]), b.extend([42]))
    assert a.cache_pos_max() == 37


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_padding_applies_only_in_its_range_and_with_room(smol: Path) -> None:
    lm = _lm(smol, n_ctx=256, pad_to=16)  # pad_min defaults to 9
    assert lm.pad_min == 9
    lm.extend(_ids(8))  # below pad_min: unpadded
    lm.extend(_ids(16))  # pad_to itself: unpadded
    assert lm.padded_calls == 0
    lm.extend(_ids(10))  # padded
    assert lm.padded_calls == 1 and lm.n_cached == 34 and lm.cache_pos_max() == 33
    lm.extend(_ids(10), last_only=True)  # prefill-style calls are never padded
    assert lm.padded_calls == 1
    # fill up to 12 free positions: 9 real tokens fit, 16 rows would not
    lm.extend(_ids(lm.n_ctx - 12 - lm.n_cached), last_only=True)
    lm.extend(_ids(9))
    assert lm.padded_calls == 1 and lm.n_cached == lm.n_ctx - 3
    assert lm.cache_pos_max() == lm.n_ctx - 4
    lm.truncate(lm.n_ctx - 16)  # exactly room for 16 rows: padded again
    lm.extend(_ids(9))
    assert lm.padded_calls == 2 and lm.cache_pos_max() == lm.n_ctx - 8


@pytest.mark.real_model
@pytest.mark.llamacpp
@pytest.mark.parametrize("seed", range(2))
def test_extend_truncate_with_padding_equals_fresh_with_the_same_batch_shapes(
    smol: Path, seed: int
) -> None:
    rnd = random.Random(seed)
    lm, fresh = _lm(smol, pad_to=16, pad_min=2), _lm(smol, pad_to=16, pad_min=2)
    chunks: list[list[int]] = []
    for _ in range(10):
        if chunks and rnd.random() < 0.35:
            chunks = chunks[: rnd.randrange(len(chunks))]
            lm.truncate(sum(map(len, chunks)))
            assert lm.cache_pos_max() == lm.n_cached - 1
        else:
            c = _ids(rnd.randint(1, 12), rnd.randrange(10**6))
            got = lm.extend(c)
            chunks.append(c)
            fresh.truncate(0)
            for ch in chunks[:-1]:
                fresh.extend(ch)
            assert torch.equal(got, fresh.extend(chunks[-1]))
    assert lm.padded_calls > 0


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_greedy_speculative_with_padding_equals_without(smol: Path) -> None:
    """Suffix drafts on a prompt that repeats itself, target verify passes padded to 16 rows
    vs unpadded: the same greedy tokens (on this model and build the real rows of a padded
    pass equal those of an unpadded multi-row pass bit for bit; see the noise test). The
    number of padded passes and accepted drafts is checked so the test is not vacuous.
    Equality with plain one-token decoding is not asserted: 1-row and multi-row passes
    differ by the batch-shape noise, which can flip a near-tie."""
    text = (
        "def area(width, height):\n    return width * height\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
        "Repeat the two functions above exactly:\n"
    )
    ids = _lm(smol).tokenizer.encode(text, add_special_tokens=False)
    results = {}
    for label, kwargs in (("unpadded", {}), ("padded", {"pad_to": 16, "pad_min": 2})):
        target = _lm(smol, n_ctx=512, **kwargs)
        res = generate(target, SuffixDrafter(), ids, max_new_tokens=48, k=12, stop_on_eos=False)
        results[label] = (res, getattr(target, "padded_calls", 0))
    (unpadded, _), (padded, n_padded) = results["unpadded"], results["padded"]
    assert n_padded > 0
    assert sum(r.n_accepted for r in padded.rounds) > 0
    assert padded.tokens == unpadded.tokens
