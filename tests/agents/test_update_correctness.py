"""What every number of an update means: masked rows, normalisers, logged losses,
micro-batch invariance, non-finite guards, extreme rewards, dynamic sampling.

Each test builds a rollout batch with chosen rewards (non-zero gradient), so a
wrong normaliser or a polluted baseline changes the numbers it compares.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lmgym.agents import ALGORITHMS, CISPO, GRPO, GSPO, PPO, REINFORCE, RLOO, DrGRPO
from lmgym.agents.aggregation import AGGREGATION_MODES
from lmgym.agents.numerics import NonFiniteUpdateError, check_parameters
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model
from lmgym.rollout import collect
from lmgym.types import RolloutBatch

ALL_AGENTS = list(ALGORITHMS.values())  # the registry: a new agent joins every test here
GROUP = 4  # completions per prompt
ROWS = 12  # 3 prompts


def fresh_policy(seed: int = 0) -> CausalLMPolicy:
    tokenizer = make_char_tokenizer()
    return CausalLMPolicy(make_tiny_model(len(tokenizer), seed=seed), tokenizer)


def env_for(policy: CausalLMPolicy, **kwargs):
    return make_target_string_vector(
        tokenizer=policy.tokenizer, num_envs=ROWS, group_size=GROUP, max_new_tokens=6, **kwargs
    )


def with_scores(batch: RolloutBatch, scores: list[float]) -> RolloutBatch:
    """The batch with bandit rewards ``scores`` placed at each row's last token."""
    rewards = batch.dones.float() * torch.tensor(scores)[:, None]
    return dataclasses.replace(batch, rewards=rewards)


SCORES = [1.0, 0.0, 2.0, 0.5, 3.0, 1.0, 1.0, 0.0, 0.2, 0.9, 0.4, 0.7]


def setup(agent_class, seed: int = 0, **config):
    """A fresh policy, env, agent and a batch with varied rewards (non-zero gradient)."""
    policy = fresh_policy(seed)
    env = env_for(policy)
    batch = with_scores(collect(env, policy, seed=3), SCORES)
    # One optimizer step over the whole batch (the ratio-bounded agents default to
    # several), so the update is the hand-built one.
    config.setdefault("num_minibatches", 1)
    config.setdefault("update_epochs", 1)
    agent = agent_class(policy, env, **config)
    return agent, batch


