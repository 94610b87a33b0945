"""Level 3's per-token test on a real (or mock) model pair.

For each of several independently seeded speculative sequences x_1..x_n (``generate``), the
target's next-token row for every emitted position is obtained two ways:

(a) shape-matched: the rows of the run's own verify passes (recorded as the target returned
    them; ``recorded_rows`` checks that each pass is exactly the one the output implies —
    cache length, [last, accepted drafts], K + 1 positions — so these are the rows of the
    shape-matched replay without a second pass). On the sequences also scored against plain
    decoding the full replay (``core.rows.replay_rows``: prefill, then each round's pass
    over [last, accepted drafts, filler] with the run's rollbacks) is computed too and must
    reproduce the recorded rows bit for bit. Under a correct walk x_t is distributed as its
    row given everything before it (module ``stats.pit``), so the PIT values must be uniform
    whatever the backend's batch-shape numerics.
(b) plain one-token-per-pass scoring (``core.rows.plain_rows``): the rows plain decoding
    samples from. The PIT test against them shows whether the user sees plain decoding's
    distribution; the EFFECT of the difference is measured directly as the per-token TV
    between the (a) and (b) rows (mean over positions of a sequence; the sequences are the
    independent units).

Both use the same auxiliary uniforms V_t (a generator seeded for this purpose only) and the
same token order (draft row / reference row, from one pass of the draft model over the
sequence; -reference row without a draft model). Everything a sequence contributes is a
plain dict (``SequenceScore``) so that the progress log can store and resume it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from specdec.core.drafter import Drafter
from specdec.core.loop import generate
from specdec.core.model import CausalLM
from specdec.core.result import Round
from specdec.core.rows import draft_rows, plain_rows, replay_rows
from specdec.core.sampling import SamplingConfig, logits_to_probs
from specdec.models.wrapped import WrappedLM
from specdec.stats.pit import draw_v, pit_in_chunks


class RecordingLM(WrappedLM):
    """A CausalLM that passes every call through and keeps (cache length before, tokens,
    returned logits) of each extend: the rows the decoder actually verified against."""

    def __init__(self, model: CausalLM) -> None:
        super().__init__(model)
        self.passes: list[tuple[int, list[int], torch.Tensor]] = []

    def extend(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        start = self.model.n_cached
        out = super().extend(tokens, last_only=last_only)
        self.passes.append((start, [int(t) for t in tokens], out))
        return out


def recorded_rows(
    passes: Sequence[tuple[int, list[int], torch.Tensor]],
    prompt: Sequence[int],
    tokens: Sequence[int],
    rounds: Sequence[Round],
) -> tuple[torch.Tensor, bool]:
    """The rows [n, V] the run verified against for the generated positions 0..n-1, taken
    from the recorded passes (one per round, the last len(rounds) ones), and whether every
    such pass is the one the output implies: it starts at cache length len(context) - 1, is
    [context[-1], the accepted drafts, ...] and has K + 1 positions. When it is, these rows
    equal ``replay_rows`` on a deterministic backend without a second pass."""
    ctx = [int(t) for t in prompt]
    run = passes[len(passes) - len(rounds) :]
    consistent = len(run) == len(rounds)
    out: list[torch.Tensor] = []
    pos = 0
    for (start, fed, logits), r in zip(run, rounds, strict=False):
        # accepted drafts that were emitted (an EOS among them cuts the output short)
        accepted = [int(t) for t in tokens[pos : pos + min(r.n_accepted, r.n_emitted)]]
        consistent &= (
            start == len(ctx) - 1
            and len(fed) == r.k + 1
            and fed[: 1 + len(accepted)] == [ctx[-1], *accepted]
            and logits.shape[0] == len(fed)
        )
        out.append(logits[: r.n_emitted])
        ctx.extend(int(t) for t in tokens[pos : pos + r.n_emitted])
        pos += r.n_emitted
    rows = torch.cat(out) if out else torch.zeros(0, 0)
    return rows[: len(tokens)], consistent and rows.shape[0] == len(tokens)


@dataclass
class SequenceScore:
    """What one speculative sequence contributes (JSON-friendly)."""

    n_tokens: int
    n_rounds: int
    u_shape_matched: list[float]  # PIT vs the rows of the run's own passes, nan = impossible
    u_plain: list[float] | None  # PIT vs plain rows (None: not scored against plain)
    tv_plain: float | None  # mean over positions of TV(run row, plain row)
    seconds: float
    consistent: bool = True  # every pass was the one the output implies
    replay_max_abs: float | None = None  # max |replayed - recorded| logit (0 when replayed)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def score_sequence(
    target: CausalLM,
    draft: CausalLM | Drafter,
    order_model: CausalLM | None,
    prompt: Sequence[int],
    *,
    k: int,
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int,
    pit_generator: torch.Generator,
    with_plain: bool,
) -> SequenceScore:
    """Generate one speculative sequence and score it against (a) the rows of its own passes
    (recorded; checked against the output and, with ``with_plain``, against a full
    shape-matched replay) and, with ``with_plain``, (b) one-token-per-pass rows. The PIT's
    auxiliary uniforms come from ``pit_generator`` (used for nothing else)."""
    t0 = time.perf_counter()
    rec = RecordingLM(target)
    res = generate(
        rec, draft, prompt, max_new_tokens=max_new_tokens, k=k, sampling=sampling, seed=seed
    )
    n = len(res.tokens)
    if n == 0:
        return SequenceScore(0, len(res.rounds), [], [] if with_plain else None, None, 0.0)
    # the rows first (the run's own passes, the order key's, and with ``with_plain`` the full
    # replay and plain decoding's), then what the test makes of them
    rows_run, consistent = recorded_rows(rec.passes, prompt, res.tokens, res.rounds)  # [n, V]
    rec.passes.clear()
    order_rows = None if order_model is None else draft_rows(order_model, prompt, res.tokens)
    replayed = replay_rows(target, prompt, res.tokens, res.rounds) if with_plain else None
    plain = plain_rows(target, prompt, res.tokens) if with_plain else None  # [n, V]
    tok = torch.tensor(res.tokens, dtype=torch.long)  # [n]
    p_a = logits_to_probs(rows_run, sampling)  # [n, V]
    q = None if order_rows is None else logits_to_probs(order_rows, sampling)  # [n, V]
    v = draw_v(n, pit_generator)  # [n]
    u_a = pit_in_chunks(p_a, tok, v, q)
    u_b: list[float] | None = None
    tv: float | None = None
    replay_diff: float | None = None
    if replayed is not None and plain is not None:
        replay_diff = float((replayed - rows_run).abs().max())
        p_b = logits_to_probs(plain, sampling)  # [n, V]
        u_b = pit_in_chunks(p_b, tok, v, q)
        tv = float((0.5 * (p_a.double() - p_b.double()).abs().sum(-1)).mean())
    return SequenceScore(
        n, len(res.rounds), u_a, u_b, tv, time.perf_counter() - t0, consistent, replay_diff
    )
