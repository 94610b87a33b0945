"""Turn a model reference (store name, local path, or ``mock:...``) into a ``CausalLM``."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.core.model import CausalLM
from specdec.errors import ConfigError, ModelLoadError
from specdec.util.bounds import check_n_ctx, check_threads

BACKENDS = ("auto", "hf", "llamacpp", "mock")
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelConfig:
    """Where a model comes from and how to run it.

    model:    a store short name (``specdec models list``), a local GGUF file or transformers
              directory, or ``mock:<closeness>[:<vocab>]`` (closeness: target | identical |
              close | far) for the deterministic mock models.
    backend:  hf | llamacpp | mock | auto (mock for mock:, otherwise llamacpp for GGUF files
              and hf for directories).
    device / dtype: used by the transformers backend (auto picks cuda > mps > cpu; bf16 on
              CPUs that support it, fp16 on GPUs, fp32 otherwise).
    n_ctx:    context window to allocate (llama.cpp's logits buffer is n_ctx x vocab floats).
    n_threads: CPU threads (None: backend default).
    exact:    exact numerics: every logits row bit-identical whatever the number of tokens
              in its pass, so speculative output is plain decoding's token for token
              (``models.exact``; the llama.cpp backend's ``exact`` mode, checked at load; the
              mock models are exact by construction; transformers has no such mode).
    """

    model: str
    backend: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    n_ctx: int = 2048
    n_threads: int | None = None
    exact: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_n_ctx(self.n_ctx, "n_ctx")
        check_threads(self.n_threads, "n_threads")  # bench --config n_threads=0 included
        if self.exact and self.resolved_backend() == "hf":
            raise ConfigError(
                "exact numerics are a mode of the llama.cpp backend: transformers' CPU "
                "kernels give a token other logits inside a longer pass (docs/exact-numerics.md)"
            )

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        if self.model.startswith("mock:"):
            return "mock"
        if self.model.endswith(".gguf") or "/" not in self.model:
            return "llamacpp"  # GGUF files and store short names
        return "hf"  # model directories and hub ids

    def label(self) -> str:
        b = self.resolved_backend()
        extra = f"/{self.dtype}" if b == "hf" else ""
        return f"{self.model}@{b}{extra}{'/exact' if self.exact else ''}"


def load_mock(ref: str, n_ctx: int) -> CausalLM:
    from specdec.models.mock import MockLM, MockSpec, mock_pair

    parts = ref.split(":")
    role = parts[1] if len(parts) > 1 else "target"
    try:
        vocab = int(parts[2]) if len(parts) > 2 else 16
    except ValueError as e:
        raise ModelLoadError(f"bad mock model reference {ref!r}: vocab must be an int") from e
    if role == "target":
        spec = mock_pair("identical", vocab_size=vocab)[1].spec
    elif role in ("identical", "close", "far"):
        spec = mock_pair(role, vocab_size=vocab)[0].spec
    else:
        raise ModelLoadError(
            f"unknown mock model {ref!r}: use mock:target|identical|close|far[:VOCAB]"
        )
    return MockLM(MockSpec(**{**spec.__dict__, "n_ctx": n_ctx}))


def load_model(cfg: ModelConfig) -> CausalLM:
    """Load (fetching and verifying store models first when needed)."""
    backend = cfg.resolved_backend()
    if backend == "mock":
        mock = load_mock(cfg.model, cfg.n_ctx)
        if cfg.exact:  # exact by construction; checked like any model that claims it
            from specdec.models.exact import self_check

            self_check(mock, cfg.model)
        return mock
    from specdec.hub import resolve

    try:
        path = resolve(cfg.model)
    except ModelLoadError:
        if backend == "hf" and _looks_like_hub_id(cfg.model):
            from specdec.models.hf import load_hf

            return load_hf(
                cfg.model,
                device=cfg.device,
                dtype=cfg.dtype,
                n_ctx=cfg.n_ctx,
                n_threads=cfg.n_threads,
            )
        raise
    if backend == "llamacpp":
        if not path.is_file():
            raise ModelLoadError(f"the llama.cpp backend needs a GGUF file, got {path}")
        from specdec.models.llamacpp import LlamaCppLM

        return LlamaCppLM(
            path, n_ctx=cfg.n_ctx, n_threads=cfg.n_threads, device=cfg.device, exact=cfg.exact
        )
    from specdec.models.hf import load_hf

    return load_hf(
        path, device=cfg.device, dtype=cfg.dtype, n_ctx=cfg.n_ctx, n_threads=cfg.n_threads
    )


def _looks_like_hub_id(ref: str) -> bool:
    return ref.count("/") == 1 and not ref.startswith((".", "/", "~"))
