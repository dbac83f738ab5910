"""Agent mechanics: split invariance, KL and TIS wiring, metrics, save/load, config errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lmgym.agents import CISPO, GRPO, GSPO, PPO, REINFORCE, RLOO, DrGRPO
from lmgym.agents.config import field_help
from lmgym.agents.dapo import drop_flat_groups, overlong_penalty
from lmgym.agents.ppo import PPOConfig
from lmgym.envs import FunctionReward
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.policy.value import frozen_copy
from lmgym.rollout import collect


def fresh_policy(seed: int = 0) -> CausalLMPolicy:
    tokenizer = make_char_tokenizer()
    return CausalLMPolicy(make_tiny_model(len(tokenizer), seed=seed), tokenizer)


def target_env(policy, **kwargs):
    kwargs.setdefault("num_envs", 16)
    kwargs.setdefault("group_size", 4)
    return make_target_string_vector(tokenizer=policy.tokenizer, **kwargs)


def params(policy) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in policy.model.parameters()])


def test_single_pass_old_logprobs_equal_a_recomputed_pass():
    """With one epoch and one minibatch lp_old = sg(lp): the same update as a separate pass."""
    updates = []
    for recompute in (True, False):
        policy = fresh_policy()
        env = target_env(policy)
        batch = collect(env, policy, seed=1)
        agent = GRPO(
            policy, env, recompute_old_logprobs=recompute, update_epochs=1, num_minibatches=1
        )
        metrics = agent.train_on_batch(batch)
        assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        updates.append(params(policy))
    torch.testing.assert_close(updates[0], updates[1], atol=1e-5, rtol=1e-4)


def test_kl_to_reference_is_zero_before_learning_and_grows_after():
    policy = fresh_policy()
    env = target_env(policy)
    # One step per batch: the first iteration's KL is measured before any step.
    agent = GRPO(
        policy,
        env,
        frozen_copy(policy),
        beta=0.1,
        learning_rate=5e-3,
        update_epochs=1,
        num_minibatches=1,
    )
    history = agent.learn(6)
    assert history[0]["kl_ref_k1"] == pytest.approx(0.0, abs=1e-6)
    assert history[0]["kl_ref_k3"] == pytest.approx(0.0, abs=1e-6)
    assert history[-1]["kl_ref_k3"] > 1e-4


def test_kl_in_the_reward_lowers_rloo_rewards_seen_by_advantages():
    policy = fresh_policy()
    env = target_env(policy)
    batch = collect(env, policy, seed=0)
    ref = fresh_policy(seed=1)  # a different reference: k1 != 0
    agent = RLOO(policy, env, ref, beta=0.5, kl_placement="reward")
    data = agent.prepare(batch)
    ids, attn = batch.input_ids()
    with torch.no_grad():
        lp = policy.logprobs(ids, attn, batch.max_new_tokens)[0]
        lp_ref = ref.logprobs(ids, attn, batch.max_new_tokens)[0]
    mask = batch.completion_mask.float()
    scores = ((batch.rewards - 0.5 * (lp - lp_ref)) * mask).sum(1)
    groups = scores.view(4, 4)
    expected = 4 / 3 * (groups - groups.mean(1, keepdim=True))
    torch.testing.assert_close(data.advantages[:, 0], expected.flatten(), atol=1e-4, rtol=1e-4)


def test_ppo_logs_value_and_clip_metrics_and_moves_the_ratio():
    policy = fresh_policy()
    env = target_env(policy, reward_mode="per_token")
    metrics = PPO(policy, env, learning_rate=1e-3).learn(3)[-1]
    for key in (
        "value_loss",
        "explained_variance",
        "clip_fraction",
        "clip_zeroed_fraction",
        "clip_fraction_low",
        "clip_fraction_high",
        "approx_kl",
        "ratio_max",
        "entropy",
        "frac_reward_zero_std",
        "advantage_std",
        "grad_norm",
        "truncated_fraction",
    ):
        assert key in metrics, key
    assert metrics["approx_kl"] > 0  # several epochs: the policy moved away from lp_old
    assert metrics["clip_zeroed_fraction"] <= metrics["clip_fraction"]


def test_separate_critic_leaves_the_policy_trunk_out_of_value_gradients():
    policy = fresh_policy()
    env = target_env(policy)
    agent = PPO(policy, env, value_model="separate")
    assert agent.critic.trunk_policy is not policy
    assert not any(p is q for p in agent.critic.own_parameters() for q in policy.model.parameters())
    agent.learn(1)


def test_cispo_never_reports_zeroed_gradients():
    policy = fresh_policy()
    env = target_env(policy)
    metrics = CISPO(policy, env, update_epochs=2, learning_rate=5e-3).learn(2)[-1]
    assert metrics["clip_zeroed_fraction"] == 0.0


def test_tis_logs_effective_sample_size():
    policy = fresh_policy()
    env = target_env(policy)
    metrics = REINFORCE(policy, env, tis_cap=2.0).learn(1)[-1]
    assert 0.99 < metrics["tis_ess"] <= 1.0  # lp_old == lp_s up to float noise: weights ~1
    assert metrics["tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)


def test_rows_masked_by_the_unfinished_policy_do_not_move_the_policy():
    policy = fresh_policy()
    env = target_env(policy, unfinished="mask")
    batch = collect(env, policy, seed=0)
    assert not batch.valid[~batch.terminated].any()  # every cut-off row is flagged
    before = params(policy)
    GRPO(policy, env).train_on_batch(
        dataclasses.replace(batch, valid=torch.zeros_like(batch.valid))
    )
    assert torch.equal(params(policy), before)


def test_save_and_load_resume_exactly(tmp_path):
    policy = fresh_policy()
    agent = PPO(policy, target_env(policy), num_minibatches=2)
    agent.learn(2)
    agent.save(tmp_path / "ckpt")
    continued = agent.learn(2)

    env = target_env(fresh_policy())
    resumed_agent = PPO.load(tmp_path / "ckpt", env)
    assert resumed_agent.iteration == 2
    resumed = resumed_agent.learn(2)
    for a, b in zip(continued, resumed, strict=True):
        assert a["reward_mean"] == b["reward_mean"]
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-6)


def test_load_rejects_a_directory_that_is_not_a_checkpoint(tmp_path):
    policy = fresh_policy()
    with pytest.raises(
        FileNotFoundError, match="not an lmgym checkpoint: agent_config.json is missing"
    ):
        GRPO.load(tmp_path, target_env(policy))


def test_dynamic_sampling_drops_flat_groups_and_refills():
    policy = fresh_policy()
    prompts = ["flat", "count"]

    def reward(prompt_list, completions):
        # "count": the completion's character codes summed, which four random
        # completions all but never share (a length can: all run to the budget).
        return [
            0.0 if p == "flat" else float(sum(map(ord, c)))
            for p, c in zip(prompt_list, completions, strict=True)
        ]

    from lmgym.envs import TokenVectorEnv

    env = TokenVectorEnv(
        policy.tokenizer,
        prompts,
        FunctionReward(reward),
        num_prompts=2,
        group_size=4,
        max_new_tokens=6,
        prompt_order="sequential",
    )
    agent = GRPO(policy, env, dynamic_sampling=True, max_resample=3)
    batch, dropped = agent.collect()
    assert dropped >= 1
    assert batch.batch_size == 8
    assert all(env.prompt_table.texts[i] == "count" for i in batch.prompt_index.tolist())
    metrics = agent.step()
    assert metrics["groups_dropped"] >= 1 and metrics["frac_reward_zero_std"] == 0.0


def test_drop_flat_groups_by_group_id_not_row_order(make_env, policy):
    env = make_env(prompts=["ab"], num_prompts=3, group_size=2, max_new_tokens=3)
    batch = collect(env, policy, seed=0)
    rewards = torch.zeros_like(batch.rewards)
    rewards[:, 0] = torch.tensor([1.0, 1.0, 0.0, 2.0, 3.0, 3.0])
    shuffled = dataclasses.replace(batch, rewards=rewards).select(torch.tensor([5, 0, 3, 1, 4, 2]))
    kept, dropped = drop_flat_groups(shuffled)
    assert dropped == 2
    assert sorted(kept.group_ids.tolist()) == [1, 1]


def test_overlong_penalty_hand_values():
    lengths = torch.tensor([3, 6, 7, 8, 10])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0])
    torch.testing.assert_close(overlong_penalty(lengths, max_len=10, cache=4), expected)


def test_field_docstrings_become_help():
    helps = field_help(PPOConfig)
    assert helps["gae_lambda"].startswith("GAE lambda")
    assert "learning rate" in helps["learning_rate"]


# ------------------------------------------------------------------ bad input
def test_inconsistent_configs_fail_at_construction_naming_the_field():
    policy = fresh_policy()
    env = target_env(policy)
    cases = [
        (PPO, {"value_model": "none"}, "value_model='none': PPO needs a critic"),
        (GSPO, {"loss_aggregation": "token-mean"}, "loss_aggregation='token-mean': GSPO"),
        (GRPO, {"beta": 0.1}, "ref_policy: beta=0.1 needs a frozen reference"),
        (GRPO, {"clip_low": -0.1}, "clip_low=-0.1, clip_high=0.28: clip ranges must be >= 0"),
        (GRPO, {"num_minibatches": 3}, "num_minibatches=3 does not divide the batch of 16 rows"),
        (GRPO, {"learning_rate": 0.0}, "learning_rate=0.0: must be > 0"),
        (GRPO, {"loss_aggregation": "mean"}, "loss_aggregation='mean' is not one of"),
        (DrGRPO, {"kl_estimator": "k4"}, "kl_estimator='k4' is not one of"),
        (CISPO, {"weight_high": -1.0}, "weight_low=1.0, weight_high=-1.0"),
    ]
    for agent_class, overrides, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            agent_class(policy, env, **overrides)
    with pytest.raises(TypeError, match=r"unknown GRPOConfig field\(s\) \['lr'\]"):
        GRPO(policy, env, lr=1e-3)


def test_group_methods_need_groups():
    policy = fresh_policy()
    env = target_env(policy, num_envs=4, group_size=1)
    with pytest.raises(ValueError, match="group_size=1: RLOO needs at least 2"):
        RLOO(policy, env)
    with pytest.raises(ValueError, match="group_size=1: grpo compares completions"):
        GRPO(policy, env)
    REINFORCE(policy, env)  # no groups needed
