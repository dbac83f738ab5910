"""The learner loop: take each update's groups, train, publish the new weights.

Learner rank 0 is the hub: it receives every actor's groups (one inbox thread per
actor), assembles update ``u``'s batch with the ``StalenessLedger``, broadcasts it
to the other learners, and after the update sends version ``u + 1`` to every actor
(newest only: an actor that has not taken the previous version gets this one
instead). Every learner trains on its share of the groups with its agent's own
``train_on_batch``: the data-parallel update of ``lmgym.distributed``.

The corrections are the agent's (docs/algorithms.md#tis): it recomputes
``lp_old`` on the learner when ``recompute_old_logprobs`` asks, so the policy ratio
``exp(lp - lp_old)`` carries the drift within the update and TIS
``min(exp(lp_old - lp_s), C)`` the staleness and the sampler/KV-cache mismatch.
The loop adds the statistics of the uncapped ``exp(lp_old - lp_s)``, the version lag
of the trained tokens, the rows dropped and the idle times to the metrics.
"""

from __future__ import annotations

import math
import queue
import time
import warnings
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from lmgym.agents.base import Agent, Callback
from lmgym.agents.callbacks import LearnCallbacks
from lmgym.agents.records import Counts, LossModules, MicroBatchLoss, PreparedBatch
from lmgym.asynchronous.channels import Inbox, Message, Outbox, PeerLostError, get_message
from lmgym.asynchronous.control import Control, broadcast_control
from lmgym.asynchronous.hooks import AsyncHooks
from lmgym.asynchronous.roles import Topology
from lmgym.asynchronous.staleness import StalenessLedger, UpdateBatch, staleness_stats
from lmgym.asynchronous.transport import VersionedRollout, flatten_weights, pack, unpack


class SamplerRatioProbe:
    """Statistics of ``exp(lp_old - lp_s)`` over an update's loss tokens (uncapped).

    The agent computes ``lp_old`` inside its update (recomputed, or the update's own
    first forward pass); the probe reads it from each micro-batch's loss record by
    shadowing ``agent.micro_batch_loss`` on the instance, so no extra forward pass
    is spent. Every epoch sees each token once with the same ``lp_old``, so the mean,
    min and max over all micro-batches are those of one epoch.
    """

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._original = agent.micro_batch_loss
        agent.micro_batch_loss = self._probed  # type: ignore[method-assign]
        self.reset()

    def reset(self) -> None:
        self._sum, self._count = 0.0, 0.0
        self._min, self._max = math.inf, -math.inf

    def _probed(self, data: PreparedBatch, counts: Counts, modules: LossModules) -> MicroBatchLoss:
        loss = self._original(data, counts, modules)
        log_ratio = (loss.old_logprobs.detach() - data.sampler_logprobs)[data.mask]
        if log_ratio.numel():
            ratio = log_ratio.double().clamp(-20.0, 20.0).exp()
            self._sum += float(ratio.sum())
            self._count += ratio.numel()
            self._min = min(self._min, float(ratio.min()))
            self._max = max(self._max, float(ratio.max()))
        return loss

    def stats(self) -> dict[str, float]:
        """``sampler_ratio_mean/min/max`` over every learner's tokens (empty without tokens)."""
        group, device = self.agent.group, self.agent.policy.device
        exact = {"dtype": torch.float64, "device": device}
        totals = group.all_reduce_sum(torch.tensor([self._sum, self._count], **exact))
        low = group.all_reduce_min(torch.tensor([self._min, -self._max], **exact))
        if float(totals[1]) == 0:
            return {}
        return {
            "sampler_ratio_mean": float(totals[0] / totals[1]),
            "sampler_ratio_min": float(low[0]),
            "sampler_ratio_max": -float(low[1]),
        }

    def close(self) -> None:
        del self.agent.micro_batch_loss  # the class's method again


