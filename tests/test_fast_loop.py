"""make test-fast's ``--cases-per-test K`` (tests/conftest.py): each parametrized test
function keeps K of its cases, spread evenly (first and last included); other tests
are untouched; 0 keeps everything."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
TESTS = """
import pytest

@pytest.mark.parametrize("n", range(7))
def test_seven(n):
    pass

@pytest.mark.parametrize("n", range(2))
def test_two(n):
    pass

def test_plain():
    pass
"""


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=TESTS)
    result = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    return [line.split("::")[1] for line in result.outlines if "::" in line]


def test_each_parametrized_function_keeps_k_cases_spread_over_its_list(pytester):
    assert collected(pytester, "--cases-per-test", "3") == [
        "test_seven[0]",
        "test_seven[3]",
        "test_seven[6]",
        "test_two[0]",
        "test_two[1]",
        "test_plain",
    ]


def test_one_case_keeps_the_first_and_zero_keeps_all(pytester):
    assert collected(pytester, "--cases-per-test", "1") == [
        "test_seven[0]",
        "test_two[0]",
        "test_plain",
    ]
    assert len(collected(pytester)) == 10


def test_a_negative_count_is_a_usage_error(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=TESTS)
    result = pytester.runpytest_inprocess("--collect-only", "--cases-per-test", "-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--cases-per-test must be >= 0, got -1*"])
