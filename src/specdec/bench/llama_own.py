"""llama-cpp-python's own greedy loop on a loaded llama.cpp target: the fastest plain decoder
of a GGUF, which every speed claim is compared with (``specdec demo``; the benchmarks'
``plain_baselines.py`` runs it on instances of their own).

It runs on the very ``Llama`` object specdec's backend wraps (``LlamaCppLM.llm``), so both
loops decode the same weights in memory; specdec's cache is emptied before and after, so
neither sees the other's cells. Tokens are timed where llama-cpp-python samples them (its
``stopping_criteria`` hook, once per sampled token), and the decode window runs from the
first sampled token to the last, the window of ``decode_window`` for specdec's results.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec.core.result import GenerationResult


@dataclass(frozen=True)
class OwnRun:
    """One run of llama-cpp-python's loop: the tokens it sampled (``n_sampled``), the ids its
    hook saw (all of them but the last: llama-cpp-python evaluates a sampled token, and
    shows it to the hook, only when it samples the next one), and the tokens after the
    first with the seconds they took (the first token's prefill excluded)."""

    seen: list[int]
    n_sampled: int
    decode_tokens: int
    decode_s: float

    @property
    def tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else float("nan")

    def same_output(self, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` (another loop's output) can be this run's: as many, and equal
        to every id the hook saw."""
        return len(tokens) == self.n_sampled and list(tokens[: len(self.seen)]) == self.seen


def decode_window(result: GenerationResult) -> tuple[int, float]:
    """(tokens after the first round, their seconds) of a specdec result: the window that
    ``OwnRun`` measures (the prefill and the round that emits the first token excluded)."""
    if not result.rounds:
        return 0, 0.0
    first = result.rounds[0]
    return len(result.tokens) - first.n_emitted, result.t_total - result.t_prefill - first.t_round


def llama_loop(llm: Any, prompt_ids: Sequence[int], max_new_tokens: int) -> OwnRun:
    """llama-cpp-python's own greedy loop (``create_completion``, streamed, as a user calls
    it) on the ``Llama`` object ``llm``, keeping what its cache already shares with the
    prompt (llama-cpp-python's prefix reuse)."""
    import llama_cpp

    stamps: dict[int, float] = {}  # ids length at a sampled token -> when it was sampled
    last: list[list[int]] = [[]]
    prompt = [int(t) for t in prompt_ids]

    def at_each_token(ids: Any, _logits: Any) -> bool:
        stamps.setdefault(len(ids), time.perf_counter())
        last[0] = [int(t) for t in ids]
        return False

    for _ in llm.create_completion(
        prompt,
        max_tokens=max_new_tokens,
        temperature=0.0,
        top_k=1,
        stream=True,
        stopping_criteria=llama_cpp.StoppingCriteriaList([at_each_token]),
    ):
        pass
    # the hook runs once per sampled token and once more after the loop with the same ids
    times = sorted(stamps.values())
    n = len(times)
    return OwnRun(last[0][len(prompt) :], n, max(0, n - 1), times[-1] - times[0] if n else 0.0)


def own_loop(target: Any, prompt_ids: Sequence[int], max_new_tokens: int) -> OwnRun | None:
    """``llama_loop`` on ``target``'s own ``Llama`` object, its cache emptied before and
    after (neither loop sees the other's cells); None when the target is not a llama.cpp
    model."""
    llm = getattr(target, "llm", None)
    if llm is None or not callable(getattr(llm, "create_completion", None)):
        return None
    target.truncate(0)
    llm.reset()
    try:
        return llama_loop(llm, prompt_ids, max_new_tokens)
    finally:
        llm.reset()
        target.truncate(0)
