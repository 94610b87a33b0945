"""Prompts for Level 3: a built-in handful, the packaged Spec-Bench set, or a user's file."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdec.prompt_sets import CODE_PREDICT, SPEC_BENCH, load_prompt_file, load_spec_bench

BUILTIN = "builtin"

# A mix of code and prose (acceptance differs a lot between them).
DEFAULT_PROMPTS: tuple[str, ...] = (
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain in two sentences why the sky is blue.",
    "def quicksort(xs):\n    # sort a list of integers\n",
    "Translate to French: The weather is nice today and we are going to the beach.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "Write a SQL query that counts the orders per customer in a table orders(id, customer_id).",
    "List five tips for writing clear technical documentation.",
    "What is the derivative of x^3 * sin(x)? Show the steps.",
)


def _spread(items: list[str], n: int) -> list[str]:
    """n items spread evenly over the list (deterministic), all of them if n >= len."""
    if n <= 0 or n >= len(items):
        return list(items)
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


@dataclass(frozen=True)
class CertifyPrompts:
    """The prompts of Level 3 and the probe, read once: their texts, the predictions that go
    with them (OpenAI's predicted outputs; None when no prompt carries one) and where they
    came from (for the report). A caller of the Python API may give token-id lists for
    texts."""

    texts: Sequence[str | Sequence[int]]
    predictions: list[str | None] | None
    where: str


def load_certify_prompts(source: str | None, n: int) -> CertifyPrompts:
    """Up to n prompts (all of them for n <= 0), read once.

    source: None or "builtin" (the handful above), "spec_bench" (the packaged set, n prompts
    spread over it), another packaged set by name (``prompt_sets.NAMED_SETS``; code_predict
    carries predictions), or a file path (JSONL with "prompt" | "turns" | "text" and an
    optional "prediction" per line, or one prompt per line; the first n are used).
    """
    texts, predictions, where = _read(source, n)
    return CertifyPrompts(texts, predictions, where)


def _read(source: str | None, n: int) -> tuple[list[str], list[str | None] | None, str]:
    if source in (None, BUILTIN):
        texts = list(DEFAULT_PROMPTS)
        return texts[:n] if n > 0 else texts, None, "built-in prompts"
    if source == SPEC_BENCH:
        return _spread([p.text for p in load_spec_bench()], n), None, "Spec-Bench (packaged)"
    found = load_prompt_file(source)  # a packaged set by name, or the user's file
    found = found[:n] if n > 0 else found
    predictions = [p.prediction for p in found]
    where = "code_predict (packaged, with predictions)" if source == CODE_PREDICT else source
    return (
        [p.text for p in found],
        predictions if any(x is not None for x in predictions) else None,
        where,
    )
