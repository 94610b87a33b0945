"""transformers backend on tiny random models made here (fp32: exactness holds)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from specdec.core.loop import generate
from specdec.core.model import CausalLM
from specdec.core.vocab import check_same_vocabulary
from specdec.errors import ModelLoadError
from specdec.models.hf import load_hf
from specdec.models.loader import ModelConfig, load_model
from tiny_models import make_tiny_hf


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("hf")
    target = make_tiny_hf(root / "target", seed=1, arch="qwen2", layers=3)
    draft = make_tiny_hf(root / "draft", seed=2, arch="qwen2", layers=1)
    return draft, target


def test_loads_and_satisfies_the_protocol(tiny_dirs: tuple[Path, Path]) -> None:
    lm = load_hf(tiny_dirs[1], device="cpu", dtype="float32", n_ctx=256)
    assert isinstance(lm, CausalLM)
    assert lm.vocab_size == 100 and 1 in lm.eos_token_ids and lm.n_ctx == 256
    ids = lm.tokenizer.encode("hello")
    assert lm.tokenizer.decode(ids) == "hello"
    out = lm.extend(ids)
    assert out.shape == (len(ids), 100) and out.dtype == torch.float32 and out.device.type == "cpu"
    assert lm.extend([5, 6, 7], last_only=True).shape == (1, 100)


def test_loader_picks_hf_for_directories(tiny_dirs: tuple[Path, Path]) -> None:
    lm = load_model(ModelConfig(str(tiny_dirs[1]), dtype="float32", device="cpu"))
    assert type(lm).__name__ == "HFCausalLM"


@pytest.mark.parametrize("seed", range(3))
def test_extend_truncate_equals_fresh_with_the_same_chunks(
    tiny_dirs: tuple[Path, Path], seed: int
) -> None:
    """Truncating at chunk boundaries and extending gives bit-identical logits to a fresh
    model fed the same chunks (fp32, same batch shapes)."""
    rnd = random.Random(seed)
    lm = load_hf(tiny_dirs[1], device="cpu", dtype="float32")
    fresh_model = load_hf(tiny_dirs[1], device="cpu", dtype="float32")
    chunks: list[list[int]] = []
    for _ in range(12):
        if chunks and rnd.random() < 0.35:
            keep = rnd.randrange(len(chunks))
            chunks = chunks[:keep]
            lm.truncate(sum(map(len, chunks)))
        else:
            c = [rnd.randrange(3, 100) for _ in range(rnd.randint(1, 6))]
            got = lm.extend(c)
            chunks.append(c)
            fresh_model.truncate(0)
            for ch in chunks[:-1]:
                fresh_model.extend(ch)
            assert torch.equal(got, fresh_model.extend(chunks[-1]))


def test_truncate_mid_chunk_matches_fresh_within_fp32_noise(tiny_dirs: tuple[Path, Path]) -> None:
    lm = load_hf(tiny_dirs[1], device="cpu", dtype="float32")
    ids = list(range(10, 30))
    full = lm.extend(ids)
    lm.truncate(7)
    again = lm.extend(ids[7:])
    # different batch shapes may change fp32 rounding only (measured ~1e-6 here)
    assert (again - full[7:]).abs().max().item() < 1e-4
    with pytest.raises(ValueError):
        lm.truncate(99)


def test_greedy_speculative_equals_plain_on_fp32_pairs(tiny_dirs: tuple[Path, Path]) -> None:
    draft = load_hf(tiny_dirs[0], device="cpu", dtype="float32")
    target = load_hf(tiny_dirs[1], device="cpu", dtype="float32")
    check_same_vocabulary(draft, target)
    for prompt in ["def f(x):", "Hello world", "a"]:
        ids = target.tokenizer.encode(prompt)
        plain = generate(target, None, ids, max_new_tokens=24, k=0, stop_on_eos=False)
        for k in (1, 3, 6):
            spec = generate(target, draft, ids, max_new_tokens=24, k=k, stop_on_eos=False)
            assert spec.tokens == plain.tokens, (prompt, k)


def test_bf16_runs(tiny_dirs: tuple[Path, Path]) -> None:
    lm = load_hf(tiny_dirs[1], device="cpu", dtype="bfloat16")
    assert lm.dtype == torch.bfloat16
    assert lm.extend([4, 5]).dtype == torch.float32


def test_missing_model_is_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError):
        load_hf(tmp_path / "empty", device="cpu")


def test_llama_arch_and_tokenizer_mismatch_is_named(
    tmp_path: Path, tiny_dirs: tuple[Path, Path]
) -> None:
    """A llama-class directory loads; its tokenizer class treats spaces differently from the
    qwen2 one here, and the pair check must say where the two first differ."""
    from specdec.errors import VocabMismatchError

    other = load_hf(
        make_tiny_hf(tmp_path / "llama", seed=3, arch="llama", layers=1),
        device="cpu",
        dtype="float32",
    )
    target = load_hf(tiny_dirs[1], device="cpu", dtype="float32")
    a = other.tokenizer.encode("a b", add_special_tokens=False)
    b = target.tokenizer.encode("a b", add_special_tokens=False)
    if a == b:
        pytest.skip("this transformers version tokenizes both alike")
    with pytest.raises(VocabMismatchError, match="differ at token"):
        check_same_vocabulary(other, target)


def test_cache_is_used_split_extend_equals_one_pass(tiny_dirs: tuple[Path, Path]) -> None:
    """Rows after a split extend see the earlier tokens: on a transformers version whose
    forward does not take the cache under the name the backend passes it, every extend ran
    without its past (plain decoding garbage, no error)."""
    lm = load_hf(tiny_dirs[1], device="cpu", dtype="float32")
    ids = list(range(10, 22))
    whole = lm.extend(ids)
    lm.truncate(0)
    lm.extend(ids[:5])
    rest = lm.extend(ids[5:])
    assert (rest - whole[5:]).abs().max().item() < 1e-4


def test_cache_keyword_follows_the_forward_signature() -> None:
    from specdec.models.hf import cache_keyword

    class New:
        def forward(self, input_ids: Any = None, cache: Any = None, **kw: Any) -> None: ...

    class Old:
        def forward(
            self, input_ids: Any = None, past_key_values: Any = None, **kw: Any
        ) -> None: ...

    assert cache_keyword(New()) == "cache"
    assert cache_keyword(Old()) == "past_key_values"


def test_a_swallowed_cache_fails_the_length_check(tiny_dirs: tuple[Path, Path]) -> None:
    """The cache-length invariant catches a forward that ignores the cache keyword."""
    lm = load_hf(tiny_dirs[1], device="cpu", dtype="float32")
    lm._cache_kw = "not_a_parameter"  # swallowed by the model's **kwargs, as in the old bug
    with pytest.raises(AssertionError, match="KV cache holds 0 positions"):
        lm.extend([5, 6, 7])


def test_gguf_loads_ask_transformers_to_unpack(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the `kernels` package installed, transformers keeps GGUF weights packed unless
    told otherwise; the GGUF load asks for dense weights where the option exists."""
    import sys
    import types

    from specdec.models.hf import gguf_dequantize_kwargs

    monkeypatch.setitem(sys.modules, "kernels", types.ModuleType("kernels"))
    kw = gguf_dequantize_kwargs()
    try:
        from transformers import GgufConfig
    except ImportError:
        assert kw == {}
        return
    assert isinstance(kw["quantization_config"], GgufConfig)
    assert kw["quantization_config"].dequantize is True


