"""GAE and returns-to-go over a multi-turn row's policy tokens: observation tokens are
skipped, not discounted as steps (docs/algorithms.md#turn-credit). The value at a
policy token bootstraps from the value at the next *policy* token, and ``gamma``
applies once per policy token."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from lmgym.agents import PPO, REINFORCE, VAPO
from lmgym.agents.advantages import discounted_returns, gae

# One row: P0 P1 | O O | P2 P3, padding. Turn 1's reward (1.0) at P1, turn 2's (2.0) at P3.
POLICY = torch.tensor([[1, 1, 0, 0, 1, 1, 0]], dtype=torch.bool)
REAL = torch.tensor([[1, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
REWARDS = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0]], dtype=torch.float64)
# The critic's values at observation tokens are garbage the estimate must not read.
VALUES = torch.tensor([[0.5, 0.4, 9.0, -9.0, 0.3, 0.2, 7.0]], dtype=torch.float64)
DONES = torch.tensor([[0, 0, 0, 0, 0, 1, 0]], dtype=torch.bool)


def test_gae_over_policy_tokens_equals_the_hand_computed_value():
    gamma, lam = 0.9, 0.8
    # Over the policy tokens r = [0, 1, 0, 2], V = [0.5, 0.4, 0.3, 0.2]:
    # d3 = 2 - 0.2 = 1.8                 A3 = 1.8
    # d2 = 0.9 * 0.2 - 0.3 = -0.12       A2 = -0.12 + 0.72 * 1.8 = 1.176
    # d1 = 1 + 0.9 * 0.3 - 0.4 = 0.87    A1 = 0.87 + 0.72 * 1.176 = 1.71672
    # d0 = 0.9 * 0.4 - 0.5 = -0.14       A0 = -0.14 + 0.72 * 1.71672 = 1.0960384
    advantages, returns = gae(REWARDS, VALUES, DONES, POLICY, gamma, lam)
    expected = torch.tensor([[1.0960384, 1.71672, 0.0, 0.0, 1.176, 1.8, 0.0]], dtype=torch.float64)
    assert_close(advantages, expected)
    values = torch.where(POLICY, VALUES, 0.0)
    assert_close(returns, torch.where(POLICY, expected + values, 0.0))


def test_returns_to_go_discount_once_per_policy_token():
    # gamma = 0.5 over r = [0, 1, 0, 2]: G = [0.5 * 1 + 0.125 * 2, 1 + 0.25 * 2, 0.5 * 2, 2].
    returns = discounted_returns(REWARDS, POLICY, 0.5, DONES)
    expected = torch.tensor([[0.75, 1.5, 0.0, 0.0, 1.0, 2.0, 0.0]], dtype=torch.float64)
    assert_close(returns, expected)


def compact(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's masked entries moved, in order, to its front (a stable sort)."""
    order = torch.sort((~mask).to(torch.uint8), dim=1, stable=True).indices
    return x.gather(1, order), mask.gather(1, order)


def random_turns(rows: int, width: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Random multi-turn rows: runs of policy tokens separated by observations."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(width // 2, width + 1, (rows,), generator=gen)
    real = torch.arange(width)[None, :] < lengths[:, None]
    policy = real & (torch.rand(rows, width, generator=gen) < 0.6)
    last = torch.arange(width)[None, :] == (lengths - 1)[:, None]
    policy = policy | last  # an episode ends on a policy token
    rewards = torch.randn(rows, width, generator=gen) * policy
    values = torch.randn(rows, width, generator=gen)
    return policy, real, rewards, values, last


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_over_interleaved_rows_equals_gae_over_the_policy_tokens_alone(seed):
    policy, _, rewards, values, last = random_turns(8, 20, seed)
    advantages, returns = gae(rewards, values, last, policy, 0.97, 0.9)
    # The same rows with the observation tokens removed (policy tokens packed first).
    r, m = compact(rewards, policy)
    v, _ = compact(values, policy)
    d, _ = compact(last & policy, policy)
    packed_advantages, packed_returns = gae(r, v, d, m, 0.97, 0.9)
    assert_close(advantages[policy], packed_advantages[m])
    assert_close(returns[policy], packed_returns[m])
    assert not advantages[~policy].any() and not returns[~policy].any()


def agent_batch(policy: torch.Tensor, real: torch.Tensor, last: torch.Tensor) -> SimpleNamespace:
    """What the agents' ``advantages`` read of a batch."""
    return SimpleNamespace(
        dones=last, lengths=real.sum(1), policy_mask=policy, group_ids=torch.zeros(len(real))
    )


@pytest.mark.parametrize("agent_class", [PPO, VAPO])
def test_critic_agents_skip_observation_tokens(make_env, policy, agent_class):
    # VAPO's length-adaptive lambda counts policy tokens: the packed rows agree with it.
    mask, real, rewards, values, last = random_turns(4, 16, seed=3)
    extra = {"value_warmup_iterations": 0, "length_alpha": 0.2} if agent_class is VAPO else {}
    agent = agent_class(policy, make_env(num_prompts=2, group_size=2), **extra)
    advantages, returns = agent.advantages(agent_batch(mask, real, last), rewards, mask, values)
    r, m = compact(rewards, mask)
    v, _ = compact(values, mask)
    d, _ = compact(last, mask)
    packed = agent.advantages(agent_batch(m, m, d), r, m, v)
    assert_close(advantages[mask], packed[0][m])
    assert_close(returns[mask], packed[1][m])


def test_reinforce_credits_each_turn_with_the_rewards_at_and_after_it(make_env, policy):
    agent = REINFORCE(policy, make_env(num_prompts=2, group_size=2), baseline="none", gamma=1.0)
    advantages, _ = agent.advantages(agent_batch(POLICY, REAL, DONES), REWARDS, POLICY, None)
    # Turn 1's tokens: 1 + 2; turn 2's: 2; observation tokens and padding: 0.
    assert advantages.tolist() == [[3.0, 3.0, 0.0, 0.0, 2.0, 2.0, 0.0]]
