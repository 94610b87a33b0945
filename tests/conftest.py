"""Shared set-up: everything here is offline, tiny and seeded.

Mock-sized tensor work runs fastest on one thread, and a busy 2-core machine punishes
oversubscription, so the suite uses one torch thread throughout.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


# set in the child process that runs a test marked ``fresh_process``
FRESH_ENV = "SPECDEC_TEST_IN_FRESH_PROCESS"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A test marked ``fresh_process`` runs alone in a new pytest process (its verdict is the
    child's): ggml reads its kernel switches once per process, so an exact model loaded after
    a default-numerics model has run in the same process is refused by its self-check."""
    if pyfuncitem.get_closest_marker("fresh_process") is None or os.environ.get(FRESH_ENV):
        return None
    root = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-m", "pytest", pyfuncitem.nodeid, "-q", "-rs", "-m", ""]
    env = {**os.environ, FRESH_ENV: "1", "PYTHONPATH": str(root / "src")}
    for switch in ("GGML_CPU_TILED_MM", "GGML_CPU_REPACK_ROW_INVARIANT"):  # as set by a load here
        env.pop(switch, None)
    out = subprocess.run(
        [*argv, "-p", "no:cacheprovider"],
        cwd=pyfuncitem.config.rootpath,  # where the node id is relative to
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    tail = (out.stdout + out.stderr)[-4000:]
    if out.returncode == 0 and " passed" in out.stdout:
        return True
    if out.returncode == 0 and " skipped" in out.stdout:
        reason = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED")]
        pytest.skip(reason[-1].split("] ", 1)[-1] if reason else "skipped in its fresh process")
    pytest.fail(f"failed in a fresh process (exit {out.returncode}):\n{tail}", pytrace=False)


@pytest.fixture(autouse=True)
def _own_profile_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Profiles and measured costs that a test writes stay out of the user's cache. The
    suite runs beside other jobs, so the check that keeps costs measured under load out of
    the cache (``util.cpuload``) is off here, except where a test turns it on."""
    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path_factory.mktemp("profiles")))
    monkeypatch.setenv("SPECDEC_BUSY_SHARE", "1")
