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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from specdec.decoding import validate_request
from specdec.drafters.base import Drafter
from specdec.drafters.model import ModelDrafter
from specdec.errors import ConfigError
from specdec.models.base import CausalLM
from specdec.sampling import SamplingConfig, logits_to_probs, make_generator, sample
from specdec.timing import Stopwatch

from .seeds import derive_seed


@dataclass
class ShapeRound:
    k: int  # drafts fed to the target with the last token (batch size k + 1)
    n_matched: int  # sampled tokens that equalled the drafts (rows used = n_matched + 1)
    tokens: list[int]  # tokens kept from this round


def as_drafter(draft: CausalLM | Drafter) -> Drafter:
    """A Drafter as is; a CausalLM wrapped in a ModelDrafter (as ``generate`` does)."""
    if isinstance(draft, CausalLM):
        return ModelDrafter(draft)
    return draft


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
    generator derived from the seed. K is clamped per round exactly as ``generate`` clamps it.
    """
    if k < 0:
        raise ConfigError(f"K must be >= 0, got {k}")
    if draft is target:
        raise ConfigError("draft and target must be separate model instances (own caches)")
    drafter = as_drafter(draft)
    n_ctx = target.n_ctx
    if isinstance(drafter, ModelDrafter):
        n_ctx = min(n_ctx, drafter.model.n_ctx)
    validate_request(prompt_ids, max_new_tokens, n_ctx)
    g_target = make_generator(seed)
    g_draft = make_generator(derive_seed(seed, "shape-matched-draft"))
    sw = Stopwatch()
    ctx = [int(t) for t in prompt_ids]
    n_out = 0
    if target.n_cached:
        target.truncate(0)
    if len(ctx) > 1:
        target.extend(ctx[:-1], last_only=True)
    drafter.reset()
    drafter.prefill(ctx[:-1])
    while n_out < max_new_tokens and len(ctx) < n_ctx:
        remaining = max_new_tokens - n_out
        k_r = max(0, min(k, remaining - 1, n_ctx - len(ctx) - 1))
        drafts = drafter.propose(ctx, k_r, sampling, g_draft, sw).tokens if k_r else []
        k_r = len(drafts)
        probs = logits_to_probs(target.extend([ctx[-1], *drafts]), sampling)  # [K+1, V]
        emitted: list[int] = []
        for j in range(k_r + 1):
            y = sample(probs[j], g_target)
            emitted.append(y)
            if j == k_r or y != drafts[j]:
                break
        n_matched = len(emitted) - 1
        if n_matched < k_r:
            target.truncate(len(ctx) + n_matched)
        eos = False
        if stop_on_eos:
            for j, t in enumerate(emitted):
                if t in target.eos_token_ids:
                    emitted, eos = emitted[: j + 1], True
                    break
        emitted = emitted[:remaining]
        ctx.extend(emitted)
        n_out += len(emitted)
        if n_matched < k_r:
            drafter.rollback(ctx)
        yield ShapeRound(k_r, n_matched, emitted)
        if eos:
            break


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
