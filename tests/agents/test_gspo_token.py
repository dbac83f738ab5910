"""GSPO-token: GSPO's gradient with sequence advantages; per-token advantages allowed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lmgym.agents import GSPO, GSPOToken
from lmgym.agents.metrics import masked_mean
from lmgym.agents.records import Counts
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.rollout import collect

SCORES = [1.0, 0.0, 2.0, 0.5, 3.0, 1.0, 1.0, 0.0, 0.2, 0.9, 0.4, 0.7]
# Per-row log-ratio lp - lp_old: inside GSPO's (3e-4, 4e-4) interval, or out on either side.
ROW_LOG_RATIOS = [0.0, 1e-4, -2e-4, 0.01, -0.01, 0.05, -0.05, 2e-4, 0.02, -0.03, 3e-4, -1e-3]


def fresh_policy(seed: int = 0) -> CausalLMPolicy:
    tokenizer = make_char_tokenizer()
    return CausalLMPolicy(make_tiny_model(len(tokenizer), seed=seed), tokenizer)


def env_for(policy: CausalLMPolicy, **kwargs):
    return make_target_string_vector(
        tokenizer=policy.tokenizer, num_envs=12, group_size=4, max_new_tokens=6, **kwargs
    )


def gradient(agent, data) -> tuple[torch.Tensor, float]:
    agent.optimizer.zero_grad(set_to_none=True)
    loss = agent.micro_batch_loss(data, Counts.of(data.mask), agent.parallel.modules)
    loss.total.backward()
    grads = [p.grad.flatten() for p in agent.policy.model.parameters() if p.grad is not None]
    return torch.cat(grads), float(loss.terms["policy_loss"])


def test_with_sequence_advantages_the_gradient_is_gspos():
    policy = fresh_policy()
    env = env_for(policy)
    batch = collect(env, policy, seed=3)
    rewards = batch.dones.float() * torch.tensor(SCORES)[:, None]
    batch = dataclasses.replace(batch, rewards=rewards)
    gspo, token = GSPO(policy, env), GSPOToken(policy, env)
    data = gspo.prepare(batch)
    ids, attn = batch.input_ids()
    with torch.no_grad():
        lp = policy.logprobs(ids, attn, batch.max_new_tokens)[0]
    # lp_old so that each row's mean log-ratio is its ROW_LOG_RATIOS entry, while the
    # token log-ratios spread around it (so the token ratios are not s_i).
    noise = 0.1 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(0))
    noise = noise - masked_mean(noise, data.mask, dim=1)[:, None]
    old = lp - torch.tensor(ROW_LOG_RATIOS)[:, None] - noise
    data = dataclasses.replace(data, old_logprobs=old)
    torch.testing.assert_close(token.prepare(batch).advantages, data.advantages)

    gspo_grad, gspo_loss = gradient(gspo, data)
    token_grad, token_loss = gradient(token, data)
    assert gspo_grad.abs().max() > 1e-4, "the test needs a real gradient"
    assert token_loss == pytest.approx(gspo_loss, rel=1e-6, abs=1e-7)
    torch.testing.assert_close(token_grad, gspo_grad, atol=1e-7, rtol=1e-5)
    clipped = [
        (r > 4e-4 and a > 0) or (r < -3e-4 and a < 0)
        for r, a in zip(ROW_LOG_RATIOS, data.advantages[:, 0].tolist(), strict=True)
    ]
    assert any(clipped) and not all(clipped), "the test needs clipped and unclipped rows"


def test_per_token_advantages_are_accepted_where_gspo_refuses_them():
    policy = fresh_policy()
    env = env_for(policy, reward_mode="per_token")
    with pytest.raises(ValueError, match="advantage='process' gives per-token advantages"):
        GSPO(policy, env, advantage="process")
    with pytest.raises(ValueError, match="loss_aggregation='token-mean': GSPO"):
        GSPO(policy, env, loss_aggregation="token-mean")
    agent = GSPOToken(
        policy, env, advantage="process", update_epochs=2, clip_low=0.2, clip_high=0.2
    )
    batch = collect(env, policy, seed=3)
    rows, columns = torch.meshgrid(torch.arange(12), torch.arange(6), indexing="ij")
    step_rewards = ((rows + 1) * (columns + 2) % 5 - 2).float()
    batch = dataclasses.replace(
        batch, rewards=torch.where(batch.completion_mask, step_rewards, 0.0)
    )
    advantages = agent.prepare(batch).advantages
    spread = advantages.max(dim=1).values - advantages.min(dim=1).values
    assert spread.max() > 0.1, "process advantages differ between the tokens of a row"
    before = [p.detach().clone() for p in policy.model.parameters()]
    metrics = agent.train_on_batch(batch)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    moved = [
        (p.detach() - b).abs().max() for p, b in zip(policy.model.parameters(), before, strict=True)
    ]
    assert max(moved) > 0
    GSPOToken(policy, env, loss_aggregation="token-mean")  # a per-token loss: any aggregation


def test_bad_configs_fail_naming_the_field():
    policy = fresh_policy()
    env = env_for(policy)
    cases = [
        ({"clip_low": -1e-4}, r"clip_low=-0.0001, clip_high=0.0004: clip ranges must be >= 0"),
        ({"scale": "row"}, r"scale='row' is not one of"),
        ({"advantage": "process"}, r"advantage='process' needs step rewards"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):
            GSPOToken(policy, env, **overrides)
    with pytest.raises(ValueError, match="group_size=1: gspo_token compares completions"):
        GSPOToken(policy, make_target_string_vector(tokenizer=policy.tokenizer, num_envs=4))
