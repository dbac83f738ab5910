"""prepare's reward shaping (agents/prepare.shaped_rewards) against hand-computed arrays."""

from __future__ import annotations

import pytest
import torch

from lmgym.agents.config import AgentConfig
from lmgym.agents.prepare import shaped_rewards
from lmgym.types import RolloutBatch


def two_rows() -> RolloutBatch:
    """Rows of 4 and 2 completion tokens (budget 4), bandit rewards 1 and 2."""
    lengths = torch.tensor([4, 2])
    mask = torch.arange(4)[None, :] < lengths[:, None]
    dones = torch.arange(4)[None, :] == (lengths - 1)[:, None]
    return RolloutBatch(
        prompt_ids=torch.ones(2, 1, dtype=torch.long),
        prompt_mask=torch.ones(2, 1, dtype=torch.bool),
        completion_ids=torch.ones(2, 4, dtype=torch.long),
        completion_mask=mask,
        sampler_logprobs=torch.zeros(2, 4),
        rewards=dones * torch.tensor([[1.0], [2.0]]),
        dones=dones,
        group_ids=torch.tensor([0, 0]),
        prompt_index=torch.tensor([0, 0]),
        lengths=lengths,
        terminated=torch.tensor([False, True]),
        truncated=torch.tensor([True, False]),
        valid=torch.ones(2, dtype=torch.bool),
        special_mass=torch.zeros(2),
    )


def test_overlong_shaping_and_the_kl_in_the_reward_add_up():
    batch = two_rows()
    old_logprobs = torch.full((2, 4), -1.0)
    ref_logprobs = torch.full((2, 4), -1.5)  # k1 = 0.5 on every token
    config = AgentConfig(overlong_cache=2, beta=0.5, kl_placement="reward")
    rewards = shaped_rewards(batch, config, old_logprobs, ref_logprobs)
    # Row 0: length 4 in the window [3, 4]: (2 - 4) / 2 = -1 at its last token; row 1: 0.
    # Every real token then loses beta * k1 = 0.25; padding keeps its 0.
    assert rewards.tolist() == [[-0.25, -0.25, -0.25, -0.25], [-0.25, 1.75, 0.0, 0.0]]
    assert batch.rewards.tolist() == [[0.0, 0.0, 0.0, 1.0], [0.0, 2.0, 0.0, 0.0]]  # unwritten


def test_the_kl_in_the_loss_leaves_the_rewards_alone():
    batch = two_rows()
    config = AgentConfig(beta=0.5, kl_placement="loss")
    assert shaped_rewards(batch, config, None, None) is batch.rewards


@pytest.mark.parametrize("cache", [0, 5])
def test_an_overlong_cache_outside_the_budget_is_refused(cache: int):
    with pytest.raises(
        ValueError, match=rf"overlong_cache={cache}: must be in \[1, max_new_tokens=4\]"
    ):
        shaped_rewards(two_rows(), AgentConfig(overlong_cache=cache), None, None)
