"""ReMax: the greedy-completion baseline, its rollout's isolation, and its config."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from lmgym.agents import REINFORCE, ReMax
from lmgym.envs import CombinedReward, FunctionReward
from lmgym.rollout import collect


def char_codes(prompts: list[str], completions: list[str]) -> list[float]:
    """A reward that tells any two completions apart: the sum of their character codes."""
    return [float(sum(ord(c) for c in completion)) for completion in completions]


def greedy_ids(policy, prompt: str, max_new_tokens: int) -> list[int]:
    """Arg-max decoding one token at a time on the whole text, without the policy's cache."""
    tokenizer = policy.tokenizer
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    new: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = policy.model(torch.tensor([ids + new])).logits[0, -1, : len(tokenizer)]
            new.append(int(logits.argmax()))
            if new[-1] == tokenizer.eos_token_id:
                break
    return new


def greedy_text(policy, prompt: str, max_new_tokens: int) -> str:
    return policy.tokenizer.decode(
        greedy_ids(policy, prompt, max_new_tokens), skip_special_tokens=True
    )


def test_advantage_is_the_score_minus_the_greedy_score_hand_values(make_env, policy):
    env = make_env(prompts=("ab", "xyz"), num_prompts=2, group_size=2)
    agent = ReMax(policy, env)
    batch = collect(env, policy, seed=0)
    agent.greedy_baseline = lambda batch: torch.tensor([0.5, 0.5, 2.0, 2.0])
    rewards = torch.tensor([[0.0, 1.0, 0.0], [3.0, 0.0, 9.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    advantages, returns = agent.advantages(batch, rewards, mask, None)
    # R = [1, 3, 1, 2] (the 9 sits past row 1's end); A = R - b, on every real token.
    expected = torch.tensor([[0.5, 0.5, 0.5], [2.5, 0.0, 0.0], [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(advantages, expected)
    assert returns is None


def test_greedy_baseline_scores_the_arg_max_completion_of_each_rows_prompt(make_env, policy):
    prompts = ("ab", "xyz", "q")
    env = make_env(prompts=prompts, num_prompts=3, group_size=2, reward=FunctionReward(char_codes))
    agent = ReMax(policy, env)
    batch = collect(env, policy, seed=0)
    expected = torch.tensor(
        [char_codes([], [greedy_text(policy, prompts[i], 4)])[0] for i in batch.prompt_index]
    )
    assert len(set(expected.tolist())) > 1  # the prompts' greedy completions differ
    torch.testing.assert_close(agent.greedy_baseline(batch), expected)


def test_greedy_baseline_adds_overlong_shaping_of_the_greedy_length(make_env, policy):
    env = make_env(prompts=("ab",), num_prompts=1, group_size=2, max_new_tokens=4)
    plain = ReMax(policy, env).greedy_baseline(collect(env, policy, seed=0))
    shaped = ReMax(policy, env, overlong_cache=2).greedy_baseline(collect(env, policy, seed=0))
    length = len(greedy_ids(policy, "ab", 4))
    assert length > 2  # inside the overlong window: shaping (2 - T) / 2
    torch.testing.assert_close(shaped, plain + (2 - length) / 2)


def test_greedy_rollout_moves_neither_the_sampler_nor_the_prompt_stream(make_env, tokenizer):
    from lmgym.policy import CausalLMPolicy, make_tiny_model

    def run(agent_class, greedy: bool):
        policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
        env = make_env(prompts=("ab", "xyz", "q", "mn"), num_prompts=2, group_size=2)
        agent = agent_class(policy, env, seed=3)
        batches = []
        for _ in range(3):
            batch, _ = agent.collect()
            batches.append(batch)
            if greedy:
                torch_state = torch.get_rng_state()
                agent.greedy_baseline(batch)
                assert torch.equal(torch.get_rng_state(), torch_state)
        return batches, agent.tokens_generated

    remax_batches, remax_tokens = run(ReMax, greedy=True)
    reinforce_batches, reinforce_tokens = run(REINFORCE, greedy=False)
    for mine, theirs in zip(remax_batches, reinforce_batches, strict=True):
        for field in fields(mine):
            assert torch.equal(getattr(mine, field.name), getattr(theirs, field.name)), field.name
    # The greedy tokens count too: 2 rows of at most 4 tokens per rollout.
    assert 3 * 2 <= remax_tokens - reinforce_tokens <= 3 * 2 * 4


def test_greedy_rollout_restores_top_k_even_when_the_reward_fails(make_env, policy):
    calls = []

    def flaky(prompts, completions):
        calls.append(len(completions))
        if len(calls) > 1:  # the sampled draw passes, the greedy rollout fails
            raise RuntimeError("scorer down")
        return [0.0] * len(completions)

    env = make_env(prompts=("ab",), num_prompts=1, group_size=2, reward=FunctionReward(flaky))
    policy.top_k = 7
    agent = ReMax(policy, env)
    batch = collect(env, policy, seed=0)
    with pytest.raises(ValueError, match="scorer down"):
        agent.greedy_baseline(batch)
    assert policy.top_k == 7


def test_learning_logs_the_baseline_and_only_the_sampled_reward_components(make_env, policy):
    count_a = FunctionReward(lambda ps, cs: [float(c.count("a")) for c in cs], name="count_a")
    env = make_env(
        prompts=("ab", "xyz"), num_prompts=2, group_size=4, reward=CombinedReward([(count_a, 1.0)])
    )
    history = ReMax(policy, env).learn(2)
    # The greedy completions ("baaa", "zzzz") score otherwise than the samples, so a
    # component mean that took them in would differ from the sampled batch's mean.
    assert all(m["greedy_reward_mean"] != m["reward_mean"] for m in history)
    for metrics in history:
        assert metrics["reward/count_a"] == pytest.approx(metrics["reward_mean"])


def test_learns_on_an_autoreset_env(make_env, policy):
    env = make_env(prompts=("ab", "xyz"), num_prompts=2, group_size=2, autoreset=True)
    history = ReMax(policy, env).learn(2)
    assert [m["iteration"] for m in history] == [1.0, 2.0]


def test_bad_config_names_the_field(make_env, policy):
    env = make_env()
    with pytest.raises(ValueError, match="kl_placement='rewards' is not one of"):
        ReMax(policy, env, kl_placement="rewards")
    with pytest.raises(ValueError, match="ref_policy: beta=0.1 needs a frozen reference"):
        ReMax(policy, env, beta=0.1)


def test_save_and_load_resume_exactly(make_env, tokenizer, tmp_path):
    from lmgym.policy import CausalLMPolicy, make_tiny_model

    def env():
        return make_env(prompts=("ab", "xyz", "q"), num_prompts=2, group_size=2)

    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=0), tokenizer)
    agent = ReMax(policy, env())
    agent.learn(1)
    agent.save(tmp_path / "ckpt")
    continued = agent.learn(2)
    resumed = ReMax.load(tmp_path / "ckpt", env()).learn(2)
    for a, b in zip(continued, resumed, strict=True):
        assert a["reward_mean"] == b["reward_mean"]
        assert a["greedy_reward_mean"] == b["greedy_reward_mean"]
        assert a["tokens_generated"] == b["tokens_generated"]


def test_remax_greedy_baseline_sees_the_prompt_sources_reward_columns():
    """The greedy env shares the training env's prompt source, so a reward that reads
    a column (here ``answer``) scores the greedy completion too."""
    from lmgym.agents import ReMax
    from lmgym.envs import FunctionReward, RecordPrompts, TokenVectorEnv
    from lmgym.policy import CausalLMPolicy, make_char_tokenizer, make_tiny_model

    def starts_right(prompts, completions, answer):
        return [float(c[:1] == a[:1]) for c, a in zip(completions, answer, strict=True)]

    tokenizer = make_char_tokenizer()
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer)), tokenizer)
    records = [{"prompt": "a:", "answer": "x"}, {"prompt": "b:", "answer": "y"}]
    env = TokenVectorEnv(
        tokenizer,
        RecordPrompts(records),
        FunctionReward(starts_right),
        num_prompts=2,
        group_size=2,
        max_new_tokens=3,
    )
    metrics = ReMax(policy, env).learn(1)[0]
    assert 0.0 <= metrics["greedy_reward_mean"] <= 1.0
