"""Dual-clip PPO: PPO whose per-token loss is capped at -c*A for A < 0."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from lmgym.agents import PPO, DualClipPPO
from lmgym.agents.aggregation import aggregate
from lmgym.agents.records import Counts
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.rollout import collect

SCORES = [1.0, 0.0, 2.0, 0.5, 3.0, 1.0, 1.0, 0.0]
SINGLE_PASS = {"update_epochs": 1, "num_minibatches": 1, "value_model": "separate"}


def fresh_policy(seed: int = 0) -> CausalLMPolicy:
    tokenizer = make_char_tokenizer()
    return CausalLMPolicy(make_tiny_model(len(tokenizer), seed=seed), tokenizer)


def env_for(policy: CausalLMPolicy):
    return make_target_string_vector(
        tokenizer=policy.tokenizer, num_envs=8, group_size=2, max_new_tokens=6
    )


def policy_gradient(agent, data) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy's gradient of one micro-batch loss (the critic is a separate model)."""
    agent.optimizer.zero_grad(set_to_none=True)
    loss = agent.micro_batch_loss(data, Counts.of(data.mask), agent.parallel.modules)
    loss.total.backward()
    grads = [
        torch.zeros_like(p).flatten() if p.grad is None else p.grad.flatten()
        for p in agent.policy.model.parameters()
    ]
    return torch.cat(grads), {name: float(term) for name, term in loss.terms.items()}


def test_every_token_past_both_clips_has_the_bounded_loss_and_no_gradient():
    policy = fresh_policy()
    env = env_for(policy)
    batch = collect(env, policy, seed=3)
    batch = dataclasses.replace(batch, rewards=batch.dones * torch.tensor(SCORES)[:, None])
    ppo = PPO(policy, env, **SINGLE_PASS)
    dual = DualClipPPO(policy, env, **SINGLE_PASS)
    loose = DualClipPPO(policy, env, dual_clip_c=1e6, **SINGLE_PASS)
    data = dual.prepare(batch)
    ids, attn = batch.input_ids()
    with torch.no_grad():
        lp = policy.logprobs(ids, attn, batch.max_new_tokens)[0]
    # rho = e^2 ~ 7.39 everywhere: above 1 + 0.2 (clipped for A > 0) and above c = 3.
    data = dataclasses.replace(data, old_logprobs=lp - 2.0)
    advantages, mask = data.advantages, data.mask
    assert (advantages[mask] < 0).any() and (advantages[mask] > 0).any()

    grad, terms = policy_gradient(dual, data)
    expected_tokens = torch.where(advantages < 0, -3.0 * advantages, -1.2 * advantages)
    expected = aggregate(
        expected_tokens, mask, "token-mean", num_sequences=8, num_tokens=mask.sum(), max_len=6
    )
    assert terms["policy_loss"] == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    assert grad.abs().max() == 0.0  # A > 0: PPO's clip; A < 0: the dual clip

    ppo_grad, ppo_terms = policy_gradient(ppo, data)
    ppo_tokens = torch.where(advantages < 0, -math.exp(2.0) * advantages, -1.2 * advantages)
    assert ppo_terms["policy_loss"] == pytest.approx(
        aggregate(
            ppo_tokens, mask, "token-mean", num_sequences=8, num_tokens=mask.sum(), max_len=6
        ).item(),
        rel=1e-5,
    )
    assert ppo_grad.abs().max() > 1e-4  # PPO still pushes the A < 0 tokens down
    assert ppo_terms["value_loss"] == pytest.approx(terms["value_loss"], rel=1e-6)

    loose_grad, loose_terms = policy_gradient(loose, data)  # c never binds: PPO exactly
    torch.testing.assert_close(loose_grad, ppo_grad)
    assert loose_terms == pytest.approx(ppo_terms)


def test_dual_clip_c_must_exceed_one():
    policy = fresh_policy()
    env = env_for(policy)
    for value in (1.0, 0.5, -3.0):
        with pytest.raises(ValueError, match=rf"dual_clip_c={value}: must be > 1"):
            DualClipPPO(policy, env, dual_clip_c=value)
    with pytest.raises(ValueError, match="dual_clip_c=nan: must be a finite number"):
        DualClipPPO(policy, env, dual_clip_c=float("nan"))
    with pytest.raises(ValueError, match="value_model='none': PPO needs a critic"):
        DualClipPPO(policy, env, value_model="none")  # PPO's own checks still run
    assert DualClipPPO(policy, env).config.dual_clip_c == 3.0


def test_dual_clip_metrics_count_the_bound_tokens():
    """Hand values: tokens (A, rho) = (-1, 5) dual-clipped, (-1, 0.5) PPO-clipped below,
    (1, 2) PPO-clipped above, (-1, 1) untouched."""
    import torch as _torch

    from lmgym.agents import DualClipPPO
    from lmgym.envs.tasks.target_string import make_target_string_vector
    from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model

    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer)), tokenizer)
    env = make_target_string_vector(tokenizer=tokenizer, num_envs=4, group_size=2)
    agent = DualClipPPO(policy, env, clip_low=0.2, clip_high=0.2, dual_clip_c=3.0)
    ratio = _torch.tensor([[5.0, 0.5, 2.0, 1.0]])
    advantages = _torch.tensor([[-1.0, -1.0, 1.0, -1.0]])
    mask = _torch.ones(1, 4, dtype=_torch.bool)
    metrics = agent.clip_metrics(ratio, advantages, mask)
    assert metrics["dual_clip_fraction"] == 0.25
    assert metrics["clip_zeroed_fraction"] == 0.75
    assert metrics["clip_fraction"] == 0.75
