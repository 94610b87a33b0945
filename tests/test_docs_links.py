"""The house's paper: every relative link and every repository path a README or docs page
names resolves, and every committed results file is named by some doc (issue 64: nothing
measured is lost, nothing named is missing). No timing, no models."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# a path in backticks that starts at a top-level directory of the repository
PATH = re.compile(r"`((?:docs|benchmarks|src|tests|patches|integrations)/[^`\s]*)`")
RESULTS = "benchmarks/results/"


def tracked(pattern: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.split()


def pages() -> list[Path]:
    """README.md, docs/*.md (the certificates' generated pages aside), the benchmarks' indexes."""
    names = ["README.md", "CONTRIBUTING.md", "benchmarks/README.md", "benchmarks/studies/README.md"]
    names += [p for p in tracked("docs/*.md") if p.count("/") == 1]
    return [ROOT / n for n in names]


def broken_links(page: Path, text: str) -> list[str]:
    """The links and backticked repository paths of ``page`` that name nothing (pure)."""
    bad = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if path and not (page.parent / path).exists():
            bad.append(target)
    for path in PATH.findall(text):
        path = re.sub(r":\d+(-\d+)?$", "", path.rstrip(".,;:)"))  # file:120-149 names lines
        if any(c in path for c in "*{<"):  # a pattern: some file must match it
            pattern = re.sub(r"\{[^}]*\}", "*", path)
            if not list(ROOT.glob(pattern)):
                bad.append(path)
        elif not (ROOT / path).exists():
            bad.append(path)
    return bad


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_path_a_page_names_exists(page: Path) -> None:
    assert broken_links(page, page.read_text(encoding="utf-8")) == []


def test_a_missing_link_is_found(tmp_path: Path) -> None:
    """The check above can fail."""
    page = tmp_path / "p.md"
    (tmp_path / "there.md").write_text("x")
    text = "[a](there.md) [b](gone.md) [c](https://x.org) `docs/no-such-page.md` `docs/*.nope`"
    assert broken_links(page, text) == ["gone.md", "docs/no-such-page.md", "docs/*.nope"]


def unnamed(files: list[str], text: str) -> list[str]:
    """The results files that no doc names (pure): a file counts as named by its path under
    results/, its name, its name without the extension (a run's .json and .txt go
    together), a directory above it (a report's plots), or a pattern naming it with at least
    four fixed characters."""
    patterns = [
        p.rsplit("/", 1)[-1]
        for p in re.findall(r"[\w./-]*\*[\w./*-]*", text)
        if len(p.rsplit("/", 1)[-1].replace("*", "")) >= 4
    ]
    out = []
    for f in files:
        rel = f[len(RESULTS) :]
        p = Path(rel)
        names = {rel, p.name, p.stem, str(p.with_suffix(""))}
        names |= {f"{d}/" for d in map(str, p.parents) if d != "."}
        if any(n in text for n in names):
            continue
        if any(fnmatch.fnmatch(p.name, pat) for pat in patterns):
            continue
        out.append(f)
    return out


def test_every_results_file_is_named_by_some_doc() -> None:
    docs = [p for p in tracked("*.md") if not p.startswith(RESULTS)]
    text = "\n".join((ROOT / p).read_text(encoding="utf-8", errors="replace") for p in docs)
    assert unnamed(tracked(RESULTS), text) == []


def test_a_results_file_no_doc_names_is_found() -> None:
    files = [
        RESULTS + "a-run.json",
        RESULTS + "a-run.txt",
        RESULTS + "report/x.png",
        RESULTS + "lost.json",
    ]
    assert unnamed(files, "see `a-run.json` and report/") == [RESULTS + "lost.json"]


def test_the_benchmarks_top_level_holds_at_most_twelve_scripts() -> None:
    """The benchmarks a user runs stay few (issue 64); studies go to benchmarks/studies/."""
    top = [p for p in tracked("benchmarks/*.py") if "/" not in p[len("benchmarks/") :]]
    assert 0 < len(top) <= 12, top
