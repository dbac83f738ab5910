"""Data parallel on 2 processes (gloo, torchrun): the update equals one process on the union batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from dp_cases import CASES, full_batch, gradient_of, make_agent  # noqa: E402


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 300) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    command += ["--standalone", str(script), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp")
    torchrun(HERE / "dp_gradients.py", str(out))
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_two_ranks_give_the_gradient_and_metrics_of_one_process(case, two_rank_results):
    """Rank 0 holds 2 groups, rank 1 one group with 2 masked rows and a flat reward:
    different numbers of valid tokens, so per-rank normalisers would bias the gradient."""
    agent = make_agent(case)
    single = gradient_of(agent, full_batch(agent), case)
    for r, results in enumerate(two_rank_results):
        got = results[case]
        assert got["wrapped"] == "DistributedDataParallel"
        assert single["grad"].abs().max() > 1e-4
        torch.testing.assert_close(got["grad"], single["grad"], rtol=1e-5, atol=1e-7), r
        assert got["metrics"].keys() == single["metrics"].keys()
        for key, value in single["metrics"].items():
            assert got["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (r, key)


def test_a_trainable_parameter_the_loss_never_reaches_is_refused_on_every_rank(two_rank_results):
    for results in two_rank_results:
        assert results["unused"] == (
            "data parallel: 1 trainable parameter(s) get no gradient from the loss "
            "(policy.unused); DDP would not sum the gradients over ranks. Freeze them "
            "(requires_grad_(False)) before building the agent"
        )
