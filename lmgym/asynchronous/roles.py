"""Who does what: ranks, roles, process groups and the start-up handshake.

With ``torchrun`` world size ``L + A``, ranks ``[0, L)`` are learners and
``[L, L + A)`` actors. Groups (every rank creates every group, in this order):

- the learners' group, for their data-parallel update (``Agent(process_group=...)``);
- one single-rank group per actor, so an actor's agent is a one-process agent;
- per actor, a weights group ``{0, actor}`` (the default backend: NCCL moves GPU
  weights directly) and a rollouts group ``{0, actor}`` (gloo: small CPU tensors).

Learner rank 0 is the hub: it receives every rollout, assembles each update's
batch, hands the other learners their share, and publishes the weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist

from lmgym.agents.base import Agent
from lmgym.asynchronous.config import AsyncConfig

RoleKind = Literal["learner", "actor"]


@dataclass(frozen=True)
class Role:
    """What ``agent_factory`` is building an agent for.

    Attributes:
        kind: ``"learner"`` or ``"actor"``.
        index: index among processes of its kind (actor ``index`` may build the
            ``index``-th share of the prompts).
        count: processes of its kind.
        rank: global rank.
        process_group: pass it as ``Agent(..., process_group=role.process_group)``:
            the learners' group, or an actor's own single-rank group.
        device: the device this process should put its model and env on.
    """

    kind: RoleKind
    index: int
    count: int
    rank: int
    process_group: Any
    device: torch.device

    @property
    def is_learner(self) -> bool:
        return self.kind == "learner"


@dataclass
class Topology:
    """Every process group of the run, and this process's role."""

    config: AsyncConfig
    role: Role
    learners_group: Any
    weight_groups: list[Any]
    rollout_groups: list[Any]
    weights_device: torch.device

    def actor_rank(self, actor: int) -> int:
        return self.config.learners + actor


def build_topology(config: AsyncConfig, device: torch.device) -> Topology:
    """Create the run's process groups (collective: every rank calls it).

    Raises:
        ValueError: the world size is not ``actors + learners``.
    """
    world = dist.get_world_size()
    if world != config.world_size:
        raise ValueError(
            f"WORLD_SIZE={world}, but actors={config.actors} + learners={config.learners} = "
            f"{config.world_size}: launch with torchrun --nproc-per-node {config.world_size} "
            "(or change actors/learners)"
        )
    rank, learners, actors = dist.get_rank(), config.learners, config.actors
    timeout = timedelta(seconds=config.timeout_s)  # new groups do not inherit the world's
    learners_group = dist.new_group(list(range(learners)), timeout=timeout)
    actor_groups = [dist.new_group([learners + a], timeout=timeout) for a in range(actors)]
    weight_groups = [dist.new_group([0, learners + a], timeout=timeout) for a in range(actors)]
    rollout_groups = [
        dist.new_group([0, learners + a], timeout=timeout, backend="gloo") for a in range(actors)
    ]
    if rank < learners:
        role = Role("learner", rank, learners, rank, learners_group, device)
    else:
        index = rank - learners
        role = Role("actor", index, actors, rank, actor_groups[index], device)
    weights_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
    return Topology(config, role, learners_group, weight_groups, rollout_groups, weights_device)


def local_device(device: str | torch.device) -> torch.device:
    """``cuda`` becomes this process's GPU (``cuda:LOCAL_RANK``); anything else is kept."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def describe(agent: Agent, role: Role) -> dict[str, Any]:
    """What the handshake compares between ranks (JSON-able)."""
    env, params = agent.env, list(agent.policy.model.parameters())
    return {
        "kind": role.kind,
        "index": role.index,
        "data_parallel_size": agent.group.size,
        "algorithm": agent.name,
        "config": json.loads(json.dumps(dataclasses.asdict(agent.config), default=str)),
        "num_prompts": env.num_prompts,
        "group_size": env.group_size,
        "max_new_tokens": env.max_new_tokens,
        "autoreset": env.autoreset,
        "vocab_size": env.vocab_size,
        "parameter_shapes": [list(p.shape) for p in params],
        "parameter_dtypes": sorted({str(p.dtype) for p in params}),
    }


def check_handshake(infos: list[dict[str, Any]], config: AsyncConfig) -> None:
    """Raise the same ``ValueError`` on every rank if the agents cannot run together.

    Args:
        infos: ``describe`` of every rank, in rank order.
    """
    for info in infos:
        expected = config.learners if info["kind"] == "learner" else 1
        if info["data_parallel_size"] != expected:
            raise ValueError(
                f"agent_factory: the {info['kind']} {info['index']}'s agent spans "
                f"{info['data_parallel_size']} processes, expected {expected}; build it with "
                "Agent(..., process_group=role.process_group)"
            )
    first = infos[0]
    for key in ("algorithm", "config", "group_size", "max_new_tokens", "vocab_size"):
        values = [info[key] for info in infos]
        if any(v != values[0] for v in values):
            if key == "config":
                differ = sorted(
                    k
                    for k in first["config"]
                    if any(i["config"][k] != first["config"][k] for i in infos)
                )
                raise ValueError(
                    f"agent config differs between ranks in {differ}; build every agent with the "
                    "same settings"
                )
            raise ValueError(f"{key} differs between ranks ({values}); build every agent alike")
    for key in ("parameter_shapes", "parameter_dtypes"):
        if any(info[key] != first[key] for info in infos):
            raise ValueError(f"{key} differ between ranks: every process must build the same model")
    actors = [info for info in infos if info["kind"] == "actor"]
    for info in actors:
        if info["autoreset"]:
            raise ValueError(
                f"actor {info['index']}: its env has autoreset=True; an actor refills rows itself "
                "(continuous batching with admission), build its env with autoreset=False"
            )
    if first["config"]["dynamic_sampling"]:
        raise ValueError(
            "dynamic_sampling=True is not supported by run_async (each update's groups are fixed "
            "in advance); set dynamic_sampling=False"
        )
    groups = sum(info["num_prompts"] for info in actors)
    if groups % config.learners:
        raise ValueError(
            f"the actors' num_prompts sum to {groups} groups per update, not divisible by "
            f"learners={config.learners}: every learner trains whole groups; change num_prompts"
        )
    rows = groups // config.learners * first["group_size"]
    minibatches = first["config"]["num_minibatches"]
    if rows % minibatches:
        raise ValueError(
            f"num_minibatches={minibatches} does not divide a learner's {rows} rows per update "
            f"(the actors' num_prompts x group_size / learners); pick a divisor of {rows}"
        )
