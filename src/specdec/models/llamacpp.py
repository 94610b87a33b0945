"""llama.cpp backend (GGUF, quantized) through llama-cpp-python.

Logits are read straight from llama.cpp's output buffer for exactly the positions of each
``extend`` call, so no n_ctx x vocab score matrix is allocated (that matrix is what
``Llama(logits_all=True)`` reserves: 1.2 GB for a Qwen vocabulary at n_ctx 2048). Rollback
removes cache positions with ``memory_seq_rm``: exact, no re-evaluation.

Speed levers (keyword options, all off by default so the defaults behave as before):

* ``repack=False`` loads the weights without llama.cpp's extra CPU buffer types (repacked
  weights, AMX, ...: ``llama_model_params.use_extra_bufts``, what llama-cli's ``--no-repack``
  sets; ``llama_trust.llama_params`` sets fields ``Llama()`` does not expose); the field the model
  was loaded with is checked afterwards. With repack on (the default), the build's extra
  buffer types are first checked on this machine in child processes (``llama_trust.kernel_check``,
  once per machine, build and weight types); one that crashes or computes wrong numbers is
  left out, per tensor where that suffices.
* No chat template from the file is compiled at load (``llama_trust.llama_params``): specdec
  renders templates itself, bounded (``specdec.templates``).
* ``n_ubatch`` / ``n_threads_batch``: llama.cpp's physical batch and the threads used for
  passes over more than one token.
* ``exact=True``: every logits row is bit-identical whatever the number of tokens in its pass,
  so speculative output equals plain decoding's token for token (``models.exact``). On ggml's
  CPU backend a row's bits depend on the pass size through four kernel switches, each
  avoided here: optional kernels whose n-row path sums in another order than their one-row
  path (on x86 the repacked Q4_K gemm, 4+ rows: ``llama_trust.exact_kernels`` finds them per
  buffer type and weight type, in child processes, once per build, machine and model, and
  moves only those weights to the plain kernels; the others keep their repacked kernels. On
  the exact build, ``make install``, the repacked kernels have a row-invariant mode,
  which exact numerics switch on for the process, ``GGML_CPU_REPACK_ROW_INVARIANT=1``, so
  nothing is moved),
  the tiled K-quant path (8+ rows; ``GGML_CPU_TILED_MM=0`` for the whole process, as ggml
  reads it once; the exact build's mode from patch version 2 on keeps it, Q6_K's smaller
  products then summing in its order, and leaves it for the other types), attention
  without flash attention (batched F16 mat-muls from 2 rows; flash attention is turned on)
  and flash attention's one-token path, which splits the KV range across threads once 512+
  cells are in use (only when K and V have the same F16/F32 type; a multi-token pass takes
  a tiled path under the same condition), so the cache holds Q8_0 keys and F16 values: an
  F16/F16 cache would take that split; with Q8_0 values (the first choice) a 512-token pass
  on the 1.5B took 7.7 / 7.1 s against the default's 6.0 / 5.5 s (two runs), as every value
  row is converted for every query, with Q8_0 keys 6.3 / 5.9 s (``benchmarks/studies/README.md``);
  BF16 values' per-cell conversion made decode at 1,500 tokens 3x slower on the small test
  model). On the exact build from patch version 4 a one-token pass's float products sum in
  llamafile_sgemm's order, so llama.cpp's default attention is row-invariant and exact
  numerics keep it (no flash attention, F16 cache; ``exact_kernels.exact_attention``).
  The model checks itself at load (``models.exact.self_check``) and refuses to run if any
  row differs. On a stock build it costs decode speed where the moved kernels are faster,
  and prefill speed (no tiled path); ``benchmarks/exact_cost.py`` measures both.
* ``pad_to``: a pass over n real tokens with ``pad_min <= n < pad_to`` is run as ``pad_to``
  rows. The pad rows come after the real ones (so causal attention keeps them out of the real
  rows), are marked non-output, and their cache cells are removed right after the pass with
  ``memory_seq_rm``, so the cache holds exactly the real tokens. The point is speed: some
  ggml CPU kernels only use their wide path on multiples of 16 rows.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from specdec.core.model import check_extend_args, check_truncate_args
from specdec.errors import ConfigError, ModelLoadError
from specdec.llama_trust.exact_kernels import (
    TILED_ENV,
    ExactAttention,
    ExactVerdict,
    exact_verdict,
    row_invariant_keeps_tiled,
    use_row_invariant_kernels,
)

# The llama.cpp trust subsystem (``specdec.llama_trust``) is imported by the backends and the
# doctor alone; the tools above them (profile, certify, the exact-numerics default) reach
# what they record of the build through this door: these re-exports and build_identity().
from specdec.llama_trust.exact_kernels import exact_attention as exact_attention
from specdec.llama_trust.ggml_bufts import Choice
from specdec.llama_trust.kernel_check import (
    CheckSettings,
    KernelVerdict,
    Log,
    kernel_verdict,
    stderr_log,
)
from specdec.llama_trust.kernel_check import build_line as build_line
from specdec.llama_trust.kernel_check import build_summary as build_summary
from specdec.llama_trust.lib_identity import LibIdentity as LibIdentity
from specdec.llama_trust.lib_identity import LibIdentityError as LibIdentityError
from specdec.llama_trust.lib_identity import loaded as loaded_library  # noqa: F401
from specdec.llama_trust.llama_params import has_param_field, load_llama
from specdec.models.prompt_cache import DEFAULT_MAX_BYTES, PromptCache, reuse_prefix

if TYPE_CHECKING:
    from specdec.hub.gguf import GGUFHeader

# Tokens per llama_decode call. Llama() also keeps an n_batch x vocab float buffer of its own.
DEFAULT_N_BATCH = 128


# KV cache element types the backend offers, by name -> ggml's type id (enum ggml_type)
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}


def _import_llama() -> Any:
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ModelLoadError(
            "the llama.cpp backend needs llama-cpp-python: pip install 'specdec[llamacpp]'"
        ) from e
    except (RuntimeError, OSError) as e:  # its shared library would not load
        from specdec.util.printable import printable

        where = os.environ.get("LLAMA_CPP_LIB_PATH")
        hint = f" (LLAMA_CPP_LIB_PATH={where}: unset it or point it at a build)" if where else ""
        raise ModelLoadError(
            f"llama-cpp-python could not load its library{hint}: {printable(e, 300)}"
        ) from e
    return llama_cpp


def build_identity() -> tuple[str, int] | None:
    """(SHA-256 of the libggml-cpu llama-cpp-python would load, its row-invariant patch
    version, 0 for the stock build); None where llama-cpp-python cannot be imported."""
    try:
        import llama_cpp
    except (ImportError, OSError, RuntimeError):
        return None
    from specdec.llama_trust.ggml_bufts import ggml, lib_dir
    from specdec.llama_trust.lib_identity import file_sha256

    libdir = Path(lib_dir(llama_cpp))
    lib = next(iter(sorted(libdir.glob("libggml-cpu.*"))), None)
    digest = file_sha256(lib) if lib is not None else "unknown"
    return digest, ggml(llama_cpp).row_invariant_version()


# TILED_ENV: ggml reads it once per process, at its first K-quant matrix product


def _exact_settings(
    repack: bool | None,
    type_k: str,
    type_v: str,
    attention: ExactAttention,
    keep_tiled: bool = False,
) -> tuple[bool, bool, str, str]:
    """The settings exact numerics need (refusing contradicting ones): repack as asked (on by
    default: the optional kernels that break row invariance are moved off per weight type at
    load, ``llama_trust.exact_kernels``), the build's ``attention``
    (``exact_kernels.exact_attention``), and ggml's tiled K-quant path switched off for this
    process unless the environment already says so, or the build keeps it (``keep_tiled``:
    the exact build's row-invariant mode, version 2 on, makes the tiled path and the small
    products sum in one order). Returns (repack, flash_attn, type_k, type_v)."""
    if (type_k, type_v) not in (("f16", "f16"), attention.kv()):
        raise ConfigError(
            f"exact numerics set the KV cache types themselves ({'/'.join(attention.kv())})"
        )
    tiled = "0" if keep_tiled else os.environ.setdefault(TILED_ENV, "0")
    if tiled.strip() != "0":
        raise ConfigError(
            f"exact numerics need ggml's tiled matrix path off, but {TILED_ENV}={tiled!r} is set"
        )
    return repack is not False, attention.flash_attn, attention.type_k, attention.type_v


def default_pad_min(pad_to: int) -> int:
    """Smallest pass padded when only pad_to is given: more than half of pad_to (9 for 16),
    since padding a pass to more than twice its rows rarely pays."""
    return pad_to // 2 + 1


class LlamaCppTokenizer:
    """The ``Tokenizer`` protocol over llama.cpp's tokenizer (special tokens are parsed, as
    transformers tokenizers do), with the GGUF's own chat template."""

    def __init__(self, llm: Any) -> None:
        llama_cpp = _import_llama()
        self.llm = llm
        self.vocab = llama_cpp.llama_model_get_vocab(llm.model)  # llama_vocab pointer
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.chat_template: str | None = llm.metadata.get("tokenizer.chat_template")
        self._specials: frozenset[str] | None = None

    def token_texts(self, n: int) -> list[str | None]:
        """The vocabulary strings of ids 0..n-1 as the GGUF stores them (the same strings a
        transformers tokenizer of the model lists), None past the model's vocabulary."""
        llama_cpp = _import_llama()
        have = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        return [
            llama_cpp.llama_vocab_get_text(self.vocab, i).decode("utf-8", errors="replace")
            if i < have
            else None
            for i in range(n)
        ]

    def token_pieces(self, n: int) -> tuple[list[bytes], frozenset[int]]:
        """The bytes each id 0..n-1 adds to the text (b"" past the model's vocabulary) and
        the control tokens, which add no text (``specdec.constraints``: a grammar's mask)."""
        llama_cpp = _import_llama()
        have = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        flags = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
        size = 256
        buf = ctypes.create_string_buffer(size)
        pieces: list[bytes] = []
        special: set[int] = set()
        for i in range(min(n, have)):
            if llama_cpp.llama_vocab_get_attr(self.vocab, i) & flags:
                special.add(i)
                pieces.append(b"")
                continue
            got = llama_cpp.llama_token_to_piece(self.vocab, i, buf, size, 0, True)
            if got > size:  # not seen in real vocabularies; read it whole
                big = ctypes.create_string_buffer(got)
                got = llama_cpp.llama_token_to_piece(self.vocab, i, big, got, 0, True)
                pieces.append(big.raw[:got])
            else:
                pieces.append(buf.raw[: max(got, 0)])
        pieces += [b""] * (n - len(pieces))
        return pieces, frozenset(special)

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

    def encode_piece(self, text: str, *, special: bool) -> list[int]:
        """Ids of ``text`` without BOS; special-token text parsed only when ``special``."""
        if not text:
            return []
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=special))

    def special_texts(self) -> frozenset[str]:
        """The texts of the control tokens (what llama.cpp parses only with special on)."""
        if self._specials is None:
            llama_cpp = _import_llama()
            flags = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
            n = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
            self._specials = frozenset(
                llama_cpp.llama_vocab_get_text(self.vocab, i).decode("utf-8", "replace")
                for i in range(n)
                if llama_cpp.llama_vocab_get_attr(self.vocab, i) & flags
            )
        return self._specials

    def chat_variables(self) -> dict[str, Any]:
        bos = self.decode([self.llm.token_bos()]) if self.llm.token_bos() >= 0 else ""
        eos = self.decode([self.llm.token_eos()]) if self.llm.token_eos() >= 0 else ""
        return {"add_generation_prompt": True, "bos_token": bos, "eos_token": eos}

    def apply_chat(
        self, messages: list[dict[str, str]], *, parse_special: bool = False
    ) -> list[int]:
        """The GGUF's chat template over ``messages``; message text is text unless
        ``parse_special`` (specdec.templates)."""
        if not self.chat_template:
            raise ModelLoadError("this GGUF has no chat template; drop --chat")
        from specdec.templates import encode_chat

        return encode_chat(self, messages, parse_special=parse_special)


