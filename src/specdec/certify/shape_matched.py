"""A plain (non-speculative) sampler that feeds the target the same batch shapes as the
speculative path.

Why: a backend whose logits depend on the batch shape gives the speculative path rows
p_batched (K + 1 positions per pass) while plain decoding sees p_single (one position per
pass). Comparing the two mixes a decoder bug up with backend numerics. This baseline removes
the difference: each round it drafts K tokens with the same drafter, feeds the target
[last, x_1..x_K] in one pass exactly as the speculative loop does, and then samples plainly
from those rows: y_1 from row 0; if y_1 == x_1 the row-1 context is y's context too, so y_2 is
drawn from row 1; and so on until the first y_j != x_j (or after row K). Every token is an
ordinary sample from the target's row for its own context — no accept/reject walk is
involved — and the target is scored in the speculative path's shapes. With greedy sampling
it emits exactly what the speculative loop emits (acceptance = argmax match), bit for bit.

It is the decoding loop itself (``specdec.core.loop.generate_stream``) with the
``exact_match_verifier`` in place of the accept/reject walk: the K clamp, EOS and length cuts,
truncation and rollback are the same code.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from specdec.core.drafter import Drafter
from specdec.core.loop import generate_stream
from specdec.core.model import CausalLM
from specdec.core.sampling import SamplingConfig
from specdec.core.verifiers import exact_match_verifier
from specdec.errors import ConfigError

from .seeds import derive_seed


@dataclass
class ShapeRound:
    k: int  # drafts fed to the target with the last token (batch size k + 1)
    n_matched: int  # sampled tokens that equalled the drafts (rows used = n_matched + 1)
    tokens: list[int]  # tokens kept from this round


def shape_matched_stream(
    target: CausalLM,
    draft: CausalLM | Drafter,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    k: int,
    sampling: SamplingConfig,
    seed: int,
    stop_on_eos: bool = True,
) -> Iterator[ShapeRound]:
    """Yield one ``ShapeRound`` per target pass (see the module docstring).

    Randomness: target samples use ``make_generator(seed)``; drafts use an independent
    generator derived from the seed. Both caches are prefilled from scratch.
    """
    if k < 0:
        raise ConfigError(f"K must be >= 0, got {k}")
    run = generate_stream(
        target,
        draft,
        prompt_ids,
        max_new_tokens=max_new_tokens,
        k=k,
        sampling=sampling,
        seed=seed,
        stop_on_eos=stop_on_eos,
        reuse_prefix=False,
        verifier=exact_match_verifier,
        draft_seed=derive_seed(seed, "shape-matched-draft"),
    )
    return (ShapeRound(r.k, r.n_accepted, r.tokens) for r in run)


def shape_matched_generate(
    target: CausalLM,
    draft: CausalLM | Drafter,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    k: int,
    sampling: SamplingConfig,
    seed: int,
    stop_on_eos: bool = True,
) -> tuple[list[int], list[ShapeRound]]:
    """All tokens (and the rounds) of ``shape_matched_stream``."""
    rounds = list(
        shape_matched_stream(
            target,
            draft,
            prompt_ids,
            max_new_tokens=max_new_tokens,
            k=k,
            sampling=sampling,
            seed=seed,
            stop_on_eos=stop_on_eos,
        )
    )
    return [t for r in rounds for t in r.tokens], rounds