class Hub:
    """Learner rank 0's channels: rollouts in from every actor, weights out to each."""

    def __init__(self, topology: Topology, ledger: StalenessLedger) -> None:
        self.topology, self.ledger = topology, ledger
        self.config = topology.config
        self.queue: queue.Queue = queue.Queue()
        self.names = [
            f"actor {a} (rank {topology.actor_rank(a)})" for a in range(self.config.actors)
        ]
        self.inboxes = [
            Inbox(
                topology.actor_rank(a),
                topology.rollout_groups[a],
                torch.device("cpu"),
                self.queue,
                a,
                self.names[a],
            )
            for a in range(self.config.actors)
        ]
        self.outboxes = [
            Outbox(
                topology.actor_rank(a),
                topology.weight_groups[a],
                topology.weights_device,
                self.names[a],
                latest_only=True,
            )
            for a in range(self.config.actors)
        ]
        self.actor_clock = [(0.0, 0.0)] * self.config.actors  # (idle s, elapsed s)
        self._ended: set[int] = set()
        self._closing = False

    def publish(self, model: torch.nn.Module, version: int) -> None:
        flat = flatten_weights(model, self.topology.weights_device)
        for outbox in self.outboxes:
            outbox.put(Message([version], [flat]))

    def next_batch(self, update: int) -> tuple[UpdateBatch, float]:
        """Update ``update``'s batch, waiting for rollouts as long as needed.

        Returns:
            ``(batch, seconds waited)``.
        """
        start = time.perf_counter()
        while True:
            got = get_message(self.queue, 0, "")
            while got is not None:
                self._file(*got)
                got = get_message(self.queue, 0, "")
            batch = self.ledger.take(update)
            if batch is not None:
                return batch, time.perf_counter() - start
            got = get_message(self.queue, self.config.timeout_s, "rollout from any actor")
            assert got is not None  # None only for a timeout of 0
            self._file(*got)

    def _file(self, actor: int, message: Message) -> None:
        if message.end:
            self._ended.add(actor)
            if not self._closing:
                raise PeerLostError(f"{self.names[actor]} ended before the run did")
            return
        _, width, idle_us, elapsed_us = message.ints[:4]
        self.actor_clock[actor] = (idle_us / 1e6, elapsed_us / 1e6)
        ints, floats = message.tensors
        self.ledger.add(actor, unpack(ints, floats, prompt_width=width))

    def actor_idle_fraction(self) -> float:
        idle = sum(i for i, _ in self.actor_clock)
        elapsed = sum(e for _, e in self.actor_clock)
        return idle / elapsed if elapsed > 0 else 0.0

    def shutdown(self) -> None:
        """Tell every actor to stop, and take (and discard) what they still send."""
        self._closing = True
        timeout = self.config.timeout_s
        for outbox in self.outboxes:
            outbox.close(timeout)
        while len(self._ended) < self.config.actors:
            got = get_message(self.queue, timeout, "the actors' last messages")
            assert got is not None  # None only for a timeout of 0
            actor, message = got
            if message.end:
                self._ended.add(actor)
        for inbox in self.inboxes:
            inbox.thread.join(timeout)


def _broadcast(tensor: Tensor, topology: Topology) -> Tensor:
    if topology.config.learners > 1:
        dist.broadcast(tensor, src=0, group=topology.learners_group)
    return tensor


def _share(rollout: VersionedRollout, topology: Topology) -> VersionedRollout:
    """This learner's contiguous share of whole groups (rows ordered by group)."""
    learners, index = topology.config.learners, topology.role.index
    rows = rollout.batch.batch_size // learners
    return rollout.select(torch.arange(index * rows, (index + 1) * rows))