def gradients_of(agent, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
    """The accumulated gradient of one update (the optimizer step is disabled)."""
    agent.optimizer.step = lambda *a, **k: None  # keep the gradient, leave the weights
    metrics = agent.train_on_batch(batch)
    params = [p for g in agent.optimizer.param_groups for p in g["params"]]
    grad = torch.cat([p.grad.flatten() for p in params if p.grad is not None])
    return grad, metrics


def aggregations(agent_class) -> list[str]:
    return ["seq-mean-token-mean"] if agent_class is GSPO else list(AGGREGATION_MODES)


# --------------------------------------------------------------- masked rows
@pytest.mark.parametrize("agent_class", ALL_AGENTS)
def test_a_masked_row_keeps_its_real_score_in_every_statistic(agent_class):
    """Rewards [5, 5, 5, 5] with one row masked: the kept rows' advantages are those of
    the unmasked batch (0 for GRPO/RLOO), never computed as if the row scored 0."""
    agent, batch = setup(agent_class, whiten_advantages=agent_class is PPO)
    scores = list(SCORES)
    scores[:GROUP] = [5.0] * GROUP
    batch = with_scores(batch, scores)
    valid = torch.ones(ROWS, dtype=torch.bool)
    valid[2] = False
    masked = agent.prepare(dataclasses.replace(batch, valid=valid))
    full = agent.prepare(batch)
    keep = valid[:, None] & batch.completion_mask
    torch.testing.assert_close(masked.advantages[keep], full.advantages[keep])
    if agent_class in (GRPO, RLOO, DrGRPO, GSPO, CISPO):
        assert masked.advantages[:2].abs().max() == 0.0
    assert masked.mask[2].sum() == 0  # ... and the row is out of the loss


def test_a_masked_row_contributes_no_gradient_and_counts_in_B():
    """GRPO's gradient with row 2 masked equals the hand-built
    (1/B) sum_{kept i} (1/T_i) sum_t -A_i lp_{i,t}, with A from all rows' scores and
    B = all rows of the batch."""
    agent, batch = setup(GRPO, max_grad_norm=None)
    valid = torch.ones(ROWS, dtype=torch.bool)
    valid[2] = False
    grad, _ = gradients_of(agent, dataclasses.replace(batch, valid=valid))

    reference = fresh_policy()
    scores = torch.tensor(SCORES).view(-1, GROUP)
    advantages = (scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-4)
    ids, attn = batch.input_ids()
    lp = reference.logprobs(ids, attn, batch.max_new_tokens, with_entropy=False)[0]
    mask = batch.completion_mask.float() * valid[:, None]
    per_row = (-advantages.flatten()[:, None] * lp * mask).sum(1) / mask.sum(1).clamp_min(1)
    (per_row.sum() / ROWS).backward()
    expected = torch.cat([p.grad.flatten() for p in reference.model.parameters()])
    torch.testing.assert_close(grad, expected, atol=1e-6, rtol=1e-4)


def test_dr_grpo_normaliser_is_B_times_L_max_with_fully_masked_rows():
    """Dr. GRPO's sum(l) / (B * L_max) keeps B = every row: masking two rows scales
    nothing else (it is 8/7 of TRL's dr_grpo if B counted only rows with tokens)."""
    agent, batch = setup(DrGRPO, max_grad_norm=None)
    valid = torch.ones(ROWS, dtype=torch.bool)
    valid[[1, 6]] = False
    grad, _ = gradients_of(agent, dataclasses.replace(batch, valid=valid))

    reference = fresh_policy()
    scores = torch.tensor(SCORES).view(-1, GROUP)
    advantages = (scores - scores.mean(1, keepdim=True)).flatten()
    ids, attn = batch.input_ids()
    lp = reference.logprobs(ids, attn, batch.max_new_tokens, with_entropy=False)[0]
    mask = batch.completion_mask.float() * valid[:, None]
    ((-advantages[:, None] * lp * mask).sum() / (ROWS * batch.max_new_tokens)).backward()
    expected = torch.cat([p.grad.flatten() for p in reference.model.parameters()])
    torch.testing.assert_close(grad, expected, atol=1e-6, rtol=1e-4)


# ------------------------------------------------------ micro-batch invariance
@pytest.mark.parametrize("agent_class", ALL_AGENTS)
def test_micro_batching_changes_neither_the_gradient_nor_any_logged_metric(agent_class):
    """For every aggregation, on a batch with a non-zero gradient and a masked row,
    micro-batches of 1, 5 and all rows give the same gradient and the same metrics
    (logged losses included)."""
    for aggregation in aggregations(agent_class):
        results = []
        for micro in (None, 5, 1):
            agent, batch = setup(
                agent_class,
                loss_aggregation=aggregation,
                micro_batch_size=micro,
                max_grad_norm=None,
                entropy_coef=0.01,
            )
            valid = torch.ones(ROWS, dtype=torch.bool)
            valid[7] = False
            results.append(gradients_of(agent, dataclasses.replace(batch, valid=valid)))
        (grad, metrics), others = results[0], results[1:]
        assert grad.abs().max() > 1e-4, "the test needs a batch with a real gradient"
        for other_grad, other_metrics in others:
            torch.testing.assert_close(other_grad, grad, atol=1e-6, rtol=1e-4)
            assert other_metrics.keys() == metrics.keys()
            for key, value in metrics.items():
                assert other_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (
                    aggregation,
                    key,
                )


def test_logged_policy_loss_is_the_minibatch_loss():
    """GRPO with token-mean, one minibatch: the logged policy_loss is the aggregated
    loss itself, -sum_i T_i A_i / sum_i T_i (ratio = 1), whatever the micro-batch size
    (it was divided by the number of micro-batches)."""
    losses = []
    for micro in (None, 2, 1):
        agent, batch = setup(GRPO, micro_batch_size=micro, loss_aggregation="token-mean")
        losses.append(agent.train_on_batch(batch)["policy_loss"])
    scores = torch.tensor(SCORES).view(-1, GROUP)
    advantages = (scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-4)
    lengths = batch.lengths.float()
    expected = -(advantages.flatten() * lengths).sum() / lengths.sum()
    assert abs(expected.item()) > 0.01
    assert losses[0] == pytest.approx(expected.item(), rel=1e-4)
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert losses[2] == pytest.approx(losses[0], rel=1e-5)


def test_logged_value_loss_does_not_depend_on_micro_batches():
    values = []
    for micro in (None, 3, 1):
        agent, batch = setup(PPO, micro_batch_size=micro)
        values.append(agent.train_on_batch(batch)["value_loss"])
    assert values[0] > 0
    assert values[1] == pytest.approx(values[0], rel=1e-5)
    assert values[2] == pytest.approx(values[0], rel=1e-5)


# ------------------------------------------------------------- non-finite guards
@pytest.mark.parametrize(
    "field", ["beta", "clip_low", "entropy_coef", "learning_rate", "max_grad_norm", "gamma"]
)
def test_nan_and_inf_config_values_are_refused(field):
    policy = fresh_policy()
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"{field}={bad}: must be a finite number"):
            GRPO(policy, env_for(policy), **{field: bad})


