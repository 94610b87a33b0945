"""Options shared by the subcommands that load a draft/target pair."""

from __future__ import annotations

import argparse
import os

from specdec.models.loader import BACKENDS, DEVICES, DTYPES, ModelConfig
from specdec.pairs import (
    DEFAULT_DRAFT,
    DEFAULT_DRAFT_BACKEND,
    DEFAULT_TARGET,
    DEFAULT_TARGET_BACKEND,
    HYBRID_PREFIX,
    DraftRef,
    HybridRef,
    is_model_free,
)
from specdec.sampling import SamplingConfig


def add_model_args(p: argparse.ArgumentParser, *, n_ctx: int = 4096) -> None:
    g = p.add_argument_group("models")
    g.add_argument(
        "--draft",
        default=DEFAULT_DRAFT,
        help="draft: store name, GGUF file, model directory, 'ngram' (prompt lookup), "
        "'suffix[:OPTS]' (suffix matching, drafts sized by the match), 'hybrid:MODEL' "
        f"(suffix where it matches, the model elsewhere) or 'none' (default: {DEFAULT_DRAFT})",
    )
    g.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"target: store name, GGUF file or model directory (default: {DEFAULT_TARGET})",
    )
    g.add_argument("--draft-backend", default=DEFAULT_DRAFT_BACKEND, choices=BACKENDS)
    g.add_argument("--target-backend", default=DEFAULT_TARGET_BACKEND, choices=BACKENDS)
    g.add_argument(
        "--device",
        default="auto",
        choices=DEVICES,
        help="device for both models (transformers: auto = cuda > mps > cpu)",
    )
    g.add_argument("--draft-device", default=None, choices=DEVICES)
    g.add_argument("--target-device", default=None, choices=DEVICES)
    g.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="transformers dtype (auto: bf16 on CPUs with bf16, fp16 on GPUs)",
    )
    g.add_argument("--draft-dtype", default=None, choices=DTYPES)
    g.add_argument("--target-dtype", default=None, choices=DTYPES)
    g.add_argument(
        "--threads", type=int, default=None, help=f"CPU threads (default: all, {os.cpu_count()})"
    )
    g.add_argument("--n-ctx", type=int, default=n_ctx, help="context window to allocate")


def model_configs(args: argparse.Namespace) -> tuple[DraftRef, ModelConfig]:
    target = ModelConfig(
        model=args.target,
        backend=args.target_backend,
        device=args.target_device or args.device,
        dtype=args.target_dtype or args.dtype,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
    )
    draft: DraftRef
    if is_model_free(args.draft):
        return args.draft or "none", target
    model = args.draft.removeprefix(HYBRID_PREFIX)
    draft = ModelConfig(
        model=model,
        backend=args.draft_backend,
        device=args.draft_device or args.device,
        dtype=args.draft_dtype or args.dtype,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
    )
    if args.draft.startswith(HYBRID_PREFIX):
        draft = HybridRef(draft)
    return draft, target


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="0 disables")
    g.add_argument("--top-p", type=float, default=1.0, help="in (0, 1]; 1 disables")
    g.add_argument("--seed", type=int, default=0)


def sampling_config(args: argparse.Namespace) -> SamplingConfig:
    return SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)


def quiet_libraries() -> None:
    """Silence progress bars and info logs of transformers and friends (CLI only)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
