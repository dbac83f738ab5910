"""The end of every minibatch (agents/optim.sync_check_step): sum, check, clip, step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmgym.agents.config import AgentConfig
from lmgym.agents.numerics import NonFiniteUpdateError
from lmgym.agents.optim import (
    LearningRateSchedule,
    optim_and_schedule,
    sync_check_step,
    trainable_parameters,
)
from lmgym.agents.records import MicroBatchLoss
from lmgym.distributed import DataParallelGroup


def part(policy_loss: float) -> tuple[torch.Tensor, MicroBatchLoss]:
    """One micro-batch's rows and loss; only its terms matter here."""
    one = torch.zeros(1, 1)
    terms = {"policy_loss": torch.tensor(policy_loss), "value_loss": torch.tensor(0.5)}
    return torch.tensor([0]), MicroBatchLoss(one.sum(), terms, one, None, None, one, one)


def setup(grad: list[float]) -> tuple[nn.Parameter, torch.optim.Optimizer, LearningRateSchedule]:
    weight = nn.Parameter(torch.zeros(2))
    weight.grad = torch.tensor(grad)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    return weight, optimizer, LearningRateSchedule(optimizer, AgentConfig())


def test_terms_are_summed_and_the_gradient_clipped_before_one_step():
    weight, optimizer, schedule = setup([3.0, 4.0])
    config = AgentConfig(max_grad_norm=1.0)
    parts = [part(1.0), part(2.0)]
    terms, norm = sync_check_step(parts, optimizer, schedule, DataParallelGroup(), config, "here")
    assert terms == {"policy_loss": 3.0, "value_loss": 1.0}
    assert norm == 5.0  # before clipping
    assert weight.tolist() == pytest.approx([-0.06, -0.08])  # 0.1 * [3, 4] / 5


def test_a_non_finite_term_stops_the_step_and_names_itself():
    weight, optimizer, schedule = setup([3.0, 4.0])
    with pytest.raises(NonFiniteUpdateError, match="policy_loss is nan at iteration 2"):
        sync_check_step(
            [part(float("nan"))],
            optimizer,
            schedule,
            DataParallelGroup(),
            AgentConfig(),
            "iteration 2",
        )
    assert weight.tolist() == [0.0, 0.0]


def test_optim_and_schedule_builds_adamw_over_the_trainable_parameters(policy):
    config = AgentConfig(learning_rate=3e-4, weight_decay=0.1)
    optimizer, schedule = optim_and_schedule(trainable_parameters(policy, None), config)
    assert isinstance(optimizer, torch.optim.AdamW)
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    grouped = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(grouped) == len(trainable)
    assert {id(p) for p in grouped} == {id(p) for p in trainable}
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert schedule.optimizer is optimizer and schedule.scheduler is None  # constant lr
