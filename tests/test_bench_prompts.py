"""Prompt sets: the packaged Spec-Bench copy, user files, category filters, seeded sampling."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from specdec.errors import ConfigError
from specdec.prompt_sets import (
    MT_BENCH_SUBCATEGORIES,
    SPEC_BENCH_CATEGORIES,
    filter_categories,
    load_prompt_file,
    load_prompts,
    load_spec_bench,
    sample_per_category,
    select_prompts,
)


def test_spec_bench_has_480_first_turn_prompts_in_six_coarse_categories() -> None:
    prompts = load_spec_bench()
    assert len(prompts) == 480
    assert len({p.id for p in prompts}) == 480
    coarse = Counter(p.category for p in prompts)
    assert set(coarse) == set(SPEC_BENCH_CATEGORIES)
    assert all(n == 80 for n in coarse.values())
    fine = Counter(p.fine_category for p in prompts if p.category == "mt_bench")
    assert set(fine) == set(MT_BENCH_SUBCATEGORIES)
    assert all(n == 10 for n in fine.values())
    first = prompts[0]
    assert first.id == "spec_bench:81"
    assert first.fine_category == "writing" and first.category == "mt_bench"
    assert first.text.startswith("Compose an engaging travel blog post")
    assert "Start every sentence with the letter A" not in first.text  # second turn dropped
    assert load_prompts(None) == prompts == load_prompts("spec_bench")


def test_filter_by_coarse_or_fine_category() -> None:
    prompts = load_spec_bench()
    assert len(filter_categories(prompts, ["mt_bench"])) == 80
    coding = filter_categories(prompts, ["coding", "qa"])
    assert Counter(p.fine_category for p in coding) == {"coding": 10, "qa": 80}
    with pytest.raises(ConfigError, match="unknown category nonsense"):
        filter_categories(prompts, ["nonsense"])


def test_seeded_sampling_is_reproducible_and_per_category() -> None:
    prompts = load_spec_bench()
    a = sample_per_category(prompts, 3, seed=7)
    assert a == sample_per_category(prompts, 3, seed=7)
    assert Counter(p.category for p in a) == dict.fromkeys(SPEC_BENCH_CATEGORIES, 3)
    b = sample_per_category(prompts, 3, seed=8)
    assert [p.id for p in a] != [p.id for p in b]
    assert sample_per_category(prompts, 0, seed=7) == prompts
    assert len(sample_per_category(prompts, 500, seed=7)) == 480  # capped by category size
    sel = select_prompts(None, categories=["qa", "rag"], per_category=2, seed=1)
    assert [p.category for p in sel] == ["qa", "qa", "rag", "rag"]


def test_jsonl_file_accepts_prompt_turns_or_text(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    rows = [
        {"prompt": "first", "category": "code", "id": "a"},
        {"turns": ["second", "ignored"], "question_id": 7},
        {"text": "third"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    prompts = load_prompt_file(path)
    assert [p.text for p in prompts] == ["first", "second", "third"]
    assert [p.id for p in prompts] == ["mine:a", "mine:7", "mine:line3"]
    assert [p.category for p in prompts] == ["code", "custom", "custom"]
    # MT-bench sub-category names are grouped like in Spec-Bench
    path.write_text(json.dumps({"prompt": "x", "category": "coding"}) + "\n", encoding="utf-8")
    (p,) = load_prompt_file(path)
    assert (p.category, p.fine_category) == ("mt_bench", "coding")


def test_text_file_is_one_prompt_per_line(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt"
    path.write_text("hello there\n\nwrite a poem\n", encoding="utf-8")
    prompts = load_prompts(path)
    assert [(p.id, p.text, p.category) for p in prompts] == [
        ("lines:line1", "hello there", "custom"),
        ("lines:line3", "write a poem", "custom"),
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "holds no prompts"),
        ('{"prompt": "a"}\n{not json\n', "not valid JSON"),
        ('{"other": "a"}\n', "no prompt text"),
        ('{"turns": []}\n', "non-empty list"),
        ('{"prompt": "a", "id": 1}\n{"prompt": "b", "id": 1}\n', "duplicate prompt id"),
    ],
)
def test_bad_prompt_files_are_user_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        load_prompt_file(path)


def test_missing_prompt_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_prompts(tmp_path / "nope.txt")
