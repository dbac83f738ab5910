"""Cases shared by the data-parallel worker and its test (imported by both)."""

from __future__ import annotations

import dataclasses

import torch

from lmgym.agents import ALGORITHMS, GSPO
from lmgym.agents.aggregation import AGGREGATION_MODES
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.rollout import collect
from lmgym.types import RolloutBatch

ROWS, GROUP = 12, 4
SCORES = [1.0, 0.0, 2.0, 0.5, 3.0, 1.0, 1.0, 0.0, 0.7, 0.7, 0.7, 0.7]  # group 3 is flat
MASKED = [9, 10]  # rows of the last group (rank 1's): fewer valid tokens there

CASES: list[tuple[str, str]] = [
    (name, aggregation)
    for name, agent_class in ALGORITHMS.items()
    for aggregation in (
        ["seq-mean-token-mean"] if issubclass(agent_class, GSPO) else AGGREGATION_MODES
    )
]


def make_agent(case: tuple[str, str]):
    name, aggregation = case
    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    env = make_target_string_vector(
        tokenizer=tokenizer, num_envs=ROWS, group_size=GROUP, max_new_tokens=6
    )
    agent_class = ALGORITHMS[name]
    # One epoch, one minibatch: the single process's shuffled minibatches have no
    # two-rank counterpart; a batch-wide statistic (whitening) everywhere it applies.
    config = {
        "loss_aggregation": aggregation,
        "max_grad_norm": None,
        "entropy_coef": 0.01,
        "num_minibatches": 1,
        "update_epochs": 1,
        "whiten_advantages": True,
    }
    return agent_class(policy, env, **config)


def full_batch(agent) -> RolloutBatch:
    batch = collect(agent.env, agent.policy, seed=3)
    rewards = batch.dones.float() * torch.tensor(SCORES)[:, None]
    valid = torch.ones(ROWS, dtype=torch.bool)
    valid[MASKED] = False
    return dataclasses.replace(batch, rewards=rewards, valid=valid)


def gradient_of(agent, batch: RolloutBatch) -> dict:
    agent.optimizer.step = lambda *a, **k: None
    metrics = agent.train_on_batch(batch)
    params = [p for g in agent.optimizer.param_groups for p in g["params"]]
    grad = torch.cat([p.grad.flatten() for p in params if p.grad is not None])
    return {"grad": grad, "metrics": metrics}
