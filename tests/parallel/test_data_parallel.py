"""Data parallel on 2 processes (gloo, torchrun): the update equals one process on the union batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from testkit.train_ranks import GROUP, Scenario

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from dp_cases import CASES, full_batch, gradient_of, make_agent  # noqa: E402

# The tests of the suite's shared two-rank launch (tests/conftest.py: two_rank_train) on
# one worker: it runs once, not once per worker.
ONE_LAUNCH = pytest.mark.xdist_group(GROUP)


def two_rank_scenarios(root: Path, selected: set[str]) -> list[Scenario]:
    """This module's part of the shared launch: ``dp_gradients.main`` on both ranks."""
    return [Scenario("gradients", [], call=f"{HERE / 'dp_gradients.py'}:main")]


@pytest.fixture(scope="module")
def two_rank_results(two_rank_train):
    root, _, outcomes = two_rank_train
    done = outcomes["gradients"]
    assert done.codes == [0, 0], done.stdout[-3000:] + done.stderr[-3000:]
    return [torch.load(root / "gradients" / f"rank{r}.pt") for r in range(2)]


@ONE_LAUNCH
@pytest.mark.heavy
@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_two_ranks_give_the_gradient_and_metrics_of_one_process(case, two_rank_results):
    """Rank 0 holds 2 groups, rank 1 one group with 2 masked rows and a flat reward:
    different numbers of valid tokens, so per-rank normalisers would bias the gradient."""
    agent = make_agent(case)
    single = gradient_of(agent, full_batch(agent), case)
    for r, results in enumerate(two_rank_results):
        got = results[case]
        fsdp = "fsdp" in case[0]
        assert got["wrapped"] == ("ShardedUpdate" if fsdp else "DistributedDataParallel")
        assert single["grad"].abs().max() > 1e-4
        # A -step case compares weights after two AdamW steps of size ~learning_rate
        # (1e-3): its tolerance is 1% of a step.
        atol = 1e-5 if case[0].endswith("-step") else 1e-7
        torch.testing.assert_close(got["grad"], single["grad"], rtol=1e-5, atol=atol), r
        assert got["metrics"].keys() == single["metrics"].keys()
        for key, value in single["metrics"].items():
            assert got["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (r, key)


@ONE_LAUNCH
@pytest.mark.heavy
def test_a_trainable_parameter_the_loss_never_reaches_is_refused_on_every_rank(two_rank_results):
    for results in two_rank_results:
        assert results["unused"] == (
            "data parallel: 1 trainable parameter(s) get no gradient from the loss "
            "(policy.unused); DDP would not sum the gradients over ranks. Freeze them "
            "(requires_grad_(False)) before building the agent"
        )


@ONE_LAUNCH
@pytest.mark.heavy
def test_fsdp_optimizer_state_is_this_rank_s_shard_and_loads_back_on_that_rank_only(
    two_rank_results,
):
    """A checkpoint gets each rank's optimizer state as plain tensors (its shard of AdamW's
    two moments, through torch.distributed.checkpoint), marked; a fresh sharded optimizer
    on that rank loads it back exactly (as DTensors) and refuses the other rank's shard or
    a whole state, naming what it got."""
    agent = make_agent(("grpo", "token-mean"))
    total = sum(p.numel() for p in agent.optimizer.param_groups[0]["params"])
    sizes = []
    for r, results in enumerate(two_rank_results):
        got = results["fsdp-optimizer-state"]
        assert got["marker"] == {"rank": r, "world_size": 2}
        assert got["unstepped"] == ({}, 0)  # a state saved before any step: empty, untouched
        assert got["plain"]
        sizes.append(got["sizes"])
        assert got["loaded_as"] == "DTensor"
        assert got["round_trip"]
        assert got["other_rank"] == (
            f"resume: this data_parallel='fsdp' optimizer is rank {r} of 2 and loads only its "
            f"own shard, but was given rank {1 - r}'s shard of a run of 2 processes; resume "
            "with the data_parallel mode and number of processes that wrote the checkpoint"
        )
        assert got["whole"] == (
            f"resume: this data_parallel='fsdp' optimizer is rank {r} of 2 and loads only its "
            "own shard, but was given a whole optimizer state (a data_parallel='ddp' or "
            "one-process run); resume with the data_parallel mode and number of processes "
            "that wrote the checkpoint"
        )
    assert sum(sizes) == 2 * total  # the two shards hold both moments of every parameter once
    assert max(sizes) < 2 * total


def test_fsdp_on_one_process_is_the_plain_single_process_update():
    """No group to shard over: no wrapper, the same gradient as data_parallel='ddp'."""
    fsdp = make_agent(("grpo-fsdp", "token-mean"))
    assert fsdp.parallel.ddp is None and type(fsdp.parallel).__name__ == "DataParallelUpdate"
    plain = make_agent(("grpo", "token-mean"))
    got = gradient_of(fsdp, full_batch(fsdp), ("grpo-fsdp", "token-mean"))
    want = gradient_of(plain, full_batch(plain), ("grpo", "token-mean"))
    torch.testing.assert_close(got["grad"], want["grad"], rtol=0, atol=0)


def test_an_fsdp_shard_of_optimizer_state_is_refused_by_a_whole_optimizer():
    """Rank 0's shard loaded as a whole state would train with wrong moments: refused,
    naming the world size to resume with."""
    agent = make_agent(("grpo", "token-mean"))
    state = agent.state_dict()
    agent.load_state_dict(state)  # a whole state loads
    with pytest.raises(ValueError) as error:
        shard = {**state["optimizer"], "fsdp_shard": {"rank": 0, "world_size": 2}}
        agent.load_state_dict({**state, "optimizer": shard})
    assert str(error.value) == (
        "resume: this optimizer state is rank 0's shard of a data_parallel='fsdp' run of 2 "
        "processes, not a whole optimizer state; resume the run with the same number of "
        "processes (lmgym train --nproc-per-node 2 --resume ...), where each rank loads its "
        "own shard. Its weights are complete: to start a new run from them, use "
        "CausalLMPolicy.from_pretrained on the checkpoint's policy directory"
    )
