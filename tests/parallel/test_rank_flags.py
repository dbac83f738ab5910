"""A command line that only one rank refuses: every rank exits 2 with one line naming the
bad value, none with a lost-peer traceback (issue 27 §6)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # multi-process or end-to-end runs: make test-fast skips them

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_a_bad_flag_on_one_rank_ends_every_rank_with_one_line(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(HERE / "cli_rank_argv.py"), str(tmp_path)]
    command += ["", "--learning-rate -1", "--", "--no-progress", "--run-dir", str(tmp_path / "run")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]  # every rank returned: no hang
    assert [(tmp_path / f"rc{r}").read_text() for r in range(2)] == ["2", "2"]
    errors = [line for line in done.stderr.splitlines() if line.startswith("lmgym train: error:")]
    assert len(errors) == 2 and all("learning_rate=-1" in line for line in errors), errors
    assert any("rank 1 failed, so this rank stops too" in line for line in errors)
    assert "Connection closed by peer" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()
