"""The actor loop: sample with the newest weights, stream finished groups to the hub.

Each turn: pick up any new weights (``in_flight``: now, between two decode steps;
``row_boundary``: once no row is in flight, starting no row meanwhile), admit
rows (under ``"wait"``, only rows whose update is at most ``k`` versions ahead of
the weights held: slot ``s`` belongs to update ``s // (P G)``), take one decode
step, send the groups that finished. With nothing to step the actor waits for
weights; that wait is its idle time.
"""

from __future__ import annotations

import queue
import time

import torch

from lmgym.agents.base import Agent
from lmgym.asynchronous.channels import Inbox, Message, Outbox, get_message
from lmgym.asynchronous.config import AsyncConfig
from lmgym.asynchronous.hooks import AsyncHooks
from lmgym.asynchronous.roles import Topology
from lmgym.asynchronous.sampler import AdmissionCollector
from lmgym.asynchronous.transport import VersionedRollout, load_weights, pack

SEED_STRIDE = 7919
"""Actor ``a`` seeds its sampler and prompt stream with ``seed + 7919 a`` (actor 0 as one process)."""

HUB = "learner 0 (rank 0)"


def admission_budget(
    config: AsyncConfig, version: int, rows_per_update: int, next_slot: int
) -> int | None:
    """Rows the actor may start now, holding weights ``version``.

    Under ``"wait"``, slot ``s`` is trained by update ``s // rows_per_update``, which
    may be at most ``max_staleness`` versions ahead of the weights that sample its
    first token. ``"drop"`` admits without limit (``None``).
    """
    if config.stale_policy == "drop":
        return None
    return (version + config.max_staleness + 1) * rows_per_update - next_slot


class _Weights:
    """The newest weights message from the hub, polled between steps."""

    def __init__(self, topology: Topology) -> None:
        actor = topology.role.index
        self.queue: queue.Queue = queue.Queue()
        self.inbox = Inbox(
            0, topology.weight_groups[actor], topology.weights_device, self.queue, 0, HUB
        )
        self.timeout_s = topology.config.timeout_s

    def latest(self, block: bool) -> Message | None:
        """The newest message waiting (``block``: wait for one); an end message wins."""
        newest = None
        got = get_message(self.queue, self.timeout_s if block else 0, "new weights from " + HUB)
        while got is not None:
            newest = got[1]
            if newest.end:
                return newest
            got = get_message(self.queue, 0, "")
        return newest


def run_actor(agent: Agent, topology: Topology, hooks: AsyncHooks) -> None:
    """Generate for ``agent`` (an actor's agent) until the hub says stop."""
    config, actor = topology.config, topology.role.index
    seed = agent.config.seed + SEED_STRIDE * actor
    agent.generator.manual_seed(seed)
    collector = AdmissionCollector(agent.env, agent.policy, agent.generator, seed)
    rows_per_update = agent.env.num_envs
    weights = _Weights(topology)
    rollouts = Outbox(
        0, topology.rollout_groups[actor], torch.device("cpu"), HUB, latest_only=False
    )
    start = time.perf_counter()
    idle = 0.0
    first = weights.latest(block=True)
    if first is None or first.end:
        rollouts.close(config.timeout_s)
        return
    load_weights(agent.policy.model, first.tensors[0])
    version = first.ints[0]
    pending: Message | None = None
    steps = sent = 0
    while True:
        message = weights.latest(block=False)
        if message is not None and message.end:
            break
        pending = message or pending
        if pending is not None and (config.weight_sync == "in_flight" or collector.num_live == 0):
            load_weights(agent.policy.model, pending.tensors[0])
            version, pending = pending.ints[0], None
            if not config.keep_kv_cache:
                collector.drop_cache()
        if pending is None:
            collector.admit(admission_budget(config, version, rows_per_update, collector.next_slot))
        if collector.num_live == 0:  # nothing admissible: wait for newer weights
            if hooks.actor_wait is not None:
                hooks.actor_wait(actor, version)
            waited = time.perf_counter()
            message = weights.latest(block=True)
            idle += time.perf_counter() - waited
            if message is not None and message.end:
                break
            pending = message or pending
            continue
        collector.step(version)
        steps += 1
        if hooks.actor_step is not None:
            hooks.actor_step(actor, steps)
        groups = collector.take_groups()
        if groups is not None:
            elapsed = time.perf_counter() - start
            rollouts.put(_rollout_message(groups, actor, idle, elapsed))
            sent += 1
            if hooks.actor_sent is not None:
                hooks.actor_sent(actor, sent)
    agent.tokens_generated = collector.tokens_generated
    rollouts.close(config.timeout_s)


def _rollout_message(
    groups: VersionedRollout, actor: int, idle_s: float, elapsed_s: float
) -> Message:
    ints, floats = pack(groups)
    width = groups.batch.prompt_ids.shape[1]
    return Message(
        [actor, width, int(idle_s * 1e6), int(elapsed_s * 1e6)], [ints.cpu(), floats.cpu()]
    )
