from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.core.sampling import (
    SamplingConfig,
    logits_to_probs,
    make_generator,
    sample,
    sample_from_probs,
)
from specdec.errors import ConfigError


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -2},
        {"temperature": float("nan")},
    ],
)
def test_invalid_config_is_a_user_error(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        SamplingConfig(**kwargs)


def test_greedy_is_one_hot_with_first_index_tie_break() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, -1.0], [5.0, 1.0, 5.0, 5.0]])
    p = logits_to_probs(logits, SamplingConfig(temperature=0.0))
    assert p.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]
    assert p.dtype == torch.float32


def test_temperature_top_k_top_p_by_hand() -> None:
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    p = logits_to_probs(logits, SamplingConfig(temperature=1.0))
    assert torch.allclose(p, torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]), atol=1e-6)
    p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([5 / 7, 2 / 7, 0, 0, 0]), atol=1e-6)
    # top_p = 0.8: 0.5 + 0.2 = 0.7 < 0.8, so 0.15 is needed too; 0.1 is not
    p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    assert torch.allclose(p, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85, atol=1e-6)
    # top_p tiny keeps exactly the most likely token
    p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=1e-6))
    assert p.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    # temperature 2 flattens: p ~ sqrt(p0)
    p = logits_to_probs(logits, SamplingConfig(temperature=2.0))
    ref = torch.sqrt(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    assert torch.allclose(p, ref / ref.sum(), atol=1e-6)
    # top-k then top-p, in that order: after top-k the rows are 0.588, 0.235, 0.176; the mass
    # before the third token is 0.823 >= 0.75, so only the first two survive
    p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=3, top_p=0.75))
    assert torch.allclose(p, torch.tensor([5 / 7, 2 / 7, 0, 0, 0]), atol=1e-6)


def test_inverse_cdf_never_returns_zero_mass_tokens() -> None:
    probs = torch.tensor([0.0, 0.3, 0.0, 0.7, 0.0])
    for u in [0.0, 1e-12, 0.29999, 0.3, 0.5, 0.999999999, 1.0 - 1e-16]:
        assert sample_from_probs(probs, u) in (1, 3)
    assert sample_from_probs(probs, 0.0) == 1
    assert sample_from_probs(probs, 0.31) == 3


def test_sample_matches_probabilities() -> None:
    # threshold fixed before running: chi-square p-value must exceed 1e-3 (seeded, deterministic)
    probs = torch.tensor([0.05, 0.25, 0.0, 0.4, 0.3])
    g = make_generator(123)
    n = 20_000
    counts = np.bincount([sample(probs, g) for _ in range(n)], minlength=5)
    assert counts[2] == 0
    nz = probs.numpy() > 0
    res = stats.chisquare(counts[nz], n * probs.numpy()[nz] / probs.numpy()[nz].sum())
    assert res.pvalue > 1e-3


def test_same_seed_same_draws() -> None:
    probs = torch.softmax(torch.randn(50, generator=make_generator(1)), 0)
    a = [sample(probs, make_generator(7)) for _ in range(3)]
    g1, g2 = make_generator(7), make_generator(7)
    assert [sample(probs, g1) for _ in range(20)] == [sample(probs, g2) for _ in range(20)]
    assert len(set(a)) == 1
