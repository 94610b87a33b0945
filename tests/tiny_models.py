"""Tiny real models built inside the tests (random weights, real architectures)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

SMOLLM = "smollm2-135m-instruct-q4_1"


def _char_tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2} | {c: i + 3 for i, c in enumerate(chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def make_tiny_hf(
    path: Path,
    *,
    seed: int,
    arch: str = "llama",
    layers: int = 2,
    hidden: int = 64,
    positions: int = 512,
    chat_template: str | None = None,
) -> Path:
    """A random-initialised causal LM saved as safetensors with a character tokenizer (4
    attention heads: head size hidden / 4; vLLM's CPU attention wants at least 32)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    tok = _char_tokenizer()
    if chat_template is not None:
        tok.chat_template = chat_template  # type: ignore[attr-defined]
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    cfg = cls(
        vocab_size=len(tok.get_vocab()),  # type: ignore[attr-defined]
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        bos_token_id=0,
        eos_token_id=1,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)  # type: ignore[attr-defined]
    return path


def store_model_or_skip(name: str = SMOLLM) -> Path:
    """Path of a verified store model, or skip the test saying how to get it."""
    from specdec.hub import find_entry, model_path

    entry = find_entry(name)
    assert entry is not None
    path = model_path(entry)
    if not path.exists():
        pytest.skip(f"real model {name} is not in the store: run `specdec models fetch {name}`")
    return path


def llama_cpp_or_skip() -> None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        pytest.skip("llama-cpp-python is not installed (pip install 'specdec[llamacpp]')")


def threads() -> int:
    return min(2, os.cpu_count() or 1)
