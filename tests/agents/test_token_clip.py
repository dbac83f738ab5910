"""The TokenClip mixin: each agent's policy_loss is its clip rule over its own config fields."""

from __future__ import annotations

import math

import pytest
import torch

from lmgym.agents import CISPO, GRPO, PPO, REINFORCEPP, RLOO, DualClipPPO, ReMax

# Two tokens: rho = 1.5 with A = +1, rho = 0.5 with A = -1; bounds 0.1 below, 0.3 above.
LOGPROBS = [[math.log(1.5), math.log(0.5)]]
ADVANTAGES = [[1.0, -1.0]]
TOKEN_CLIP = ([-1.3, 0.9], [0.0, 0.0])  # max(-A rho, -A clip(rho, 0.9, 1.3)): both clipped
CISPO_RULE = ([-1.3 * math.log(1.5), 0.9 * math.log(0.5)], [-1.3, 0.9])  # -w A lp; -w A


@pytest.mark.parametrize(
    ("agent_class", "bounds", "expected"),
    [
        (PPO, {"clip_low": 0.1, "clip_high": 0.3}, TOKEN_CLIP),
        (GRPO, {"clip_low": 0.1, "clip_high": 0.3}, TOKEN_CLIP),
        (REINFORCEPP, {"clip_low": 0.1, "clip_high": 0.3}, TOKEN_CLIP),
        (RLOO, {"clip_low": 0.1, "clip_high": 0.3}, TOKEN_CLIP),
        (ReMax, {"clip_low": 0.1, "clip_high": 0.3}, TOKEN_CLIP),
        (CISPO, {"weight_low": 0.1, "weight_high": 0.3}, CISPO_RULE),  # clip_low/high: 0.2
        # A = -1, rho = 0.5 is under c = 1.2: the token clip's loss, unbounded.
        (DualClipPPO, {"clip_low": 0.1, "clip_high": 0.3, "dual_clip_c": 1.2}, TOKEN_CLIP),
    ],
)
def test_policy_loss_is_the_agents_rule_over_its_own_bounds(
    make_env, policy, agent_class, bounds, expected
):
    agent = agent_class(policy, make_env(num_prompts=2, group_size=2), **bounds)
    logprobs = torch.tensor(LOGPROBS, requires_grad=True)
    loss, ratio = agent.policy_loss(logprobs, torch.zeros(1, 2), torch.tensor(ADVANTAGES), None)
    (grad,) = torch.autograd.grad(loss.sum(), logprobs)
    assert loss.tolist()[0] == pytest.approx(expected[0])
    assert grad.tolist()[0] == pytest.approx(expected[1])
    assert ratio.tolist()[0] == pytest.approx([1.5, 0.5])
    assert agent.clip_range() == (0.1, 0.3)


@pytest.mark.parametrize("agent_class", [RLOO, ReMax])
def test_at_one_step_the_clip_is_the_papers_policy_gradient(make_env, policy, agent_class):
    # lp_old = lp (one epoch, one minibatch): rho = 1 lies inside the interval, so the
    # gradient is RLOO's and ReMax's one-step -A per token, whatever the bounds.
    agent = agent_class(policy, make_env(num_prompts=2, group_size=2), clip_low=0.1)
    logprobs = torch.tensor([[-0.7, -2.0, -0.1]], requires_grad=True)
    advantages = torch.tensor([[0.5, -1.5, 2.0]])
    loss, ratio = agent.policy_loss(logprobs, logprobs.detach(), advantages, None)
    (grad,) = torch.autograd.grad(loss.sum(), logprobs)
    assert grad.tolist()[0] == pytest.approx([-0.5, 1.5, -2.0])
    assert ratio.tolist()[0] == pytest.approx([1.0, 1.0, 1.0])


@pytest.mark.parametrize(("agent_class", "field"), [(RLOO, "clip_low"), (ReMax, "clip_high")])
def test_rloo_and_remax_check_their_clip_bounds(make_env, policy, agent_class, field):
    with pytest.raises(ValueError, match=f"{field}=-0.1"):
        agent_class(policy, make_env(num_prompts=2, group_size=2), **{field: -0.1})


def test_dual_clip_ppo_bounds_a_negative_advantage_past_c(make_env, policy):
    agent = DualClipPPO(policy, make_env(num_prompts=2, group_size=2), dual_clip_c=1.2)
    logprobs = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, _ = agent.policy_loss(logprobs, torch.zeros(1, 1), torch.tensor([[-1.0]]), None)
    (grad,) = torch.autograd.grad(loss.sum(), logprobs)
    assert loss.item() == pytest.approx(1.2)  # min(max(1.5, 1.2), c * 1)
    assert grad.item() == 0.0


def test_cispo_checks_its_weight_bounds_by_their_names(make_env, policy):
    with pytest.raises(ValueError, match="weight_low=1.5: must be <= 1"):
        CISPO(policy, make_env(num_prompts=2, group_size=2), weight_low=1.5)
