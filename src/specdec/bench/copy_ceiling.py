"""The verify-curve ceiling of a request whose output copies a prediction (pure functions).

How fast can any drafter of the prediction decode this output on this machine? Under greedy
decoding the output is fixed, so the question is about the output and the prediction alone:

* the output's *copies*: the matching blocks of a diff of the prediction against the output
  (``difflib``, token ids, blocks of at least ``MIN_BLOCK`` tokens); the other output tokens
  are *new* text that the prediction does not hold;
* the acceptance the copies allow: a drafter that follows the prediction keeps every token
  of a block and loses one draft token where the block ends, so per drafted token
  ``alpha = copied / (copied + blocks)``;
* the ceiling: the copies at the speedup ``theory.copy_ceiling(alpha, curve)`` gives at its
  best K (drafting free, rejections at rate 1 - alpha), the new text at one plain step a
  token:

      plain steps = new + copied / copy_ceiling(alpha)
      ceiling     = output tokens / plain steps      (a speedup over plain decoding)

It is a model, not a bound: a drafter may beat it where new text repeats the prompt (the
suffix drafter copies it) or where the blocks' ends are predictable (drafts need not stop at a
block's end), and it ignores the loop's own costs. It does not depend on the drafter that
ran, so a drafter that re-synchronises late or drafts short pays for it here.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from specdec.theory import copy_ceiling

MIN_BLOCK = 2  # shorter common runs are coincidences inside new text, not copies


@dataclass(frozen=True)
class Ceiling:
    """The ceiling of one request (see the module docstring)."""

    tokens: int  # output tokens
    copied: int  # of them, in blocks copied from the prediction
    blocks: int
    alpha: float  # copied / (copied + blocks); 0 without copies
    best_k: int  # the K of copy_ceiling(alpha) (0: plain)
    copy_speedup: float  # copy_ceiling(alpha): the copies' speedup at best_k
    speedup: float  # the request's ceiling over plain decoding

    def to_dict(self) -> dict[str, float | int]:
        return {
            "tokens": self.tokens,
            "copied": self.copied,
            "blocks": self.blocks,
            "alpha": self.alpha,
            "best_k": self.best_k,
            "copy_speedup": self.copy_speedup,
            "speedup": self.speedup,
        }


def copy_blocks(prediction: Sequence[int], output: Sequence[int]) -> list[int]:
    """Lengths of the blocks of ``output`` copied from ``prediction`` (>= MIN_BLOCK tokens)."""
    matcher = difflib.SequenceMatcher(None, list(prediction), list(output), autojunk=False)
    return [b.size for b in matcher.get_matching_blocks() if b.size >= MIN_BLOCK]


def request_ceiling(
    prediction: Sequence[int], output: Sequence[int], verify_ratio: Sequence[float]
) -> Ceiling:
    """The ceiling of one output against its prediction on a verify curve
    (verify_ratio[n - 1] = verify(n) / verify(1))."""
    blocks = copy_blocks(prediction, output)
    copied, n = sum(blocks), len(output)
    alpha = copied / (copied + len(blocks)) if blocks else 0.0
    best_k, copy_speedup = copy_ceiling(alpha, verify_ratio)
    steps = (n - copied) + copied / copy_speedup
    return Ceiling(
        tokens=n,
        copied=copied,
        blocks=len(blocks),
        alpha=alpha,
        best_k=best_k,
        copy_speedup=copy_speedup,
        speedup=n / steps if steps > 0 else 1.0,
    )