def run_learner(
    agent: Agent,
    topology: Topology,
    ledger: StalenessLedger,
    iterations: int,
    callbacks: Callback | Sequence[Callback] | None,
    hooks: AsyncHooks,
) -> list[dict[str, float]]:
    """Train ``iterations`` updates (fewer if a callback stops); every learner calls it.

    The callbacks are driven as ``Agent.learn`` drives them (``LearnCallbacks``): learner
    0's ``False`` stops every learner and actor after that update.
    """
    hub = Hub(topology, ledger) if topology.role.index == 0 else None
    if hub is not None and topology.config.max_staleness > 0 and agent.config.tis_cap is None:
        warnings.warn(
            f"max_staleness={topology.config.max_staleness} with tis_cap=None: stale and "
            "cache-mismatched tokens are trained without the learner-sampler correction; set "
            "tis_cap (e.g. 2.0), docs/async.md#corrections",
            stacklevel=3,
        )
    probe = SamplerRatioProbe(agent)
    stop = iterations == 0
    try:
        with LearnCallbacks(agent, callbacks, iterations, progress_bar=False) as learn:
            if hub is not None:
                hub.publish(agent.policy.model, 0)
            for update in range(iterations + 1):
                done = _one_update(agent, topology, hub, probe, update, stop)
                if done is None:
                    break
                metrics, group_ids = done
                if hooks.learner_update is not None:
                    hooks.learner_update(update, group_ids)
                stop = not learn.after(metrics) or update + 1 >= iterations
                if hub is not None and not stop:
                    hub.publish(agent.policy.model, update + 1)
            if hub is not None:
                hub.shutdown()
    finally:
        probe.close()
    return learn.history


def _hub_control(hub: Hub, update: int, topology: Topology) -> tuple[Control, VersionedRollout]:
    """Learner 0: assemble update ``update``'s batch, broadcast its control record and data."""
    batch, waited = hub.next_batch(update)
    ints, floats = pack(batch.rollout)
    control = broadcast_control(
        Control(
            update=update,
            rows=ints.shape[0],
            int_cols=ints.shape[1],
            float_cols=floats.shape[1],
            prompt_width=batch.rollout.batch.prompt_ids.shape[1],
            rows_dropped=batch.rows_dropped,
            tokens_received=batch.tokens_received,
            learner_idle_us=int(waited * 1e6),
            actor_idle_ppm=int(hub.actor_idle_fraction() * 1e6),
            actor_idle_us=int(sum(idle for idle, _ in hub.actor_clock) * 1e6),
        ),
        topology,
    )
    _broadcast(ints.to(topology.weights_device), topology)
    _broadcast(floats.to(topology.weights_device), topology)
    return control, batch.rollout


def _received_batch(control: Control, topology: Topology) -> VersionedRollout:
    """The other learners: the batch ``control`` announced, from learner 0."""
    device = topology.weights_device
    ints = torch.empty(control.rows, control.int_cols, dtype=torch.int64, device=device)
    floats = torch.empty(control.rows, control.float_cols, device=device)
    ints, floats = _broadcast(ints, topology), _broadcast(floats, topology)
    return unpack(ints.cpu(), floats.cpu(), control.prompt_width)


def _one_update(
    agent: Agent,
    topology: Topology,
    hub: Hub | None,
    probe: SamplerRatioProbe,
    update: int,
    stop: bool,
) -> tuple[dict[str, float], Tensor] | None:
    """Update ``update`` on every learner, or ``None`` when learner 0 says stop.

    Returns:
        ``(metrics, [n] int64 global ids of the groups this learner trained)``.
    """
    if hub is not None:
        if stop:
            broadcast_control(Control(stop=1), topology)
            return None
        control, rollout = _hub_control(hub, update, topology)
    else:
        control = broadcast_control(None, topology)
        if control.stop:
            return None
        rollout = _received_batch(control, topology)
    mine = _share(rollout, topology)
    probe.reset()
    start = time.perf_counter()
    metrics = agent.train_on_batch(mine.batch)
    agent.count_update(control.tokens_received)
    metrics.update(agent.counters())
    metrics.update(probe.stats())
    metrics.update(staleness_stats(rollout, update))
    metrics["stale_rows_dropped"] = float(control.rows_dropped)
    metrics["learner_idle_s"] = control.learner_idle_us / 1e6
    metrics["update_s"] = time.perf_counter() - start
    metrics["actor_idle_fraction"] = control.actor_idle_ppm / 1e6
    metrics["actor_idle_s"] = control.actor_idle_us / 1e6
    return metrics, mine.batch.group_ids.unique()