def end_of_generation_ids(llama_cpp: Any, vocab: Any) -> frozenset[int]:
    """Every token the model declares end-of-generation (``llama_vocab_is_eog``: its EOS and
    EOT, and the control tokens llama.cpp's vocabulary loader adds to that set, such as
    ``<|endoftext|>`` and ``<|file_sep|>`` beside ``<|im_end|>`` for Qwen2.5): the set at
    which llama.cpp's own loops stop. One call per vocabulary entry (0.2 s for 151,936 ids
    here), once per load."""
    n = int(llama_cpp.llama_vocab_n_tokens(vocab))
    is_eog = llama_cpp.llama_vocab_is_eog
    ids = {t for t in range(n) if is_eog(vocab, t)}
    eos = {int(llama_cpp.llama_vocab_eos(vocab)), int(llama_cpp.llama_vocab_eot(vocab))}
    return frozenset(ids | {t for t in eos if 0 <= t < n})


def physical_memory() -> int | None:
    """Bytes of RAM on this machine (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check_context(path: Path, header: GGUFHeader, n_ctx: int) -> None:
    """The context window a user asks for is what the model was trained for at most, and its
    KV cache fits in half the machine's memory (llama.cpp itself only warns and allocates)."""
    if header.context_length is not None and n_ctx > header.context_length:
        raise ConfigError(
            f"--n-ctx {n_ctx} is more than {path.name} was trained for "
            f"({header.context_length} tokens)"
        )
    per_token, ram = header.kv_bytes_per_token(), physical_memory()
    if per_token is not None and ram is not None and per_token * n_ctx > ram // 2:
        raise ConfigError(
            f"--n-ctx {n_ctx} needs a {per_token * n_ctx / 2**30:.1f} GiB KV cache for "
            f"{path.name}, more than half of this machine's {ram / 2**30:.1f} GiB"
        )


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
        repack: bool | None = None,
        n_ubatch: int | None = None,
        n_threads_batch: int | None = None,
        pad_to: int | None = None,
        pad_min: int | None = None,
        flash_attn: bool = False,
        type_k: str = "f16",
        type_v: str = "f16",
        exact: bool = False,
        verbose: bool = False,
        check_kernels: bool = True,
        kernels: Choice | None = None,
        log: Log = stderr_log,
        prompt_cache_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        """n_ubatch defaults to n_batch, n_threads_batch to n_threads (both as before these
        options existed), verbose shows llama.cpp's load log; pad_min defaults to
        ``default_pad_min(pad_to)``. repack defaults to on (off with ``exact``). With repack
        on, the build's optional kernels are checked on this machine first
        (``llama_trust.kernel_check``, cached; ``log`` hears what it turns off) unless
        ``check_kernels`` is False; ``kernels`` names the choice of optional kernels outright
        (no check, no exact-numerics verdict: the probes' children). See the module docstring
        for repack, padding and exact numerics."""
        from specdec.hub.gguf import check_gguf_header

        if exact:
            llama_cpp = _import_llama()
            keep_tiled = row_invariant_keeps_tiled(llama_cpp)
            repack, flash_attn, type_k, type_v = _exact_settings(
                repack, type_k, type_v, exact_attention(llama_cpp), keep_tiled
            )
        repack = True if repack is None else repack

        if n_ctx < 2:
            raise ConfigError(f"n_ctx must be >= 2, got {n_ctx}")
        for label, value, least in (
            ("prompt_cache_bytes", prompt_cache_bytes, 0),
            ("n_batch", n_batch, 1),
            ("n_ubatch", n_ubatch, 1),
            ("n_threads", n_threads, 0),  # 0 or None: all cores
            ("n_threads_batch", n_threads_batch, 0),  # 0 or None: n_threads
        ):
            if value is not None and value < least:
                raise ConfigError(f"{label} must be >= {least}, got {value}")
        batch = min(n_batch, n_ctx)
        ubatch = min(n_ubatch or batch, batch)
        if pad_to is not None:
            if not 2 <= pad_to <= ubatch:
                raise ConfigError(
                    f"pad_to must be in 2..n_ubatch ({ubatch}) so a padded pass is one "
                    f"llama.cpp micro-batch, got {pad_to}"
                )
            pad_min = default_pad_min(pad_to) if pad_min is None else pad_min
            if not 1 <= pad_min < pad_to:
                raise ConfigError(f"pad_min must be in 1..pad_to-1, got {pad_min}")
        elif pad_min is not None:
            raise ConfigError("pad_min needs pad_to")
        path = Path(path)
        header = check_gguf_header(path)
        check_context(path, header, n_ctx)
        llama_cpp = _import_llama()
        for label, kv in (("type_k", type_k), ("type_v", type_v)):
            if kv not in KV_TYPES:
                raise ConfigError(f"{label} must be one of {', '.join(KV_TYPES)}, got {kv!r}")
        threads = n_threads or max(1, os.cpu_count() or 1)
        self.kernels: KernelVerdict | None = None
        self.exact_kernels: ExactVerdict | None = None
        # the exact build's row-invariant repacked kernels (on for exact numerics where built)
        self.row_invariant = bool(exact) and use_row_invariant_kernels(llama_cpp)
        choice = Choice(extras=False)
        if kernels is not None:
            choice = kernels
        elif repack:
            if check_kernels:
                self.kernels = kernel_verdict(
                    path, header, CheckSettings(n_threads=threads), log=log, device=device
                )
                choice = Choice.parse(self.kernels.choice)
            else:
                choice = Choice()
            if exact:
                self.exact_kernels = exact_verdict(path, header.tensors, choice, threads, log=log)
                choice = choice.avoiding(self.exact_kernels.avoid)
        if not choice.extras and not has_param_field(llama_cpp, "use_extra_bufts"):
            raise ConfigError(
                "loading without llama.cpp's extra buffer types needs a newer "
                "llama-cpp-python: this one's llama_model_params has no use_extra_bufts field"
            )
        try:
            self.llm = load_llama(
                llama_cpp,
                path,
                choice,
                n_ctx=n_ctx,
                n_batch=batch,
                n_ubatch=ubatch,
                n_threads=threads,
                n_threads_batch=n_threads_batch or threads,
                logits_all=False,
                # offload every layer unless the CPU was asked for (a CPU build ignores it)
                n_gpu_layers=0 if device == "cpu" else -1,
                flash_attn=flash_attn,
                type_k=KV_TYPES[type_k],
                type_v=KV_TYPES[type_v],
                verbose=verbose,
            )
        except ModelLoadError:
            raise
        except Exception as e:  # llama-cpp-python raises ValueError/RuntimeError
            raise ModelLoadError(f"llama.cpp could not load {path}: {e}") from e
        if has_param_field(llama_cpp, "use_extra_bufts"):
            loaded = bool(self.llm.model_params.use_extra_bufts)
            assert loaded == choice.extras, "use_extra_bufts did not reach the model params"
        self.kernel_choice = choice
        self.repack = choice.extras
        self.flash_attn = flash_attn
        self.type_k, self.type_v = type_k, type_v
        self.exact = exact
        self.n_ubatch = int(self.llm.context_params.n_ubatch)
        self.n_threads = int(self.llm.context_params.n_threads)
        self.n_threads_batch = int(self.llm.context_params.n_threads_batch)
        self.pad_to = pad_to
        self.pad_min = pad_min
        self.padded_calls = 0  # extend calls that ran padded
        self.path = path
        self.n_ctx = int(self.llm.n_ctx())
        self.vocab_size = int(self.llm.n_vocab())
        self.n_batch = int(self.llm.n_batch)
        self._tokenizer = LlamaCppTokenizer(self.llm)
        self.eos_token_ids = end_of_generation_ids(llama_cpp, self._tokenizer.vocab)
        self._tokens: list[int] = []
        # snapshots of earlier prompts' caches (0 bytes: none kept)
        self.prompt_cache = PromptCache(prompt_cache_bytes) if prompt_cache_bytes else None
        self.extend_calls = 0
        # Llama() keeps its batch private (``_batch``): specdec owns one of its own, through
        # llama.cpp's public API, freed with this object
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        weakref.finalize(self, llama_cpp.llama_batch_free, self._batch)
        self._memory = llama_cpp.llama_get_memory(self.llm.ctx)
        self._seq_rm(0)
        if exact:
            from specdec.models.exact import NotExactError, self_check

            try:
                self_check(self, path.name)
            except NotExactError as e:
                verdict = getattr(self, "exact_kernels", None)
                if verdict is None or not verdict.cached or not verdict.key:
                    raise
                from specdec.llama_trust.exact_kernels import checks_dir

                stale = checks_dir() / f"{verdict.key}.json"
                raise NotExactError(  # a verdict cached by another build can be stale
                    f"{e}; the optional kernels kept came from a cached verdict ({stale}): "
                    "delete it to check this build again"
                ) from e

    @property
    def tokenizer(self) -> LlamaCppTokenizer:
        return self._tokenizer

    @property
    def n_cached(self) -> int:
        return len(self._tokens)

    @property
    def cached_tokens(self) -> list[int]:
        return list(self._tokens)

    def will_pad(self, n: int) -> bool:
        """Whether ``extend`` of n tokens (all rows wanted) runs padded to ``pad_to`` rows."""
        return (
            self.pad_to is not None
            and self.pad_min is not None
            and self.pad_min <= n < self.pad_to
            and len(self._tokens) + self.pad_to <= self.n_ctx
        )

    def cache_pos_max(self) -> int:
        """Largest position llama.cpp's memory holds for the sequence (-1 when empty): a
        direct check that nothing beyond the tracked tokens (pad rows, rejected drafts)
        stayed in the cache."""
        llama_cpp = _import_llama()
        return int(llama_cpp.llama_memory_seq_pos_max(self._memory, 0))

    def _seq_rm(self, start: int) -> bool:
        """Remove the sequence's cache cells at positions >= start (llama.cpp's public
        ``llama_memory_seq_rm``; specdec uses sequence 0 only)."""
        llama_cpp = _import_llama()
        return bool(llama_cpp.llama_memory_seq_rm(self._memory, 0, start, -1))

    def _decode(self, rows: Sequence[int], n_past: int, wanted: Sequence[bool]) -> None:
        """One ``llama_decode`` of ``rows`` at positions n_past.. (logits for wanted rows)."""
        llama_cpp = _import_llama()
        b = self._batch
        b.n_tokens = len(rows)
        for i, (tok, out) in enumerate(zip(rows, wanted, strict=True)):
            b.token[i] = tok
            b.pos[i] = n_past + i
            b.seq_id[i][0] = 0
            b.n_seq_id[i] = 1
            b.logits[i] = out
        code = int(llama_cpp.llama_decode(self.llm.ctx, b))
        if code != 0:
            self._seq_rm(n_past)  # drop what the failed decode left behind
            raise ModelLoadError(f"llama.cpp decode failed: llama_decode returned {code}")

    def _logits(self, n_out: int) -> np.ndarray:
        """A copy of the last decode's output rows [n_out, V]."""
        llama_cpp = _import_llama()
        ptr = llama_cpp.llama_get_logits(self.llm.ctx)
        buf = np.ctypeslib.as_array(ptr, shape=(n_out * self.vocab_size,))
        return buf.reshape(n_out, self.vocab_size).copy()

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        check_extend_args(self, tokens)
        toks = [int(t) for t in tokens]
        if not last_only and self.will_pad(len(toks)):
            out = self._extend_padded(toks, filler=toks[-1])
            self.extend_calls += 1
            self.padded_calls += 1
            return out
        rows: list[np.ndarray] = []
        for start in range(0, len(toks), self.n_batch):
            chunk = toks[start : start + self.n_batch]
            is_last_chunk = start + self.n_batch >= len(toks)
            want_all = not last_only
            # the last row is always an output row (llama.cpp's own batches do the same)
            wanted = [want_all or i == len(chunk) - 1 for i in range(len(chunk))]
            self._decode(chunk, len(self._tokens), wanted)
            self._tokens.extend(chunk)
            n_out = len(chunk) if want_all else 1
            if want_all or is_last_chunk:
                rows.append(self._logits(n_out))
        self.extend_calls += 1
        return torch.from_numpy(np.concatenate(rows, axis=0))  # [n or 1, V] float32

    def _extend_padded(self, toks: list[int], *, filler: int) -> torch.Tensor:
        """One pass over toks followed by pad_to - len(toks) non-output rows of ``filler`` at
        the next positions; the pad rows' cache cells are removed afterwards."""
        assert self.pad_to is not None and len(toks) < self.pad_to
        n_past, n = len(self._tokens), len(toks)
        padded = [*toks, *[filler] * (self.pad_to - n)]
        self._decode(padded, n_past, [i < n for i in range(self.pad_to)])
        rows = self._logits(n)
        removed = self._seq_rm(n_past + n)
        assert removed, "llama.cpp refused to remove the pad rows"
        self._tokens.extend(toks)
        return torch.from_numpy(rows)  # [n, V] float32

    def truncate(self, n_keep: int) -> None:
        check_truncate_args(self, n_keep)
        self._seq_rm(n_keep)
        del self._tokens[n_keep:]

    # -- earlier prompts' caches (models.prompt_cache) ------------------------------------
    def _state(self) -> bytes:
        """The sequence's cache (keys and values of the cached tokens), serialized."""
        llama_cpp = _import_llama()
        size = int(llama_cpp.llama_state_seq_get_size(self.llm.ctx, 0))
        buf = (ctypes.c_uint8 * size)()
        n = int(llama_cpp.llama_state_seq_get_data(self.llm.ctx, buf, size, 0))
        return bytes(memoryview(buf)[:n])

    def _restore(self, tokens: Sequence[int], state: bytes) -> bool:
        """Replace the cache by a snapshot of ``tokens``; False (the cache empty) where
        llama.cpp refuses it."""
        llama_cpp = _import_llama()
        self._seq_rm(0)
        self._tokens = []
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        read = int(llama_cpp.llama_state_seq_set_data(self.llm.ctx, buf, len(state), 0))
        if read == 0 or self.cache_pos_max() != len(tokens) - 1:
            self._seq_rm(0)
            return False
        self._tokens = [int(t) for t in tokens]
        return True

    def reuse_prefix(self, tokens: Sequence[int]) -> int:
        """Make the cache start with the longest prefix of ``tokens`` it or a snapshot of an
        earlier prompt holds (``models.prompt_cache``: content about to be lost is
        snapshotted first) and return that prefix's length; the caller truncates to it."""
        return reuse_prefix(self.prompt_cache, self._tokens, tokens, self._state, self._restore)