def test_packed_gguf_weights_are_a_clear_error() -> None:
    from specdec.models.hf import check_dense

    class GgufLinear(torch.nn.Module):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), GgufLinear())
    check_dense(torch.nn.Sequential(torch.nn.Linear(2, 2)), Path("m.gguf"))
    with pytest.raises(ModelLoadError, match=r"packed in GGUF blocks.*kernels"):
        check_dense(model, Path("m.gguf"))


def test_the_gguf_load_passes_dequantize_to_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GGUF path itself asks transformers for dense weights (with `kernels` installed it
    would otherwise keep them packed): the call transformers receives carries the option."""
    import sys
    import types

    import transformers

    from specdec.models import hf

    seen: dict[str, Any] = {}

    def from_pretrained(*args: Any, **kw: Any) -> Any:
        seen.update(kw)
        raise RuntimeError("stop here")

    monkeypatch.setitem(sys.modules, "kernels", types.ModuleType("kernels"))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr("specdec.hub.gguf.check_gguf_header", lambda path: None)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="stop here"):
        hf._load_from_gguf(gguf, torch.float32)
    assert seen["gguf_file"] == "m.gguf"
    qc = seen.get("quantization_config")
    if hasattr(transformers, "GgufConfig"):
        assert qc is not None and qc.dequantize is True
