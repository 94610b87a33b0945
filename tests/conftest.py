"""Shared set-up: everything here is offline, tiny and seeded.

Mock-sized tensor work runs fastest on one thread, and a busy 2-core machine punishes
oversubscription, so the suite uses one torch thread throughout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

# Tests measured slow (``slow_tests.txt``: a file, a test, or a test with all its parameters),
# marked ``slow`` here: ``make test`` leaves them out, ``make test-all`` runs them.
SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")


def slow_test_ids(text: str) -> frozenset[str]:
    """The entries of ``slow_tests.txt``: one node id a line, ``#`` starts a comment."""
    return frozenset(line.split("#", 1)[0].strip() for line in text.splitlines()) - {""}


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = slow_test_ids(SLOW_TESTS.read_text(encoding="utf-8"))
    for item in items:
        node = item.nodeid
        if {node, node.split("[", 1)[0], node.split("::", 1)[0]} & slow:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _own_profile_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Profiles and measured costs that a test writes stay out of the user's cache. The
    suite runs beside other jobs, so the check that keeps costs measured under load out of
    the cache (``util.cpuload``) is off here, except where a test turns it on."""
    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path_factory.mktemp("profiles")))
    monkeypatch.setenv("SPECDEC_BUSY_SHARE", "1")
