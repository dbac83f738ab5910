"""A command line that only one rank refuses: every rank exits 2 with one line naming the
bad value, none with a lost-peer traceback (issue 27 §6)."""

from __future__ import annotations

import pytest
from testkit.train_ranks import Scenario, run_scenarios

pytestmark = pytest.mark.heavy  # multi-process or end-to-end runs: make test-fast skips them


def test_a_bad_flag_on_one_rank_ends_every_rank_with_one_line(tmp_path):
    bad = Scenario(
        "bad-flag",
        ["--no-progress", "--run-dir", str(tmp_path / "run")],
        per_rank=("", "--learning-rate -1"),
    )
    launch, outcomes = run_scenarios(tmp_path, [bad])  # every rank returned: no hang
    done = outcomes["bad-flag"]
    assert done.codes == [2, 2]
    errors = [line for line in done.stderr.splitlines() if line.startswith("lmgym train: error:")]
    assert len(errors) == 2 and all("learning_rate=-1" in line for line in errors), errors
    assert any("rank 1 failed, so this rank stops too" in line for line in errors)
    for stderr in (done.stderr, launch.stderr):  # Python's, and what the processes wrote
        assert "Connection closed by peer" not in stderr and "Traceback" not in stderr
    assert not (tmp_path / "run").exists()
