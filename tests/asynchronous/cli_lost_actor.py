"""``lmgym train --actors 1 --learners 1`` under torchrun whose actor dies (SIGKILL) once the
run's iteration-2 checkpoint exists; each rank that returns writes its exit status.

Usage: cli_lost_actor.py OUT_DIR RUN_DIR COMMON FLAGS...
"""

import os
import signal
import sys
from pathlib import Path

import lmgym.asynchronous.driver as driver
from lmgym.cli import main

out, run, *common = sys.argv[1:]
real_run_actor = driver.run_actor


def dying_actor(agent, topology, hooks):
    def step(actor: int, steps: int) -> None:
        if (Path(run) / "checkpoints" / "iter_000002").is_dir():
            os.kill(os.getpid(), signal.SIGKILL)

    hooks.actor_step = step
    real_run_actor(agent, topology, hooks)


driver.run_actor = dying_actor
rank = int(os.environ["RANK"])
code = main(["train", "--actors", "1", "--learners", "1", "--run-dir", run, *common])
Path(out, f"rc{rank}").write_text(str(code))
