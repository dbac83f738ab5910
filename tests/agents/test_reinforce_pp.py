"""REINFORCE++: returns-to-go with the k1 KL in the reward, z-scored over the whole
batch; PPO's token clip; no groups needed."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch

from lmgym.agents import REINFORCEPP
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.rollout import collect
from lmgym.types import RolloutBatch

SCORES = [1.0, 0.0, 2.0, 0.5, 3.0, -1.0]


def fresh_policy(seed: int = 0) -> CausalLMPolicy:
    tokenizer = make_char_tokenizer()
    return CausalLMPolicy(make_tiny_model(len(tokenizer), seed=seed), tokenizer)


def env_for(policy: CausalLMPolicy, **kwargs):
    kwargs.setdefault("num_envs", 6)
    kwargs.setdefault("group_size", 1)  # REINFORCE++ needs no groups
    return make_target_string_vector(tokenizer=policy.tokenizer, max_new_tokens=6, **kwargs)


def ragged_batch(env, policy) -> RolloutBatch:
    """The first rollout (seeds 0, 1, ...) whose rows have different lengths: a
    token-level statistic is only tested when rows weigh differently."""
    for seed in range(50):
        batch = collect(env, policy, seed=seed)
        if batch.lengths.unique().numel() > 1:
            return batch
    raise AssertionError("no ragged rollout in 50 seeds")


def with_scores(batch: RolloutBatch, scores: list[float]) -> RolloutBatch:
    """The batch with bandit rewards ``scores`` placed at each row's last token."""
    rewards = batch.dones.float() * torch.tensor(scores)[:, None]
    return dataclasses.replace(batch, rewards=rewards)


