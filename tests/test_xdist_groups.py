"""`make test` keeps each `xdist_group` on one worker (`--dist loadgroup`).

The vLLM modules rely on it: their engines (about 15 GiB at the in-process module's
peak, on a 24 GiB machine) must never start on two workers at once. pytest 9.2 with
pytest-xdist 3.8 silently dropped the groups (pytest-dev/pytest-xdist#1386); the dev
extra pins pytest below 9.2, and this test fails if the installed pair drops them again.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = """
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("i", range(6))
def test_case(i):
    pass
"""


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_loose.py").write_text(
        "def test_a():\n    pass\n\n\ndef test_b():\n    pass\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-v",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers = set(re.findall(r"\[(gw\d+)\].*PASSED test_grouped\.py", done.stdout))
    assert len(re.findall(r"PASSED test_grouped\.py", done.stdout)) == 6, done.stdout[-3000:]
    assert len(workers) == 1, f"the group ran on {sorted(workers)}:\n{done.stdout[-3000:]}"


def test_a_test_reading_a_shared_launch_without_its_group_is_named():
    """A session-wide launch runs once only if every test that reads it is in its group:
    a test without the marker is refused by node id; one in the group, or one that does
    not read the launch, passes."""
    from types import SimpleNamespace

    import pytest
    from testkit.train_ranks import GROUP, check_one_worker

    def item(nodeid: str, fixtures: tuple[str, ...], group: str | None):
        marks = [pytest.mark.xdist_group(group).mark] if group else []
        return SimpleNamespace(
            nodeid=nodeid, fixturenames=fixtures, iter_markers=lambda name: iter(marks)
        )

    fine = [
        item("t.py::in_group", ("two_rank_train",), GROUP),
        item("t.py::other", ("tmp_path",), None),
    ]
    check_one_worker(fine, "two_rank_train", GROUP)
    loose = [*fine, item("t.py::loose", ("ranks", "two_rank_train"), None)]
    loose.append(item("t.py::elsewhere", ("two_rank_train",), "another-group"))
    with pytest.raises(AssertionError) as error:
        check_one_worker(loose, "two_rank_train", GROUP)
    assert str(error.value).startswith(
        "mark these tests pytest.mark.xdist_group('two-rank-train'): "
        "['t.py::loose', 't.py::elsewhere']"
    )
