"""VAPO: decoupled and length-adaptive GAE, the positive-example LM loss, value pretraining."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lmgym.agents import VAPO
from lmgym.agents.records import Counts
from lmgym.agents.vapo import positive_weights
from lmgym.envs import FunctionReward
from lmgym.rollout import collect


def params(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def same(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


def test_advantages_hand_values_decoupled_and_length_adaptive(make_env, policy):
    env = make_env(num_prompts=2, group_size=2)
    agent = VAPO(policy, env, length_alpha=0.5, critic_lambda=0.5, value_warmup_iterations=1)
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.5, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    dones = torch.tensor([[0, 0, 1], [0, 1, 0]], dtype=torch.bool)
    batch = SimpleNamespace(dones=dones, lengths=torch.tensor([3, 2]))
    # lambda_i = 1 - 1/(0.5 T_i): row 0 (T=3) 1/3, row 1 (T=2) 0.
    # Row 0: delta = [0.1, 0.1, 0.3]; A = [0.1 + 0.2/3, 0.1 + 0.3/3, 0.3].
    # Row 1: delta = [0.3, 0.5], A = delta (one-step TD).
    expected_advantages = [[0.1 + 0.2 / 3, 0.2, 0.3], [0.3, 0.5, 0.0]]
    advantages, returns = agent.advantages(batch, rewards, mask, values)
    torch.testing.assert_close(advantages, torch.tensor(expected_advantages, dtype=torch.float64))
    # Value pretraining: targets are Monte-Carlo returns whatever critic_lambda says.
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]).double())
    # Afterwards critic_lambda = 0.5: row 0 A = [0.1 + 0.5*0.25, 0.1 + 0.5*0.3, 0.3] + V;
    # row 1 A = [0.3 + 0.5*0.5, 0.5] + V.
    agent.iteration = 1
    _, returns = agent.advantages(batch, rewards, mask, values)
    expected_returns = [[0.225 + 0.5, 0.25 + 0.6, 1.0], [0.55 + 0.2, 1.0, 0.0]]
    torch.testing.assert_close(returns, torch.tensor(expected_returns, dtype=torch.float64))


def test_fixed_policy_lambda_without_length_alpha(make_env, policy):
    agent = VAPO(policy, make_env(num_prompts=2, group_size=2), length_alpha=None, gae_lambda=0.5)
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    batch = SimpleNamespace(dones=torch.tensor([[0, 0, 1]]), lengths=torch.tensor([3]))
    advantages, _ = agent.advantages(batch, rewards, torch.ones(1, 3, dtype=torch.bool), values)
    # delta = [0.1, 0.1, 0.3]; A = [0.1 + 0.5*0.25, 0.1 + 0.5*0.3, 0.3]
    torch.testing.assert_close(advantages, torch.tensor([[0.225, 0.25, 0.3]]))


def test_positive_weights_hand_values():
    scores = torch.tensor([1.0, 0.5, 1.0, 0.9999996, 2.0])
    lengths = torch.tensor([2, 3, 4, 1, 0])  # row 4 is masked out (no loss tokens)
    mask = torch.arange(4)[None, :] < lengths[:, None]
    # Positive rows 0, 2, 3 (float32 rounding of 1.0 allowed) and 4; N = 10, N_P = 7.
    weights = positive_weights(scores, mask, threshold=1.0)
    torch.testing.assert_close(weights, torch.tensor([10 / 7, 0.0, 10 / 7, 10 / 7, 10 / 7]))
    torch.testing.assert_close(positive_weights(scores, mask, threshold=3.0), torch.zeros(5))


def test_lm_loss_is_the_mean_nll_over_positive_tokens_with_one_minibatch(make_env, eos_policy):
    length = FunctionReward(lambda ps, cs: [float(len(c)) for c in cs], name="length")
    env = make_env(prompts=("ab", "xyz"), num_prompts=2, group_size=4, reward=length)
    agent = VAPO(eos_policy, env, value_warmup_iterations=0, positive_threshold=2.0)
    batch = collect(env, eos_policy, seed=0)
    positive = batch.scores >= 2.0
    assert 0 < int(positive.sum()) < batch.batch_size  # some positives, not all
    data = agent.prepare(batch)
    loss = agent.micro_batch_loss(data, Counts.of(data.mask), agent.parallel.modules)
    ids, attn = batch.input_ids()
    logprobs = eos_policy.logprobs(ids, attn, batch.max_new_tokens, with_entropy=False)[0]
    tokens = batch.completion_mask & positive[:, None]
    expected = -logprobs[tokens].mean()
    torch.testing.assert_close(loss.terms["nll_loss"], expected.detach(), rtol=1e-5, atol=1e-6)


def test_lm_loss_does_not_depend_on_the_micro_batch_size(make_env, eos_policy):
    length = FunctionReward(lambda ps, cs: [float(len(c)) for c in cs], name="length")
    env = make_env(prompts=("ab", "xyz"), num_prompts=2, group_size=4, reward=length)
    agent = VAPO(eos_policy, env, value_warmup_iterations=0, positive_threshold=2.0)
    data = agent.prepare(collect(env, eos_policy, seed=0))
    counts = Counts.of(data.mask)
    whole = agent.micro_batch_loss(data, counts, agent.parallel.modules).terms["nll_loss"]
    parts = sum(
        agent.micro_batch_loss(data.rows(rows), counts, agent.parallel.modules).terms["nll_loss"]
        for rows in torch.arange(8).split(3)
    )
    torch.testing.assert_close(parts, whole)


@pytest.mark.parametrize("value_model", ["separate", "shared"])
def test_value_pretraining_moves_the_critic_and_not_the_policy(make_env, policy, value_model):
    # A reward never 0 (a completion has at least one token): the zero-initialised
    # value head has an error to fit whatever is sampled.
    length = FunctionReward(lambda ps, cs: [1.0 + len(c) for c in cs], name="length")
    env = make_env(prompts=("ab", "xyz"), num_prompts=2, group_size=2, reward=length)
    agent = VAPO(policy, env, value_warmup_iterations=2, value_model=value_model, weight_decay=0.1)
    policy_before, head_before = params(policy.model), params(agent.critic.head)
    history = agent.learn(2)
    assert [m["value_warmup"] for m in history] == [1.0, 1.0]
    assert all("nll_loss" not in m and "value_loss" in m for m in history)
    assert same(policy_before, policy.model)  # no step, no weight decay
    assert not same(head_before, agent.critic.head)
    assert all(p.requires_grad for p in policy.model.parameters())  # restored
    assert not any(p in agent.optimizer.state for p in policy.model.parameters())  # no Adam state
    (metrics,) = agent.learn(1)
    assert metrics["value_warmup"] == 0.0 and "nll_loss" in metrics
    assert not same(policy_before, policy.model)


def test_value_pretraining_keeps_frozen_parameters_frozen(make_env, policy):
    env = make_env(prompts=("ab", "xyz"), num_prompts=2, group_size=2)
    embeddings = policy.model.get_input_embeddings().weight
    wpe = policy.model.transformer.wpe.weight
    wpe.requires_grad_(False)  # e.g. a part the user froze (the agent never trains it)
    agent = VAPO(policy, env, value_warmup_iterations=1)
    agent.learn(1)
    assert embeddings.requires_grad and not wpe.requires_grad


def test_bad_config_names_the_field(make_env, policy):
    env = make_env()
    cases = [
        ({"critic_lambda": 1.5}, "critic_lambda=1.5: must be in [0, 1]"),
        ({"length_alpha": 0.0}, "length_alpha=0.0: must be > 0, or None for a fixed gae_lambda"),
        ({"value_warmup_iterations": -1}, "value_warmup_iterations=-1: must be >= 0"),
        ({"nll_coef": -0.1}, "nll_coef=-0.1: must be >= 0"),
        ({"clip_high": -0.1}, "clip_low=0.2, clip_high=-0.1: clip ranges must be >= 0"),
        ({"gae_lambda": 2.0}, "gae_lambda=2.0: must be in [0, 1]"),
        ({"value_model": "none"}, "value_model='none': PPO needs a critic"),
        ({"positive_threshold": float("nan")}, "positive_threshold=nan: must be a finite number"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            VAPO(policy, env, **overrides)
    with pytest.raises(TypeError, match="value_warmup_iterations=1.5: expected an integer"):
        VAPO(policy, env, value_warmup_iterations=1.5)


def test_save_and_load_resume_across_the_end_of_value_pretraining(make_env, tokenizer, tmp_path):
    from lmgym.policy import CausalLMPolicy, make_tiny_model

    def env():
        return make_env(prompts=("ab", "xyz"), num_prompts=2, group_size=2)

    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    agent = VAPO(policy, env(), value_warmup_iterations=2)
    agent.learn(1)
    agent.save(tmp_path / "ckpt")
    continued = agent.learn(2)
    resumed = VAPO.load(tmp_path / "ckpt", env()).learn(2)
    assert [m["value_warmup"] for m in resumed] == [1.0, 0.0]
    for a, b in zip(continued, resumed, strict=True):
        assert a["reward_mean"] == b["reward_mean"]
        assert a["value_loss"] == pytest.approx(b["value_loss"], abs=1e-6)
