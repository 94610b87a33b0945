"""Part 1 of ``certify --endpoint``: each prompt's greedy output on both sides, and at a
divergence whether it is a near-tie (both log-probability gaps within ``tie_gap`` nats, in
rows each side reported, or fetched by a follow-up request) or a difference."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specdec.certify.common import first_difference
from specdec.endpoint.client import Reply


@dataclass(frozen=True)
class GreedyCase:
    prompt: str
    status: str  # "identical" | "near-tie" | "differs"
    on_text: str
    off_text: str
    char_index: int | None = None
    context: str | None = None  # the common text just before the divergence
    on_next: str | None = None
    off_next: str | None = None
    token_index: int | None = None
    on_tokens: tuple[str, ...] | None = None  # a window around the divergence
    off_tokens: tuple[str, ...] | None = None
    gap_on: float | None = None  # nats, in the spec-on side's row
    gap_off: float | None = None
    reason: str = ""
    # where a gap came from: "reported" (the row the side returned with its output), or
    # "follow-up" (a second request for that position's row: the side returned none there)
    gap_on_source: str | None = None
    gap_off_source: str | None = None


def _gap(row: Mapping[str, float] | None, mine: str, other: str) -> float | None:
    """``row[mine] - row[other]`` (signed), None when the row lacks either token."""
    if row is None or mine not in row or other not in row:
        return None
    return float(row[mine] - row[other])


def _not_greedy(row: Mapping[str, float], mine: str) -> float | None:
    """How many nats the row's best token scores above ``mine``, the token the side chose at
    temperature 0 (None when ``mine`` is the best or ties it). Positive means the side did not
    pick its own argmax: not a near-tie, whatever the other side's gap."""
    lead = max(row.values()) - row[mine]
    return lead if lead > 0 or math.isnan(lead) else None


def _follow_up_gap(row: Mapping[str, float] | None, mine: str, other: str) -> float | None:
    """The gap in a row fetched by a second request (another pass than the one that chose):
    how far the lower of the two competing tokens is below the row's best token. When one of
    them is the best, that is |row[mine] - row[other]|; when a third token leads both, the
    two are not the contest at that position and the gap is the distance to it."""
    if row is None or mine not in row or other not in row:
        return None
    return float(max(row.values()) - min(row[mine], row[other]))


def compare_greedy(
    prompt: str,
    on: Reply,
    off: Reply,
    tie_gap: float,
    follow_up: tuple[Mapping[str, float] | None, Mapping[str, float] | None] = (None, None),
) -> GreedyCase:
    """Compare one prompt's greedy outputs.

    A divergence at token j is a near-tie only when, for each side, the row it reported with
    its output scores its own choice as the best token (it chose its argmax: a side whose row
    puts the other token above its choice made a non-greedy choice, a FAIL) ahead of the other
    side's choice by at most ``tie_gap`` nats (the signed gap, >= 0). ``follow_up`` holds rows
    for the divergence position fetched by a second request (spec-on, spec-off), used for a
    side whose own row lacks a competing token; such a row comes from another pass, so the
    chosen token may trail there, and its gap is ``_follow_up_gap``. Every gap must be a
    finite number."""
    d = first_difference(on.text, off.text)
    if d is None:
        return GreedyCase(prompt, "identical", on.text, off.text)
    case: dict[str, Any] = {
        "char_index": d,
        "context": on.text[max(0, d - 60) : d],
        "on_next": on.text[d : d + 30],
        "off_next": off.text[d : d + 30],
    }
    if on.tokens is None or off.tokens is None:
        reason = (
            "the server returns no logprobs, so a near-tie cannot be told from a real difference"
        )
        return GreedyCase(prompt, "differs", on.text, off.text, reason=reason, **case)
    j = first_difference(on.tokens, off.tokens)
    if j is None:  # same tokens, different text (should not happen): report as is
        return GreedyCase(prompt, "differs", on.text, off.text, reason="same tokens", **case)
    lo = max(0, j - 3)
    case |= {
        "token_index": j,
        "on_tokens": on.tokens[lo : j + 3],
        "off_tokens": off.tokens[lo : j + 3],
    }
    if j >= len(on.tokens) or j >= len(off.tokens):
        reason = "one side stopped where the other went on"
        return GreedyCase(prompt, "differs", on.text, off.text, reason=reason, **case)
    t_on, t_off = on.tokens[j], off.tokens[j]
    row_on = on.top_logprobs[j] if on.top_logprobs and j < len(on.top_logprobs) else None
    row_off = off.top_logprobs[j] if off.top_logprobs and j < len(off.top_logprobs) else None
    gap_on, gap_off = _gap(row_on, t_on, t_off), _gap(row_off, t_off, t_on)
    src_on = src_off = "reported"
    # a side whose own row says it did not choose its best token: not greedy, never a tie
    for side, row, mine in (("spec-on", row_on, t_on), ("spec-off", row_off, t_off)):
        lead = _not_greedy(row, mine) if row and mine in row else None
        if lead is not None:
            case |= {"gap_on": gap_on, "gap_off": gap_off}
            case |= {"gap_on_source": "reported" if gap_on is not None else None}
            case |= {"gap_off_source": "reported" if gap_off is not None else None}
            reason = (
                f"the {side} side chose {mine!r} at temperature 0 though its own row scores "
                f"another token {lead:.3g} nats higher: not its argmax, so not a near-tie"
            )
            return GreedyCase(prompt, "differs", on.text, off.text, reason=reason, **case)
    if gap_on is None and (g := _follow_up_gap(follow_up[0], t_on, t_off)) is not None:
        gap_on, src_on = g, "follow-up"
    if gap_off is None and (g := _follow_up_gap(follow_up[1], t_off, t_on)) is not None:
        gap_off, src_off = g, "follow-up"
    case |= {"gap_on": gap_on, "gap_off": gap_off}
    case |= {"gap_on_source": src_on if gap_on is not None else None}
    case |= {"gap_off_source": src_off if gap_off is not None else None}
    if gap_on is None or gap_off is None:
        reason = "a competing token is not among the returned top logprobs"
        return GreedyCase(prompt, "differs", on.text, off.text, reason=reason, **case)
    gaps = (gap_on, gap_off)
    if all(math.isfinite(g) and 0 <= g <= tie_gap for g in gaps) and math.isfinite(tie_gap):
        reason = f"both gaps <= {tie_gap:g} nats" + (
            " (a gap from a follow-up request for that position's row)"
            if "follow-up" in (src_on, src_off)
            else ""
        )
        return GreedyCase(prompt, "near-tie", on.text, off.text, reason=reason, **case)
    reason = f"a gap above {tie_gap:g} nats (or not a finite number): not a near-tie"
    return GreedyCase(prompt, "differs", on.text, off.text, reason=reason, **case)
