"""``run_async``: the one entry point every ``torchrun`` process of an async run calls."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from lmgym.agents.base import Agent, Callback
from lmgym.asynchronous.actor import run_actor
from lmgym.asynchronous.config import AsyncConfig
from lmgym.asynchronous.hooks import AsyncHooks
from lmgym.asynchronous.learner import run_learner
from lmgym.asynchronous.roles import Role, build_topology, check_handshake, describe, local_device
from lmgym.asynchronous.staleness import StalenessLedger


@dataclass
class AsyncRun:
    """What ``run_async`` returns in each process.

    Attributes:
        role: this process's role.
        agent: the agent it built (a learner's holds the trained weights).
        history: one metrics dict per update on learners (docs/async.md#metrics);
            empty on actors.
    """

    role: Role
    agent: Agent
    history: list[dict[str, float]] = field(default_factory=list)


def run_async(
    agent_factory: Callable[[Role], Agent],
    iterations: int,
    config: AsyncConfig | None = None,
    *,
    callback: Callback | Sequence[Callback] | None = None,
    hooks: AsyncHooks | None = None,
    device: str | torch.device = "cpu",
) -> AsyncRun:
    """Train with actors and learners in separate processes (docs/async.md).

    Call it in every process of ``torchrun --nproc-per-node A+L``: ranks
    ``[0, L)`` learn, ranks ``[L, L + A)`` act. Each process builds its agent with
    ``agent_factory(role)``, which must pass ``process_group=role.process_group``
    to the agent and give an actor an episode-synchronous env (``autoreset=False``)
    holding its share of the prompts; the agents themselves do not change.

    Args:
        agent_factory: builds this process's agent for its ``Role``.
        iterations: updates to train (callbacks may stop earlier).
        config: actors, learners, ``max_staleness`` and the rest (default ``AsyncConfig()``).
        callback: ``callback(agent, metrics)`` after each update on every learner, or a
            list of them; learner 0's ``False`` stops the run. Objects with
            ``on_learn_start``/``on_learn_end`` get those calls too.
        hooks: test hooks into the loops.
        device: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL; each process uses
            ``cuda:LOCAL_RANK``), also passed to the factory as ``role.device``.

    Returns:
        This process's ``AsyncRun``.

    Raises:
        ValueError: bad settings, or agents that cannot run together (the same
            error on every rank).
        lmgym.asynchronous.PeerLostError: a process died or stopped answering; the
            run ends (a dead actor is not replaced).
    """
    config = config if config is not None else AsyncConfig()
    config.check()
    if iterations < 0:
        raise ValueError(f"iterations={iterations}: must be >= 0")
    callbacks = [] if callback is None else [callback] if callable(callback) else list(callback)
    device = local_device(device)
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) < 2:
            raise RuntimeError(
                f"run_async needs actors + learners = {config.world_size} processes: launch with "
                f"torchrun --nproc-per-node {config.world_size} your_script.py"
            )
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=config.timeout_s))
    topology = build_topology(config, device)
    agent = agent_factory(topology.role)
    if not isinstance(agent, Agent):
        raise TypeError(
            f"agent_factory must return an lmgym Agent (e.g. GRPO(...)), got {type(agent).__name__}"
        )
    infos: list = [None] * dist.get_world_size()
    dist.all_gather_object(infos, describe(agent, topology.role))
    check_handshake(infos, config)
    hooks = hooks if hooks is not None else AsyncHooks()
    if not topology.role.is_learner:
        run_actor(agent, topology, hooks)
        return AsyncRun(topology.role, agent)
    actors = [info for info in infos if info["kind"] == "actor"]
    ledger = StalenessLedger(
        [info["num_prompts"] for info in actors],
        infos[0]["group_size"],
        config.max_staleness,
        config.stale_policy,
    )
    history = run_learner(agent, topology, ledger, iterations, callbacks, hooks)
    return AsyncRun(topology.role, agent, history)
