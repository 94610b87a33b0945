"""llama.cpp backend (GGUF, quantized) through llama-cpp-python.

Logits are read straight from llama.cpp's output buffer for exactly the positions of each
``extend`` call, so no n_ctx x vocab score matrix is allocated (that matrix is what
``Llama(logits_all=True)`` reserves: 1.2 GB for a Qwen vocabulary at n_ctx 2048). Rollback
removes cache positions with ``memory_seq_rm``: exact, no re-evaluation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec.errors import ConfigError, ModelLoadError
from specdec.models.base import check_extend_args, check_truncate_args

# Tokens per llama_decode call. Llama() also keeps an n_batch x vocab float buffer of its own.
DEFAULT_N_BATCH = 128


def _import_llama() -> Any:
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ModelLoadError(
            "the llama.cpp backend needs llama-cpp-python: pip install 'specdec[llamacpp]'"
        ) from e
    return llama_cpp


class LlamaCppTokenizer:
    """The ``Tokenizer`` protocol over llama.cpp's tokenizer (special tokens are parsed, as
    transformers tokenizers do), with the GGUF's own chat template."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.add_bos = bool(llm._model.add_bos_token())
        self.chat_template: str | None = llm.metadata.get("tokenizer.chat_template")

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if not text:
            return [self.llm.token_bos()] if add_special_tokens and self.add_bos else []
        return list(
            self.llm.tokenize(
                text.encode("utf-8"), add_bos=add_special_tokens and self.add_bos, special=True
            )
        )

    def decode(self, ids: Sequence[int]) -> str:
        raw: bytes = self.llm.detokenize([int(i) for i in ids], special=True)
        return raw.decode("utf-8", errors="replace")

    def apply_chat(self, messages: list[dict[str, str]]) -> list[int]:
        if not self.chat_template:
            raise ModelLoadError("this GGUF has no chat template; drop --chat")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        bos = self.decode([self.llm.token_bos()]) if self.llm.token_bos() >= 0 else ""
        eos = self.decode([self.llm.token_eos()]) if self.llm.token_eos() >= 0 else ""
        text = env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos
        )
        return self.encode(text, add_special_tokens=False)


class LlamaCppLM:
    """``CausalLM`` over a llama.cpp context (one sequence)."""

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        n_batch: int = DEFAULT_N_BATCH,
        device: str = "auto",
    ) -> None:
        from specdec.hub.gguf import check_gguf_header

        if n_ctx < 2:
            raise ConfigError(f"n_ctx must be >= 2, got {n_ctx}")
        path = Path(path)
        check_gguf_header(path)
        llama_cpp = _import_llama()
        threads = n_threads or max(1, os.cpu_count() or 1)
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_batch=min(n_batch, n_ctx),
                n_ubatch=min(n_batch, n_ctx),
                n_threads=threads,
                n_threads_batch=threads,
                logits_all=False,
                # offload every layer unless the CPU was asked for (a CPU build ignores it)
                n_gpu_layers=0 if device == "cpu" else -1,
                verbose=False,
            )
        except Exception as e:  # llama-cpp-python raises ValueError/RuntimeError
            raise ModelLoadError(f"llama.cpp could not load {path}: {e}") from e
        self.path = path
        self.n_ctx = int(self.llm.n_ctx())
        self.vocab_size = int(self.llm.n_vocab())
        self.n_batch = int(self.llm.n_batch)
        eos = {int(self.llm.token_eos()), int(self.llm._model.token_eot())}
        self.eos_token_ids = frozenset(t for t in eos if t >= 0)
        self._tokenizer = LlamaCppTokenizer(self.llm)
        self._tokens: list[int] = []
        self.extend_calls = 0
        self.llm._ctx.kv_cache_seq_rm(-1, 0, -1)

    @property
    def tokenizer(self) -> LlamaCppTokenizer:
        return self._tokenizer

    @property
    def n_cached(self) -> int:
        return len(self._tokens)

    @property
    def cached_tokens(self) -> list[int]:
        return list(self._tokens)

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        check_extend_args(self, tokens)
        toks = [int(t) for t in tokens]
        rows: list[np.ndarray] = []
        ctx, batch, vocab = self.llm._ctx, self.llm._batch, self.vocab_size
        for start in range(0, len(toks), self.n_batch):
            chunk = toks[start : start + self.n_batch]
            is_last_chunk = start + self.n_batch >= len(toks)
            want_all = not last_only
            batch.set_batch(batch=chunk, n_past=len(self._tokens), logits_all=want_all)
            try:
                ctx.decode(batch)
            except RuntimeError as e:
                self.truncate(len(self._tokens))  # drop what the failed decode left behind
                raise ModelLoadError(f"llama.cpp decode failed: {e}") from e
            self._tokens.extend(chunk)
            n_out = len(chunk) if want_all else 1
            if want_all or is_last_chunk:
                buf = np.ctypeslib.as_array(ctx.get_logits(), shape=(n_out * vocab,))
                rows.append(buf.reshape(n_out, vocab).copy())
        self.extend_calls += 1
        return torch.from_numpy(np.concatenate(rows, axis=0))  # [n or 1, V] float32

    def truncate(self, n_keep: int) -> None:
        check_truncate_args(self, n_keep)
        self.llm._ctx.kv_cache_seq_rm(-1, n_keep, -1)
        del self._tokens[n_keep:]
