"""A model's logit rows for a token sequence, computed in given pass shapes.

The certificate compares the rows a speculative run verified against with the rows plain
decoding samples from. Both are computed here from a ``CausalLM`` and plain arguments (the
prompt, the generated tokens, the shape of each round's target pass), so what the
certificate's levels do with the models is done in one place below them, and their
statistics run on the rows these functions return:

- ``replay_rows``: the rows in the speculative run's shapes (each round's pass over
  [last, K drafts], with the run's rollbacks);
- ``plain_rows``: one token per pass, as plain decoding computes them;
- ``draft_rows``: a draft model's rows in one pass (an order key for the per-token test);
- ``rows_both_ways``: one position's row both ways (a greedy divergence);
- ``probe_rows``: a prompt's greedy continuation scored n tokens in one pass and one token
  per pass, and rescored after a rollback (the batch-invariance probe).

Every function prefills from scratch (a prefix-reusing wrapper serves the prefix from memory).
The probe leaves the cache empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from specdec.errors import ConfigError

from .model import CausalLM, extend_last


class PassShape(Protocol):
    """The shape of one round's target pass (``core.result.Round`` is one)."""

    @property
    def k(self) -> int: ...  # drafts fed with the last token (the pass has k + 1 positions)

    @property
    def n_accepted(self) -> int: ...  # drafts kept

    @property
    def n_emitted(self) -> int: ...  # tokens the round appended (after the EOS / length cut)


def prefill(model: CausalLM, prompt: Sequence[int]) -> list[int]:
    """Cache = prompt[:-1] (from scratch); returns the prompt as ints."""
    ctx = [int(t) for t in prompt]
    if model.n_cached:
        model.truncate(0)
    if len(ctx) > 1:
        extend_last(model, ctx[:-1])
    return ctx


def replay_rows(
    target: CausalLM,
    prompt: Sequence[int],
    tokens: Sequence[int],
    rounds: Sequence[PassShape],
    upto: int | None = None,
) -> torch.Tensor:
    """The target's rows [n, V] for the generated positions 0..n-1 (n = len(tokens), or
    upto + 1) computed in the speculative run's shapes: prefill of prompt[:-1], then each
    round's pass over [last, K drafts] (accepted drafts are known; rejected ones are replaced
    by the emitted correction, which only later rows of that pass see), with the same
    rollbacks."""
    n = len(tokens) if upto is None else upto + 1
    ctx = prefill(target, prompt)
    pos = 0
    out: list[torch.Tensor] = []
    for r in rounds:
        if pos >= n:
            break
        accepted = [int(t) for t in tokens[pos : pos + r.n_accepted]]
        nxt = pos + r.n_accepted
        filler = int(tokens[nxt]) if nxt < len(tokens) else ctx[-1]  # rejected drafts unknown
        drafts = accepted + [filler] * (r.k - len(accepted))
        logits = target.extend([ctx[-1], *drafts])  # [K+1, V]
        out.append(logits[: r.n_emitted])
        if r.n_accepted < r.k:
            target.truncate(len(ctx) + r.n_accepted)
        ctx.extend(int(t) for t in tokens[pos : pos + r.n_emitted])
        pos += r.n_emitted
    if pos < n:
        raise ValueError(f"position {n - 1} is not covered by the {len(rounds)} rounds")
    return torch.cat(out)[:n]  # [n, V]


def plain_rows(
    target: CausalLM, prompt: Sequence[int], tokens: Sequence[int], upto: int | None = None
) -> torch.Tensor:
    """The target's rows [n, V] for positions 0..n-1 as plain decoding computes them:
    prefill of prompt[:-1], then one token per pass."""
    n = len(tokens) if upto is None else upto + 1
    ctx = prefill(target, prompt)
    feed = [ctx[-1], *(int(t) for t in tokens[: n - 1])]
    return torch.cat([target.extend([t]) for t in feed])  # [n, V]


def draft_rows(draft: CausalLM, prompt: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
    """The draft model's rows [n, V] for positions 0..n-1 in one pass (only an order key:
    any function of x_<t keeps the PIT exact, so batch numerics do not matter here)."""
    ctx = prefill(draft, prompt)
    return draft.extend([ctx[-1], *(int(t) for t in tokens[:-1])])  # [n, V]


def rows_both_ways(
    target: CausalLM,
    prompt: Sequence[int],
    tokens: Sequence[int],
    rounds: Sequence[PassShape],
    index: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's row [V] for generated position ``index`` in the speculative run's shapes
    (``replay_rows``) and as plain decoding computes it (``plain_rows``): (batched, single)."""
    batched = replay_rows(target, prompt, tokens, rounds, upto=index)[index]
    single = plain_rows(target, prompt, tokens, upto=index)[index]
    return batched, single


def probe_rows(
    model: CausalLM, prompt_ids: Sequence[int], ns: Sequence[int]
) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], float]:
    """Score one prompt's greedy continuation both ways (the batch-invariance probe's model
    work, ``certify.invariance``).

    Returns ({n: (batched [n, V], one-at-a-time [n, V], shifted [n, V])}, rollback diff).
    ``shifted`` is a second n-token pass one position later (after truncating back into the
    first pass's cache): its row i - 1 and the batched row i share context and pass size and
    differ only in the row's index within the pass.
    """
    n_max = max(ns)
    if len(prompt_ids) + n_max + 1 > model.n_ctx:
        raise ConfigError(
            f"prompt of {len(prompt_ids)} tokens + {n_max + 1} probe tokens exceeds n_ctx "
            f"{model.n_ctx}"
        )
    if model.n_cached:
        model.truncate(0)
    last = extend_last(model, list(prompt_ids))[-1]  # [V]
    base = model.n_cached
    cont: list[int] = []
    single: list[torch.Tensor] = []
    tok = int(torch.argmax(last))
    for _ in range(n_max + 1):
        cont.append(tok)
        row = model.extend([tok])[0]  # [V]
        single.append(row)
        tok = int(torch.argmax(row))
    model.truncate(base)
    rollback = float((model.extend([cont[0]])[0] - single[0]).abs().max())
    out: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for n in ns:
        model.truncate(base)
        batched = model.extend(cont[:n])  # [n, V]
        model.truncate(base + 1)
        shifted = model.extend(cont[1 : n + 1])  # [n, V]
        out[n] = (batched, torch.stack(single[:n]), shifted)
    model.truncate(0)
    return out, rollback