def real_tokens(values: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    return [row[m].tolist() for row, m in zip(values, mask, strict=True)]


def test_bandit_advantages_are_the_score_z_scored_over_every_token_of_the_batch():
    policy = fresh_policy()
    env = env_for(policy)
    batch = with_scores(ragged_batch(env, policy), SCORES)
    data = REINFORCEPP(policy, env).prepare(batch)
    # gamma = 1: every token of row i has the return-to-go R_i; the z-score runs over
    # all tokens of the batch, so a long row weighs more in the mean.
    lengths = batch.lengths.tolist()
    tokens = [score for score, n in zip(SCORES, lengths, strict=True) for _ in range(n)]
    mean, std = statistics.mean(tokens), statistics.stdev(tokens)
    expected = [
        [(score - mean) / (std + 1e-8)] * n for score, n in zip(SCORES, lengths, strict=True)
    ]
    got = real_tokens(data.advantages, batch.completion_mask)
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_per_token_rewards_are_discounted_returns_to_go_then_z_scored():
    policy = fresh_policy()
    env = env_for(policy, reward_mode="per_token")
    batch = ragged_batch(env, policy)
    rows, columns = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    step_rewards = ((rows + 1) * (columns + 2) % 5 - 2).float()  # a varied pattern in [-2, 2]
    batch = dataclasses.replace(
        batch, rewards=torch.where(batch.completion_mask, step_rewards, 0.0)
    )
    gamma = 0.5
    data = REINFORCEPP(policy, env, gamma=gamma).prepare(batch)
    returns = []
    for row in real_tokens(batch.rewards, batch.completion_mask):
        to_go, ahead = [], 0.0
        for reward in reversed(row):
            ahead = reward + gamma * ahead
            to_go.append(ahead)
        returns.append(to_go[::-1])
    flat = [g for row in returns for g in row]
    mean, std = statistics.mean(flat), statistics.stdev(flat)
    assert std > 0, "the test needs returns that differ"
    got = real_tokens(data.advantages, batch.completion_mask)
    for row, want in zip(got, returns, strict=True):
        assert row == pytest.approx([(g - mean) / (std + 1e-8) for g in want], rel=1e-5, abs=1e-6)


def test_kl_sits_in_the_reward_as_k1_before_the_returns():
    policy = fresh_policy()
    env = env_for(policy)
    batch = with_scores(collect(env, policy, seed=0), SCORES)
    ref = fresh_policy(seed=1)  # a different reference: k1 != 0
    data = REINFORCEPP(policy, env, ref, beta=0.5).prepare(batch)
    ids, attn = batch.input_ids()
    with torch.no_grad():
        lp = policy.logprobs(ids, attn, batch.max_new_tokens)[0]
        lp_ref = ref.logprobs(ids, attn, batch.max_new_tokens)[0]
    mask = batch.completion_mask
    penalised = torch.where(mask, batch.rewards - 0.5 * (lp - lp_ref), 0.0).double()
    returns = penalised.flip(1).cumsum(1).flip(1)[mask]  # padding only trails each row
    expected = (returns - returns.mean()) / (returns.std() + 1e-8)
    torch.testing.assert_close(data.advantages[mask].double(), expected, atol=1e-5, rtol=1e-5)
    without_kl = REINFORCEPP(policy, env).prepare(batch).advantages[mask]
    assert (without_kl - data.advantages[mask]).abs().max() > 1e-3


def test_several_steps_per_batch_log_the_token_clip():
    policy = fresh_policy()
    env = env_for(policy, num_envs=8, group_size=2)
    batch = with_scores(collect(env, policy, seed=0), SCORES + [0.3, 0.7])
    agent = REINFORCEPP(policy, env, update_epochs=2, num_minibatches=2, learning_rate=5e-3)
    metrics = agent.train_on_batch(batch)
    assert metrics["ratio_max"] > 1.0 or metrics["ratio_min"] < 1.0
    for name in ("clip_fraction", "clip_zeroed_fraction", "approx_kl"):
        assert name in metrics
    assert metrics["advantage_mean"] == pytest.approx(0.0, abs=1e-6)


def test_bad_configs_fail_naming_the_field():
    policy = fresh_policy()
    env = env_for(policy)
    cases = [
        ({"clip_low": -0.1}, r"clip_low=-0.1, clip_high=0.2: clip ranges must be >= 0"),
        ({"clip_low": 1.5}, r"clip_low=1.5: must be <= 1"),
        ({"kl_placement": "both"}, r"kl_placement='both' is not one of"),
        ({"beta": 0.1}, r"ref_policy: beta=0.1 needs a frozen reference"),
        ({"gamma": 1.5}, r"gamma=1.5: must be in \[0, 1\]"),
        ({"clip_high": float("nan")}, r"clip_high=nan: must be a finite number"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):
            REINFORCEPP(policy, env, **overrides)


def test_a_masked_row_keeps_its_tokens_in_the_global_statistics():
    """Masked rows leave the loss only: the kept rows' advantages are the unmasked batch's."""
    policy = fresh_policy()
    env = env_for(policy)
    batch = with_scores(ragged_batch(env, policy), SCORES)
    agent = REINFORCEPP(policy, env)
    valid = torch.tensor([True, True, False, True, True, True])
    masked = agent.prepare(dataclasses.replace(batch, valid=valid))
    full = agent.prepare(batch)
    keep = valid[:, None] & batch.completion_mask
    torch.testing.assert_close(masked.advantages[keep], full.advantages[keep])
    assert masked.mask[2].sum() == 0


def test_huge_rewards_give_the_advantages_of_the_same_rewards_at_scale_one():
    """The z-score runs in float64: 1e20-scale rewards (whose float32 variance overflows)
    give exactly the scale-free advantages."""
    policy = fresh_policy()
    env = env_for(policy)
    batch = ragged_batch(env, policy)
    agent = REINFORCEPP(policy, env)
    unit = agent.prepare(with_scores(batch, SCORES)).advantages
    huge = agent.prepare(with_scores(batch, [s * 1e20 for s in SCORES])).advantages
    assert unit.abs().max() > 0.5
    torch.testing.assert_close(huge, unit, atol=1e-6, rtol=1e-5)
