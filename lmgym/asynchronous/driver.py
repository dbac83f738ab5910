"""``AsyncDriver``: one process of an asynchronous run, with an agent's ``learn`` surface.

``AsyncDriver.start`` creates the run's process groups, builds this process's agent
with the factory and checks that every process's agent can run with the others;
``driver.learn(iterations, callback)`` then runs the learner loop (learners) or
the actor loop (actors) and returns the metrics, as ``Agent.learn`` does. So the
``Trainer`` trains a synchronous run and an asynchronous one the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from lmgym.agents.base import Agent, Callback
from lmgym.asynchronous.actor import run_actor
from lmgym.asynchronous.config import AsyncConfig
from lmgym.asynchronous.hooks import AsyncHooks
from lmgym.asynchronous.learner import run_learner
from lmgym.asynchronous.roles import (
    Role,
    Topology,
    build_topology,
    check_handshake,
    describe,
    local_device,
)
from lmgym.asynchronous.staleness import StalenessLedger


class AsyncDriver:
    """This process's part of an asynchronous run (use ``start``).

    Attributes:
        agent: the agent this process built (a learner's holds the trained weights).
        role: this process's role.
    """

    def __init__(
        self, topology: Topology, agent: Agent, infos: list[dict], hooks: AsyncHooks
    ) -> None:
        self.topology, self.agent, self.infos, self.hooks = topology, agent, infos, hooks
        self.role = topology.role

    @classmethod
    def start(
        cls,
        agent_factory: Callable[[Role], Agent],
        config: AsyncConfig,
        *,
        hooks: AsyncHooks | None = None,
        device: str | torch.device = "cpu",
    ) -> AsyncDriver:
        """Join (or create) the process group, build this process's agent, shake hands.

        Raises:
            RuntimeError: not launched with ``actors + learners`` processes.
            ValueError: bad settings, or agents that cannot run together (the same
                error on every rank).
        """
        config.check()
        device = local_device(device)
        if not dist.is_initialized():
            if int(os.environ.get("WORLD_SIZE", "1")) < 2:
                raise RuntimeError(
                    f"run_async needs actors + learners = {config.world_size} processes: launch "
                    f"with torchrun --nproc-per-node {config.world_size} your_script.py"
                )
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=timedelta(seconds=config.timeout_s))
        topology = build_topology(config, device)
        agent = agent_factory(topology.role)
        if not isinstance(agent, Agent):
            raise TypeError(
                "agent_factory must return an lmgym Agent (e.g. GRPO(...)), got "
                f"{type(agent).__name__}"
            )
        infos: list = [None] * dist.get_world_size()
        dist.all_gather_object(infos, describe(agent, topology.role))
        check_handshake(infos, config)
        return cls(topology, agent, infos, hooks if hooks is not None else AsyncHooks())

    def learn(
        self, iterations: int, callback: Callback | Sequence[Callback] | None = None
    ) -> list[dict[str, float]]:
        """Train ``iterations`` updates (learners) or generate until told to stop (actors).

        Args:
            iterations: updates to train (learner 0's callbacks may stop earlier).
            callback: as ``Agent.learn``'s, called on this learner after each update;
                learner 0's ``False`` stops the run. Ignored on actors.

        Returns:
            One metrics dict per update on learners (docs/async.md#metrics); ``[]`` on actors.

        Raises:
            lmgym.asynchronous.PeerLostError: a process died or stopped answering.
        """
        if iterations < 0:
            raise ValueError(f"iterations={iterations}: must be >= 0")
        if not self.role.is_learner:
            run_actor(self.agent, self.topology, self.hooks)
            return []
        config = self.topology.config
        actors = [info for info in self.infos if info["kind"] == "actor"]
        ledger = StalenessLedger(
            [info["num_prompts"] for info in actors],
            self.infos[0]["group_size"],
            config.max_staleness,
            config.stale_policy,
        )
        return run_learner(self.agent, self.topology, ledger, iterations, callback, self.hooks)
