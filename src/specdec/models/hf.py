"""transformers backend: a local model directory, a hub id (when a hub is reachable), or a
GGUF file dequantized by transformers (converted once, then cached as safetensors)."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from specdec.core.model import check_extend_args, check_truncate_args
from specdec.errors import ConfigError, ModelLoadError
from specdec.hub.paths import default_cache_dir
from specdec.hub.safe_paths import fresh_dir, real_dir, refuse_link, remove_tree


def pick_device(device: str) -> torch.device:
    """auto: cuda, then mps, then cpu."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for but CUDA is not available")
    if device == "mps" and not (
        getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
    ):
        raise ConfigError("--device mps was asked for but MPS is not available")
    return torch.device(device)


def cpu_has_bf16() -> bool:
    """True when the CPU has native bf16 matrix instructions (AVX512_BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on CPUs that support it, fp16 on GPUs, fp32 otherwise."""
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype != "auto":
        return table[dtype]
    if device.type in ("cuda", "mps"):
        return torch.float16
    return torch.bfloat16 if cpu_has_bf16() else torch.float32


class HFTokenizer:
    """The ``Tokenizer`` protocol over a transformers tokenizer."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.tok(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=False))

    def stream_decoder(self) -> Callable[[int], str | None] | None:
        """An incremental decoder over the fast tokenizer (the ``tokenizers`` library's
        ``DecodeStream``: each id's new text, None while a character is incomplete), or None
        for a tokenizer without a ``tokenizers`` backend."""
        backend = getattr(self.tok, "backend_tokenizer", None)
        if backend is None:
            return None
        try:
            from tokenizers.decoders import DecodeStream
        except ImportError:  # pragma: no cover - tokenizers >= 0.22 has it
            return None
        stream = DecodeStream(skip_special_tokens=False)

        def step(token: int) -> str | None:
            out: str | None = stream.step(backend, token)
            return out

        return step

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template (None when it has none)."""
        return getattr(self.tok, "chat_template", None) or None

    def token_texts(self, n: int) -> list[str | None]:
        """The vocabulary strings of ids 0..n-1 (None past the tokenizer's own tokens)."""
        return list(self.tok.convert_ids_to_tokens(list(range(n))))

    def token_pieces(self, n: int) -> tuple[list[bytes], frozenset[int]]:
        """The bytes each id 0..n-1 adds to the text (b"" past the tokenizer's own tokens) and
        the special tokens, which add no text (``specdec.constraints``: a grammar's mask).
        Byte-level vocabularies (GPT-2's byte-to-character map) and SentencePiece-style ones
        (``▁`` for a space, ``<0xNN>`` byte tokens) are read; others as their token text."""
        specials = {int(i) for i in self.tok.all_special_ids}
        decoder = getattr(self.tok, "added_tokens_decoder", {}) or {}
        specials |= {int(i) for i, t in decoder.items() if getattr(t, "special", False)}
        texts = self.token_texts(n)
        byte_level = _byte_level(texts)
        pieces: list[bytes] = []
        for i, text in enumerate(texts):
            if text is None or i in specials:
                pieces.append(b"")
            elif byte_level is not None and i not in decoder:
                pieces.append(bytes(byte_level[ch] for ch in text))
            elif len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                pieces.append(bytes([int(text[3:5], 16)]))
            else:
                pieces.append(text.replace("\u2581", " ").encode("utf-8"))
        return pieces, frozenset(i for i in specials if i < n)

    def encode_piece(self, text: str, *, special: bool) -> list[int]:
        """Ids of ``text`` without BOS; special-token text parsed only when ``special``."""
        if not text:
            return []
        out = self.tok(text, add_special_tokens=False, split_special_tokens=not special)
        return list(out["input_ids"])

    def special_texts(self) -> frozenset[str]:
        """The texts of the tokenizer's special tokens (added tokens marked special)."""
        decoder = getattr(self.tok, "added_tokens_decoder", {}) or {}
        added = {str(t) for t in decoder.values() if getattr(t, "special", False)}
        return frozenset(added | {str(t) for t in self.tok.all_special_tokens})

    def chat_variables(self) -> dict[str, Any]:
        specials = {k: v for k, v in self.tok.special_tokens_map.items() if isinstance(v, str)}
        return {**specials, "add_generation_prompt": True}

    def apply_chat(
        self, messages: list[dict[str, str]], *, parse_special: bool = False
    ) -> list[int]:
        """The tokenizer's chat template over ``messages``; message text is text unless
        ``parse_special`` (specdec.templates)."""
        if not getattr(self.tok, "chat_template", None):
            raise ModelLoadError("this model's tokenizer has no chat template; drop --chat")
        from specdec.templates import encode_chat

        return encode_chat(self, messages, parse_special=parse_special)


def _byte_level(texts: Sequence[str | None]) -> dict[str, int] | None:
    """GPT-2's character-to-byte map when every token text is written in it (a byte-level
    BPE vocabulary), else None."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            chars[chr(256 + extra)] = b
            extra += 1
    if any(t and any(ch not in chars for ch in t) for t in texts[:2000]):
        return None
    return chars


def _gguf_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def converted_dir_for(gguf: Path) -> Path:
    return default_cache_dir() / "hf-converted" / f"{gguf.stem}-{_gguf_key(gguf)}"


def _load_from_gguf(gguf: Path, torch_dtype: torch.dtype) -> tuple[Any, Any]:
    """Dequantize a GGUF through transformers once; later loads read the cached copy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.hub.gguf import check_gguf_header

    check_gguf_header(gguf)
    cached = converted_dir_for(gguf)
    real_dir(cached.parent.parent, cached.parent.name)  # hf-converted: never a planted link
    refuse_link(cached)
    if (cached / "specdec-converted.json").exists():
        return _load_dir(cached, torch_dtype)
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            dtype=torch.float32,
            trust_remote_code=False,
            **gguf_dequantize_kwargs(),
        )
        tok = AutoTokenizer.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, trust_remote_code=False
        )
    except Exception as e:  # transformers raises many types for unsupported / bad files
        raise ModelLoadError(f"transformers could not load GGUF {gguf}: {e}") from e
    check_dense(model, gguf)
    # fp32 keeps the dequantized weights exact; other dtypes are cast at load time
    tmp = fresh_dir(cached.with_name(cached.name + ".partial"))  # a planted link is not followed
    model.hf_quantizer = None
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    # the copy holds dense weights: drop the GGUF quantization entry so reloads read it as such
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    (tmp / "specdec-converted.json").write_text(json.dumps({"source": str(gguf)}))
    remove_tree(cached)
    os.replace(tmp, cached)
    return model.to(torch_dtype), tok


