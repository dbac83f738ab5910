"""``run_async``: the one entry point every ``torchrun`` process of an async run calls."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from lmgym.agents.base import Agent, Callback
from lmgym.asynchronous.config import AsyncConfig
from lmgym.asynchronous.driver import AsyncDriver
from lmgym.asynchronous.hooks import AsyncHooks
from lmgym.asynchronous.roles import Role


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
    driver = AsyncDriver.start(agent_factory, config, hooks=hooks, device=device)
    history = driver.learn(iterations, callback)
    return AsyncRun(driver.role, driver.agent, history)