@pytest.mark.parametrize("field", ["dynamic_sampling", "whiten_advantages", "skip_nonfinite"])
def test_booleans_are_not_parsed_from_strings(field):
    policy = fresh_policy()
    for text in ("false", "maybe", 0):
        with pytest.raises(TypeError, match=f"{field}={text!r}: expected True or False"):
            GRPO(policy, env_for(policy), **{field: text})


def test_integer_fields_refuse_bools_and_floats():
    policy = fresh_policy()
    with pytest.raises(TypeError, match="num_minibatches=True: expected an integer"):
        GRPO(policy, env_for(policy), num_minibatches=True)
    with pytest.raises(TypeError, match="update_epochs=1.5: expected an integer"):
        GRPO(policy, env_for(policy), update_epochs=1.5)


def poison(agent) -> None:
    with torch.no_grad():
        next(agent.policy.model.parameters()).fill_(float("nan"))


def test_nan_weights_raise_naming_the_iteration_and_quantity():
    agent, batch = setup(GRPO)
    poison(agent)
    with pytest.raises(NonFiniteUpdateError, match=r"policy_loss is nan at iteration 1, epoch 1"):
        agent.train_on_batch(batch)
    assert isinstance(NonFiniteUpdateError("x"), FloatingPointError)


def test_skip_nonfinite_skips_and_counts_the_step_and_leaves_weights_alone():
    agent, batch = setup(GRPO, skip_nonfinite=True)
    agent.policy.model.lm_head.weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    before = [p.detach().clone() for p in agent.policy.model.parameters()]
    metrics = agent.train_on_batch(batch)
    assert metrics["nonfinite_steps_skipped"] == 1.0
    for p, q in zip(agent.policy.model.parameters(), before, strict=True):
        assert torch.equal(p, q)


def test_an_infinite_gradient_raises_by_default():
    agent, batch = setup(GRPO)
    agent.policy.model.lm_head.weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    with pytest.raises(NonFiniteUpdateError, match="grad_norm is inf at iteration 1"):
        agent.train_on_batch(batch)


def test_a_diverging_learning_rate_is_caught_at_the_update_not_in_the_sampler():
    """A huge learning rate makes the weights non-finite after a step; the next
    sample would fail in torch.multinomial with no hint. The update says so instead."""
    agent, _ = setup(GRPO, learning_rate=1e30, max_grad_norm=None)
    with pytest.raises(NonFiniteUpdateError, match="the weights diverged"):
        agent.learn(3)


def test_weights_left_non_finite_by_a_step_are_named():
    weights = [torch.zeros(3), torch.tensor([1.0, float("inf")])]
    with pytest.raises(NonFiniteUpdateError, match="parameters are non-finite after the .* at it"):
        check_parameters(weights, "it", learning_rate=1.0)
    check_parameters(weights[:1], "it", learning_rate=1.0)


