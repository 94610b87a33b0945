"""Prompts for Level 3: a built-in handful, the packaged Spec-Bench set, or a user's file."""

from __future__ import annotations

from pathlib import Path

from specdec.errors import ConfigError
from specdec.util.textfiles import parse_json, read_text

BUILTIN = "builtin"
SPEC_BENCH = "spec_bench"

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


def _read_file(path: Path) -> list[str]:
    """JSONL (fields prompt | turns[0] | text) or plain text, one prompt per line."""
    lines = read_text(path, "prompt file").splitlines()  # bounded, UTF-8 checked
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            rec = parse_json(line, f"{path}:{i}")
            if not isinstance(rec, dict):
                raise ConfigError(f"{path}:{i}: each JSON line must be an object")
            turns = rec.get("turns")
            text = rec.get("prompt") or (turns[0] if isinstance(turns, list) and turns else None)
            text = text or rec.get("text")
            if not isinstance(text, str):
                raise ConfigError(f"{path}:{i}: no prompt text (prompt, turns or text)")
            out.append(text)
        else:
            out.append(line)
    return out


def load_prompt_texts(source: str | None, n: int) -> tuple[list[str], str]:
    """(up to n prompt texts, a description of where they came from).

    source: None or "builtin" (the handful above), "spec_bench" (the packaged set, n prompts
    spread over it), or a file path (JSONL or one prompt per line; the first n are used).
    """
    if source in (None, BUILTIN):
        texts = list(DEFAULT_PROMPTS)
        return texts[:n] if n > 0 else texts, "built-in prompts"
    if source == CODE_PREDICT:  # code edits with the code as prediction (predicted outputs)
        from specdec.prompt_sets import load_code_predict

        texts = [p.text for p in load_code_predict()]
        return (texts[:n] if n > 0 else texts), "code_predict (packaged, with predictions)"
    if source == SPEC_BENCH:
        try:
            from specdec.prompt_sets import load_spec_bench
        except ImportError as e:  # pragma: no cover - depends on the installed tree
            raise ConfigError("the packaged Spec-Bench prompts are not available") from e
        return _spread([p.text for p in load_spec_bench()], n), "Spec-Bench (packaged)"
    path = Path(source)
    try:
        from specdec.prompt_sets import load_prompt_file

        texts = [p.text for p in load_prompt_file(path)]
    except ImportError:  # pragma: no cover - depends on the installed tree
        texts = _read_file(path)
    if not texts:
        raise ConfigError(f"prompt file {path} holds no prompts")
    return (texts[:n] if n > 0 else texts), str(path)


CODE_PREDICT = "code_predict"


def load_prompt_predictions(source: str | None, n: int) -> list[str | None] | None:
    """The predictions (OpenAI's predicted outputs) that go with ``load_prompt_texts(source,
    n)``'s prompts, in the same order: from the packaged code_predict set or a JSONL file
    with "prediction" fields; None when no prompt carries one."""
    if source == CODE_PREDICT:
        from specdec.prompt_sets import load_code_predict

        found: list[str | None] = [p.prediction for p in load_code_predict()]
    elif source in (None, BUILTIN, SPEC_BENCH):
        return None
    else:
        from specdec.prompt_sets import load_prompt_file

        found = [p.prediction for p in load_prompt_file(Path(source))]
    found = found[:n] if n > 0 else found
    return found if any(x is not None for x in found) else None