def gguf_dequantize_kwargs() -> dict[str, Any]:
    """from_pretrained options that make transformers unpack every GGUF weight into a dense
    tensor. Newer transformers keep the weights in their GGUF blocks (``GgufLinear`` modules
    with matmul kernels) whenever the ``kernels`` package is installed; specdec needs dense
    weights (it saves them as safetensors and runs them in any dtype), so it asks for
    ``GgufConfig(dequantize=True)`` where that option exists. Older versions always unpack."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    if "dequantize" not in inspect.signature(GgufConfig).parameters:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def check_dense(model: Any, gguf: Path) -> None:
    """Raise ModelLoadError if transformers kept any GGUF weight packed (the ``kernels`` case
    of a transformers version whose packed path cannot be turned off)."""
    packed = sorted(
        name for name, module in model.named_modules() if type(module).__name__.startswith("Gguf")
    )
    if packed:
        raise ModelLoadError(
            f"transformers kept the weights of {gguf.name} packed in GGUF blocks "
            f"({packed[0]}: {len(packed)} modules), which specdec cannot convert: uninstall "
            "the `kernels` package, or use --target-backend llamacpp for this file"
        )


def cache_keyword(model: Any) -> str:
    """The name under which the installed transformers' forward takes the KV cache:
    ``cache`` in newer 5.x versions, ``past_key_values`` before. (An unknown keyword is
    swallowed by the model's ``**kwargs``, so guessing wrong would silently run every pass
    without the cache.)"""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - forward always has a signature
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _load_dir(path: Path | str, torch_dtype: torch.dtype, **kw: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # never run a model directory's own Python (and never ask on stdin whether to)
    kw = {**kw, "trust_remote_code": False}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, **kw)
        tok = AutoTokenizer.from_pretrained(str(path), **kw)
    except Exception as e:
        raise ModelLoadError(f"transformers could not load {path}: {e}") from e
    return model, tok


class HFCausalLM:
    """``CausalLM`` over a transformers model with a DynamicCache (rollback = crop)."""

    def __init__(self, model: Any, tokenizer: Any, device: torch.device, n_ctx: int) -> None:
        self.model = model.to(device).eval()
        self.device = device
        self.dtype = next(self.model.parameters()).dtype
        self._tokenizer = HFTokenizer(tokenizer)
        cfg = self.model.config
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        max_pos = int(getattr(cfg, "max_position_embeddings", n_ctx) or n_ctx)
        self.n_ctx = min(n_ctx, max_pos)
        self.eos_token_ids = frozenset(_eos_ids(self.model, tokenizer))
        self._cache: Any = None
        self._cache_kw = cache_keyword(self.model)
        self._tokens: list[int] = []
        self.extend_calls = 0

    @property
    def tokenizer(self) -> HFTokenizer:
        return self._tokenizer

    @property
    def n_cached(self) -> int:
        return len(self._tokens)

    @property
    def cached_tokens(self) -> list[int]:
        return list(self._tokens)

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        from transformers import DynamicCache

        check_extend_args(self, tokens)
        if self._cache is None:
            self._cache = DynamicCache(config=self.model.config)
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)  # [1, n]
        n0 = len(self._tokens)
        pos = torch.arange(n0, n0 + len(tokens), device=self.device)  # [n]
        out = self.model(
            input_ids=ids,
            use_cache=True,
            position_ids=pos.unsqueeze(0),
            cache_position=pos,
            logits_to_keep=1 if last_only else 0,
            **{self._cache_kw: self._cache},
        )
        self._tokens.extend(int(t) for t in tokens)
        self.extend_calls += 1
        held = self._cache.get_seq_length()
        assert held == len(self._tokens), (
            f"the KV cache holds {held} positions after extend, the model {len(self._tokens)} "
            f"tokens: this transformers version did not take the cache as {self._cache_kw}="
        )
        return out.logits[0].to(device="cpu", dtype=torch.float32)  # [n or 1, V]

    def truncate(self, n_keep: int) -> None:
        check_truncate_args(self, n_keep)
        n = len(self._tokens)
        if n_keep == n:
            return
        if n_keep == 0:
            self._cache = None
        else:
            self._cache.crop(n_keep - n)  # a negative count removes that many
            assert self._cache.get_seq_length() == n_keep, "crop left the wrong cache length"
        del self._tokens[n_keep:]


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, list | tuple):
            ids.update(int(x) for x in e)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def load_hf(
    ref: str | Path,
    *,
    device: str = "auto",
    dtype: str = "auto",
    n_ctx: int = 2048,
    n_threads: int | None = None,
) -> HFCausalLM:
    """Load a transformers model from a GGUF file, a local directory or a hub id."""
    if n_threads:
        torch.set_num_threads(n_threads)
    dev = pick_device(device)
    tdtype = pick_dtype(dtype, dev)
    path = Path(ref)
    if path.is_file():
        model, tok = _load_from_gguf(path, tdtype)
    elif path.is_dir():
        model, tok = _load_dir(path, tdtype)
    else:
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        model, tok = _load_dir(str(ref), tdtype, local_files_only=offline)
    return HFCausalLM(model, tok, dev, n_ctx)
