"""Build the long-document editing set with predictions (``src/specdec/data/long_edit``) from
data specdec already bundles: a page of prose or a page of code to edit, passed as its own
prediction (OpenAI's Predicted Outputs), as an editor sends a document it asks a model to
change.

Sources (no download, deterministic):

  prose  the articles of Spec-Bench's summarization questions (``data/spec_bench``, Apache-2.0;
         the articles are CNN / Daily Mail news text as Spec-Bench ships them), the first six
         in file order of 2,500-4,000 characters, without the "Summarize:" prefix
  code   modules of three functions each: the HumanEval reference solutions that the
         ``code_predict`` set carries as predictions (``data/code_predict``, MIT License), the
         distinct functions of its rename, small-edit and reformat tasks in file order

Edits, each on two documents of its kind:

  typos           prose: fix the spelling mistakes; the prediction is the page with one
                  letter pair swapped in every 25th word of 7+ letters (the user's text)
  rename_name     prose: replace a name (the most frequent capitalised word of 5+ letters)
                  by another through the page
  add_title       prose: add a title line at the top, the text unchanged
  rename_function code: rename the module's first function through the file
  add_comments    code: a one-line comment above each function
  reindent        code: 2 spaces instead of 4 (every indented line changes)

    python benchmarks/studies/make_long_edit_set.py      # rewrites src/specdec/data/long_edit/
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "specdec" / "data"
OUT = ROOT / "long_edit"
FENCE = "```"
PROSE_CHARS = (2500, 4000)
CODE_SOURCES = ("rename", "small_edit", "reformat")
FUNCTIONS_PER_MODULE = 3
NEW_NAME = "Morgan"


def articles() -> list[tuple[str, str]]:
    """(question id, article) of the first six summarization questions of the right size."""
    out = []
    for line in (ROOT / "spec_bench" / "question.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["category"] != "summarization":
            continue
        text = str(rec["turns"][0]).removeprefix("Summarize:").strip()
        if PROSE_CHARS[0] <= len(text) <= PROSE_CHARS[1]:
            out.append((f"spec_bench:{rec['question_id']}", text))
    return out[:6]


def modules() -> list[tuple[str, str]]:
    """(sources, module) of three distinct HumanEval functions each, three modules."""
    seen: dict[str, str] = {}
    for line in (ROOT / "code_predict" / "prompts.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["fine_category"] in CODE_SOURCES and rec["source"] not in seen:
            seen[str(rec["source"])] = str(rec["prediction"]).strip("\n") + "\n"
    items = list(seen.items())
    out = []
    for i in range(0, 3 * FUNCTIONS_PER_MODULE, FUNCTIONS_PER_MODULE):
        group = items[i : i + FUNCTIONS_PER_MODULE]
        out.append((",".join(s for s, _ in group), "\n\n".join(code for _, code in group)))
    return out


def with_typos(text: str) -> str:
    """Every 25th word of 7+ letters with two inner letters swapped."""
    n = 0

    def swap(m: re.Match[str]) -> str:
        nonlocal n
        word = m.group(0)
        n += 1
        if n % 25:
            return word
        return word[:2] + word[3] + word[2] + word[4:]

    return re.sub(r"[A-Za-z]{7,}", swap, text)


def frequent_name(text: str) -> str:
    words = re.findall(r"\b[A-Z][a-z]{4,}\b", text)
    return Counter(words).most_common(1)[0][0]


def first_function(code: str) -> str:
    m = re.search(r"^def (\w+)\(", code, re.M)
    assert m is not None
    return m.group(1)


def prose_requests() -> list[dict[str, str]]:
    out = []
    for i, (source, text) in enumerate(articles()):
        kind = ("typos", "rename_name", "add_title")[i % 3]
        if kind == "typos":
            page = with_typos(text)
            ask = "Fix the spelling mistakes in this text. Change nothing else and return the "
            ask += "whole text."
        elif kind == "rename_name":
            page = text
            name = frequent_name(text)
            ask = f"Replace every occurrence of the name `{name}` with `{NEW_NAME}` in this "
            ask += "text. Change nothing else and return the whole text."
        else:
            page = text
            ask = "Add a short title line at the top of this text. Keep the text itself "
            ask += "unchanged and return the whole text."
        out.append(
            {
                "id": f"{kind}_{i // 3 + 1}",
                "fine_category": kind,
                "source": source,
                "prompt": f"{ask}\n\n{page}",
                "prediction": page,
            }
        )
    return out


def code_requests() -> list[dict[str, str]]:
    out = []
    kinds = ("rename_function", "add_comments", "reindent")
    mods = modules()
    for j, kind in enumerate(kinds * 2):
        source, code = mods[(j + j // 3) % 3]  # each kind on two different modules
        if kind == "rename_function":
            name = first_function(code)
            ask = f"Rename the function `{name}` to `{name}_v2` throughout this module, calls "
            ask += "included. Change nothing else and return the whole module in a Python code "
            ask += "block."
        elif kind == "add_comments":
            ask = "Add a one-line comment above each function saying what it does. Change "
            ask += "nothing else and return the whole module in a Python code block."
        else:
            ask = "Re-indent this module with 2 spaces per level instead of 4. Change nothing "
            ask += "else and return the whole module in a Python code block."
        out.append(
            {
                "id": f"{kind}_{j // 3 + 1}",
                "fine_category": kind,
                "source": source,
                "prompt": f"{ask}\n\n{FENCE}python\n{code}{FENCE}",
                "prediction": code,
            }
        )
    return out


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    rows = prose_requests() + code_requests()
    lines = [json.dumps({"category": "long_edit", **r}, ensure_ascii=False) for r in rows]
    (OUT / "prompts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(rows)} requests to {OUT / 'prompts.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
