"""Run on each of two torchrun ranks: one update's gradient on this rank's share of a batch.

Every rank builds the same policy and the same full batch, keeps its share of the
groups (rank 1 gets fewer valid tokens: several of its rows are masked, and one of
its groups is flat), runs ``train_on_batch`` with the optimizer step disabled and
writes the resulting gradient and metrics, for each agent and aggregation, to
``OUT/rank{r}.pt``. The test compares them with one process on the full batch.

``main(OUT)`` is a ``call`` scenario of the suite's shared two-rank launch
(``testkit.train_ranks``; test_data_parallel.py lists it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dp_cases import CASES, full_batch, gradient_of, make_agent  # noqa: E402

from lmgym.distributed import DataParallelGroup, init_from_env, shutdown  # noqa: E402


def main(out: Path) -> None:
    torch.set_num_threads(1)
    init_from_env(timeout_s=60)
    rank = DataParallelGroup().rank
    assert DataParallelGroup().size == 2
    results = {}
    for key in CASES:
        agent = make_agent(key)
        agent.parallel.bucket_cap_mb = 1 / 16  # several buckets: the bucketing is exercised
        batch = full_batch(agent)
        groups = batch.group_ids.unique()
        mine = groups[:2] if rank == 0 else groups[2:]  # 2 groups on rank 0, 1 on rank 1
        local = batch.select(torch.isin(batch.group_ids, mine))
        results[key] = gradient_of(agent, local, key)
        wrapper = agent.parallel.ddp if agent.parallel.ddp is not None else agent.parallel
        results[key]["wrapped"] = type(wrapper).__name__
    # FSDP: the optimizer state a checkpoint gets is this rank's shard, plain tensors,
    # marked; a fresh sharded optimizer loads it back, and refuses another rank's or a
    # whole state.
    agent = make_agent(("grpo-fsdp-step", "token-mean"))
    agent.train_on_batch(full_batch(agent))
    state = agent.state_dict()["optimizer"]
    moments = [v for per_param in state["state"].values() for v in per_param.values()]
    got = results["fsdp-optimizer-state"] = {
        "marker": state["fsdp_shard"],
        "plain": all(type(v) is torch.Tensor for v in moments),
        "sizes": sum(v.numel() for v in moments if v.ndim > 0),
    }
    fresh = make_agent(("grpo-fsdp-step", "token-mean"))
    # Before its first step: nothing to save, and saving takes no step of its own.
    unstepped = fresh.parallel.optimizer_state_dict(fresh.optimizer)
    got["unstepped"] = (unstepped["state"], len(fresh.optimizer.state))
    fresh.parallel.load_optimizer_state_dict(fresh.optimizer, state)
    inner = fresh.optimizer.state[fresh.optimizer.param_groups[0]["params"][0]]["exp_avg"]
    got["loaded_as"] = type(inner).__name__
    reloaded = fresh.parallel.optimizer_state_dict(fresh.optimizer)
    got["round_trip"] = reloaded.keys() == state.keys() and all(
        torch.equal(value, reloaded["state"][index][key])
        for index, per_param in state["state"].items()
        for key, value in per_param.items()
    )
    other = {**state, "fsdp_shard": {"rank": 1 - rank, "world_size": 2}}
    whole = {key: value for key, value in state.items() if key != "fsdp_shard"}
    for name, bad in (("other_rank", other), ("whole", whole)):
        try:
            fresh.parallel.load_optimizer_state_dict(fresh.optimizer, bad)
        except ValueError as error:
            got[name] = str(error)
    # A trainable parameter the loss never reaches: refused, not left unreduced.
    agent = make_agent(("grpo", "token-mean"))
    agent.policy.model.register_parameter("unused", torch.nn.Parameter(torch.zeros(3)))
    try:
        gradient_of(agent, full_batch(agent), ("grpo", "token-mean"))
    except ValueError as error:
        results["unused"] = str(error)
    torch.save(results, out / f"rank{rank}.pt")
    shutdown()
