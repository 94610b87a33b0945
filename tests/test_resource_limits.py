"""Bounded resources: crafted GGUF metadata is refused before llama.cpp acts on it, and the
context window is capped at what the model was trained for and what memory allows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from specdec.errors import ConfigError, ModelLoadError
from specdec.hub.gguf import GGUFHeader, check_gguf_header


def _write(
    path: Path,
    *,
    block_count: int = 2,
    layers: int = 2,
    context_length: int = 2048,
    heads: tuple[int, int] = (4, 2),
) -> Path:
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(block_count)
    writer.add_context_length(context_length)
    writer.add_embedding_length(8)
    writer.add_head_count(heads[0])
    writer.add_head_count_kv(heads[1])
    writer.add_token_list(["<s>", "</s>", "a", "b"])
    writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_consistent_metadata_is_read(tmp_path: Path) -> None:
    h = check_gguf_header(_write(tmp_path / "ok.gguf"))
    assert (h.architecture, h.block_count, h.layers, h.context_length) == ("llama", 2, 2, 2048)
    assert (h.embedding_length, h.head_count, h.head_count_kv) == (8, 4, 2)
    assert h.kv_bytes_per_token() == 2 * 2 * 8 * 2 // 4 * 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_count": 100_000}, "block_count = 100000"),
        ({"block_count": 3}, "block_count says 3 layers but the file holds tensors for 2"),
        ({"context_length": 0}, "context_length = 0"),
        ({"heads": (4, 8)}, "head_count_kv = 8"),
        ({"heads": (0, 0)}, "head_count = 0"),
    ],
)
def test_crafted_metadata_is_one_clear_error(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    path = _write(tmp_path / "crafted.gguf", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ModelLoadError, match="corrupt GGUF metadata") as info:
        check_gguf_header(path)
    assert message in str(info.value)


def test_context_is_capped_by_training_and_memory(tmp_path: Path) -> None:
    from specdec.models import llamacpp

    path = tmp_path / "m.gguf"
    h = GGUFHeader(3, 1, 1, 32, 0, 0, "llama", 28, 28, 32768, 1536, 12, 2)
    llamacpp.check_context(path, h, 32768)  # what it was trained for: fine
    with pytest.raises(ConfigError, match=r"--n-ctx 32769 is more than m.gguf was trained for"):
        llamacpp.check_context(path, h, 32769)
    huge = replace(h, context_length=10**9)
    with pytest.raises(ConfigError, match=r"KV cache .* more than half of this machine"):
        llamacpp.check_context(path, huge, 10**9)
    unknown = replace(h, context_length=None, embedding_length=None)
    llamacpp.check_context(path, unknown, 10**9)  # nothing to go by: llama.cpp decides


def test_the_cli_refuses_a_crafted_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specdec.cli import main

    path = _write(tmp_path / "crafted.gguf", block_count=100_000)
    argv = ["generate", "--target", str(path), "--target-backend", "llamacpp", "-k", "0", "hi"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("specdec: error: ") and "block_count = 100000" in err[0]
