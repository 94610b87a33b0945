"""The ``fresh_process`` marker (tests/conftest.py): a marked test runs alone in a new pytest
process and its verdict is the child's, failure and skip included (so a marked test can still
fail)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]


def test_a_marked_test_passes_fails_and_skips_as_its_child_does(pytester: pytest.Pytester) -> None:
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text(encoding="utf-8"))
    pytester.makefile(".txt", slow_tests="")  # the conftest's list of slow tests
    pytester.makepyfile(
        test_child="""
        import os
        import pytest

        @pytest.mark.fresh_process
        def test_passes_in_a_child():
            assert os.environ.get("SPECDEC_TEST_IN_FRESH_PROCESS") == "1"

        @pytest.mark.fresh_process
        def test_fails_in_a_child():
            assert 1 == 2

        @pytest.mark.fresh_process
        def test_skips_in_a_child():
            pytest.skip("the child says so")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*the child says so*"])
