"""vLLM in a torch.distributed world: two data-parallel ranks, each with its own engine.

An in-process vLLM engine adopts the run's process group as its own world and breaks
the run's collectives (tried: the next all-reduce fails), so in a world of more than
one process the engine's model worker runs in a child process and reloads the learner's weights
from shared memory (``lmgym.policy.vllm_engine``). The oracle is each rank's own
teacher-forced pass, before and after a data-parallel update. The model is a small
random Llama with SmolLM2's tokenizer (``vllm_cases.small_chat_llama``): what is under
test is the engine's process and weight route, which the real model's size only makes
costly (test_vllm_engine.py runs the real model in one process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from testkit import child_env, torchrun_command

HERE = Path(__file__).resolve().parent
# The vLLM tests' shared cases and this test's torchrun worker live beside the
# in-process engine's tests.
POLICY_TESTS = HERE.parent / "policy"
sys.path.insert(0, str(POLICY_TESTS))

from vllm_cases import TOLERANCE, missing_reason, small_chat_llama  # noqa: E402

_REASON = missing_reason()
pytestmark = [
    pytest.mark.skipif(_REASON is not None, reason=str(_REASON)),
    pytest.mark.heavy,
    # The in-process engine's group: never beside that module (about 15 GiB at its peak)
    # on another worker, where the two together ran the CI machine out of memory. This
    # folder is collected first, so it runs before that module grows the worker.
    pytest.mark.xdist_group("vllm"),
]


def _kill_run(tag: str) -> None:
    """Kill every process that inherited ``LMGYM_TEST_RUN=tag``: torchrun, its ranks and
    the vLLM model workers, which a rank that dies leaves running (they would hold memory
    and the log open after the test)."""
    import psutil  # a dependency of vLLM, which this module needs

    for process in psutil.process_iter():
        try:
            if process.environ().get("LMGYM_TEST_RUN") == tag:
                process.kill()
        except psutil.Error:  # gone, or another user's
            continue


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("vllm-world")
    # A 13 M-parameter Llama with SmolLM2's tokenizer: each rank holds its policy copies,
    # optimizer and a vLLM engine; the real model there needs about 20 GiB for the two.
    model = small_chat_llama(out / "model")
    tag = f"{os.getpid()}-{out.name}"
    env = child_env(LMGYM_TEST_RUN=tag)
    command = torchrun_command(2, str(POLICY_TESTS / "vllm_world.py"), str(out), str(model))
    log = out / "torchrun.log"
    # Output to a file, not a pipe: a pipe stays open while any child lives.
    with log.open("w") as sink:
        run = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            status = run.wait(timeout=600)
        except subprocess.TimeoutExpired:
            status = "timed out after 600 s"
        finally:
            _kill_run(tag)
    assert status == 0, f"torchrun: {status}\n" + log.read_text()[-6000:]
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
