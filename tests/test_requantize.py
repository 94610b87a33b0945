"""Requantizing a GGUF with llama-cpp-python's bundled quantizer (SmolLM2-135M Q4_1 -> Q4_0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.core.loop import generate
from specdec.errors import ConfigError, ModelLoadError
from specdec.hub import sha256_file
from specdec.models.requantize import requantize, requantized_path
from tiny_models import llama_cpp_or_skip, store_model_or_skip, threads


def test_unknown_type_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown type"):
        requantize(tmp_path / "x.gguf", "q3_weird", cache_dir=tmp_path)


def test_cache_path_names_type_and_purity(tmp_path: Path) -> None:
    src = Path("/m/draft-q4_k_m.gguf")
    assert requantized_path(src, "q4_0", cache_dir=tmp_path) == (
        tmp_path / "requantized" / "draft-q4_k_m.q4_0.gguf"
    )
    assert requantized_path(src, "q4_0", pure=True, cache_dir=tmp_path).name == (
        "draft-q4_k_m.q4_0.pure.gguf"
    )


def test_a_file_that_is_not_gguf_is_a_load_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope" * 100)
    with pytest.raises(ModelLoadError):
        requantize(bad, "q4_0", cache_dir=tmp_path)


@pytest.mark.real_model
@pytest.mark.llamacpp
def test_requantize_records_checksums_reuses_the_copy_and_stays_a_valid_draft(
    tmp_path: Path,
) -> None:
    llama_cpp_or_skip()
    smol = store_model_or_skip()
    from specdec.models.llamacpp import LlamaCppLM

    res = requantize(smol, "q4_0", n_threads=threads(), cache_dir=tmp_path)
    assert not res.reused and res.path.is_file()
    assert res.sha256 == sha256_file(res.path) and res.source_sha256 == sha256_file(smol)
    meta = json.loads(res.path.with_name(res.path.name + ".json").read_text(encoding="utf-8"))
    assert meta["sha256"] == res.sha256 and meta["ftype"] == "q4_0"
    again = requantize(smol, "q4_0", cache_dir=tmp_path)
    assert again.reused and again.sha256 == res.sha256
    # a damaged cached copy is not reused
    with res.path.open("r+b") as f:
        f.seek(res.size // 2)
        f.write(b"\x00" * 64)
    redone = requantize(smol, "q4_0", n_threads=threads(), cache_dir=tmp_path)
    assert not redone.reused and redone.sha256 == res.sha256  # deterministic output

    draft = LlamaCppLM(res.path, n_ctx=256, n_threads=threads())
    target = LlamaCppLM(smol, n_ctx=256, n_threads=threads())
    ids = target.tokenizer.encode("def add(a, b):", add_special_tokens=False)
    spec = generate(target, draft, ids, max_new_tokens=12, k=3, stop_on_eos=False)
    assert len(spec.tokens) == 12
    assert sum(r.n_accepted for r in spec.rounds) > 0  # the requantized draft still agrees
