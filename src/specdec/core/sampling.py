"""Logits -> probability rows, and sampling from them.

All arithmetic is CPU float32 (float64 for cumulative sums), with an explicit
``torch.Generator`` for every random draw, so a seed reproduces a run bit for bit whatever the
backend. The same function is applied to draft and target logits, which is what keeps
speculative decoding exact under temperature / top-k / top-p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from specdec.errors import ConfigError


@dataclass(frozen=True)
class SamplingConfig:
    """How a probability row is made from logits.

    temperature: 0 means greedy (exact argmax, lowest index wins ties); > 0 divides logits.
    top_k: keep the k most likely tokens; 0 disables.
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p; 1 disables.
    Order of application: temperature, then top-k, then top-p (as transformers does).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingConfig()


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Turn logits [..., V] into probability rows [..., V] (CPU float32, rows sum to 1).

    Greedy gives one-hot rows at the argmax (first index among ties). Tokens removed by
    top-k / top-p get probability exactly 0.
    """
    x = logits.detach().to(device="cpu", dtype=torch.float32)
    if x.ndim == 0:
        raise ValueError("logits must have at least one dimension")
    if cfg.greedy:
        # torch.argmax returns the first maximal index: a deterministic tie-break.
        idx = torch.argmax(x, dim=-1, keepdim=True)  # [..., 1]
        return torch.zeros_like(x).scatter_(-1, idx, 1.0)
    scaled = x / cfg.temperature
    if torch.isposinf(scaled).any() or torch.isnan(scaled).any():
        # a temperature so small (below ~1e-38; float32 holds no smaller) that logits / T
        # overflow: the row is then its limit T -> 0, all mass on the maximal logits (every
        # other one is more than 1e30 below them after scaling), instead of NaN
        top = x == x.amax(dim=-1, keepdim=True)
        scaled = torch.where(top, 0.0, float("-inf"))
    x = scaled
    vocab = x.shape[-1]
    if 0 < cfg.top_k < vocab:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]  # [..., 1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)  # [..., V]
    if cfg.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        cum = torch.cumsum(sorted_p.double(), dim=-1)  # [..., V] float64
        # keep a token if the mass strictly before it is < top_p (so the first always stays)
        keep_sorted = (cum - sorted_p.double()) < cfg.top_p
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_from_cdf(cdf: np.ndarray, weights: np.ndarray, u: float) -> int:
    """Inverse-CDF draw: the first index whose cumulative weight exceeds u * total.

    cdf = cumsum(weights) [V] (float64), u in [0, 1). Zero-weight entries are never returned,
    even at rounding edges.
    """
    total = float(cdf[-1])
    assert total > 0.0, "probability row has no mass"
    idx = int(np.searchsorted(cdf, u * total, side="right"))
    if idx >= weights.shape[0] or weights[idx] <= 0.0:
        # u * total landed on the upper rounding edge: take the last token with mass
        idx = int(np.flatnonzero(weights > 0)[-1])
    return idx


def sample_from_probs(probs: torch.Tensor, u: float) -> int:
    """Inverse-CDF sample of one index from a probability row [V], driven by u in [0, 1)."""
    assert probs.ndim == 1, "one probability row expected"
    w = probs.detach().cpu().numpy().astype(np.float64)  # [V]
    return sample_from_cdf(np.cumsum(w), w, u)


def draw_uniform(generator: torch.Generator) -> float:
    """One uniform draw in [0, 1) from an explicit generator."""
    return float(torch.rand((), generator=generator, dtype=torch.float64))


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Sample one token id from a probability row [V]."""
    return sample_from_probs(probs, draw_uniform(generator))


def make_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded explicitly."""
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    return g