# -------------------------------------------------------------- extreme rewards
@pytest.mark.parametrize("agent_class", [GRPO, GSPO, CISPO])
def test_huge_rewards_give_the_same_group_normalised_advantages(agent_class):
    """Above ~1e19 a float32 group std overflows; statistics in float64 keep GRPO's
    scale-free advantages exactly those of the same rewards at scale 1."""
    agent, batch = setup(agent_class)
    huge = agent.prepare(with_scores(batch, [s * 1e20 for s in SCORES])).advantages
    scores = torch.tensor(SCORES, dtype=torch.float64).view(-1, GROUP)
    exact = (scores - scores.mean(1, keepdim=True)) / scores.std(1, keepdim=True)
    expected = exact.flatten().float()[:, None] * batch.completion_mask
    assert expected.abs().max() > 0.5
    torch.testing.assert_close(huge, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("agent_class", [REINFORCE, RLOO, DrGRPO, GRPO, GSPO, CISPO])
def test_huge_but_finite_rewards_update_every_agent_to_finite_weights(agent_class):
    """Scale-dependent losses (1e20 * lp) have finite gradients whose float32 norm
    overflows: the norm is recomputed in float64 and clipping applies as usual."""
    agent, batch = setup(agent_class)
    before = torch.cat([p.detach().flatten() for p in agent.policy.model.parameters()])
    metrics = agent.train_on_batch(with_scores(batch, [s * 1e20 for s in SCORES]))
    after = torch.cat([p.detach().flatten() for p in agent.policy.model.parameters()])
    assert torch.isfinite(after).all() and not torch.equal(after, before)
    assert metrics["grad_norm"] > 0


def test_ppo_huge_rewards_fail_loudly_on_the_value_loss():
    """PPO's squared value error of 1e40 cannot be represented: a clear error, never
    a silent zero."""
    agent, batch = setup(PPO)
    with pytest.raises(NonFiniteUpdateError, match="value_loss is inf"):
        agent.train_on_batch(with_scores(batch, [s * 1e20 for s in SCORES]))


# ------------------------------------------------------------- dynamic sampling
def test_dynamic_sampling_with_every_group_flat_still_proceeds():
    """All-zero rewards (the usual start of a sparse task): it draws 1 + max_resample
    batches, then trains on the last one as plain GRPO would (advantages 0)."""
    from lmgym.envs import FunctionReward, TokenVectorEnv

    policy = fresh_policy()
    env = TokenVectorEnv(
        policy.tokenizer,
        ["a", "b"],
        FunctionReward(lambda prompts, completions: [0.0] * len(prompts)),
        num_prompts=2,
        group_size=4,
        max_new_tokens=4,
    )
    agent = GRPO(policy, env, dynamic_sampling=True, max_resample=2)
    metrics = agent.learn(1)[0]
    assert metrics["groups_dropped"] == 6.0  # 2 groups x 3 draws
    assert metrics["frac_reward_zero_std"] == 1.0
    assert metrics["advantage_std"] == 0.0


# ------------------------------------------------------------------ evaluation
def test_evaluate_uses_its_own_env_and_moves_no_training_state():
    policy = fresh_policy()
    env = env_for(policy)
    agent = GRPO(policy, env)
    agent.learn(1)
    state = env.get_state()
    generator_state = agent.generator.get_state()
    tokens = agent.tokens_generated
    with pytest.raises(ValueError, match="env: evaluate needs an env of its own"):
        agent.evaluate(env)
    eval_env = env_for(policy)
    first = agent.evaluate(eval_env, num_batches=2, seed=7)
    assert agent.evaluate(eval_env, num_batches=2, seed=7) == first
    assert set(first) == {"reward_mean", "reward_std", "completion_length"}
    after = env.get_state()
    assert after.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(after[key], value) if torch.is_tensor(value) else after[key] == value
    assert torch.equal(agent.generator.get_state(), generator_state)
    assert agent.tokens_generated == tokens


# -------------------------------------------------------------- length bucketing
@pytest.mark.parametrize("agent_class", ALL_AGENTS)
def test_length_bucketing_changes_neither_gradient_nor_metrics(agent_class):
    """Rows sorted by length into micro-batches, each pass trimmed to its longest
    completion: the same update as padded micro-batches (whole-minibatch normalisers)."""
    results = []
    for bucket in (False, True):
        agent, batch = setup(
            agent_class, micro_batch_size=3, bucket_by_length=bucket, max_grad_norm=None
        )
        assert batch.lengths.min() < batch.lengths.max()
        results.append(gradients_of(agent, batch))
    (padded, padded_metrics), (bucketed, bucketed_metrics) = results
    torch.testing.assert_close(bucketed, padded, atol=1e-6, rtol=1e-4)
    assert bucketed_metrics.keys() == padded_metrics.keys()
    for key, value in padded_metrics.items():
        assert bucketed_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_length_bucketing_runs_no_pass_over_padding_columns():
    agent, batch = setup(GRPO, micro_batch_size=3)
    widths, groups = [], []
    forward = agent.policy.sequence_hidden

    def spy(ids, attn, length, group_ids):
        widths.append(length)
        groups.append(group_ids)
        return forward(ids, attn, length, group_ids)

    agent.policy.sequence_hidden = spy
    agent.train_on_batch(batch)
    ordered = batch.lengths.sort(descending=True).values
    assert widths == [int(ordered[i : i + 3].max()) for i in range(0, ROWS, 3)]
    # Each micro-batch's rows carry their groups from the rollout (shared prompt passes).
    assert torch.equal(torch.cat(groups).sort().values, batch.group_ids.sort().values)


def test_special_token_mass_and_learning_rate_are_logged():
    """The probability the special-token mask removed is logged as the batch mean of
    RolloutBatch.special_mass; learning_rate follows the optimizer."""
    agent, batch = setup(GRPO, learning_rate=3e-3)
    assert agent.policy.num_masked_tokens > 0  # <pad>, <unk> of the char tokenizer
    assert batch.special_mass.min() > 0
    metrics = agent.train_on_batch(batch)
    assert metrics["special_token_mass"] == pytest.approx(batch.special_mass.mean().item())
    assert agent.step()["learning_rate"] == 3e-3


def test_a_stable_baselines3_callback_is_refused_naming_lmgyms_protocol():
    from stable_baselines3.common.callbacks import CheckpointCallback

    agent, _ = setup(GRPO)
    with pytest.raises(
        TypeError, match=r"Stable-Baselines3 BaseCallback.*callback\(agent, metrics\)"
    ):
        agent.learn(1, callback=CheckpointCallback(1, "unused"))
    assert agent.iteration == 0
