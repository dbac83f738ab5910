"""The SB3 adapter: exact same-step autoreset semantics, SB3's plumbing, clear bad-input errors."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from stable_baselines3 import PPO

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs import TASKS
from lmgym.envs.tasks.target_string import make_target_string_vector
from lmgym.integrations import LastTokensObservation, TokenIdsObservation
from lmgym.integrations.sb3 import (
    SB3VecEnv,
    TokenEmbeddingExtractor,
    check_observation_size,
    make_sb3_vec_env,
    policy_input_features,
)

TASK_IDS = sorted(TASKS)


def _assert_obs_equal(actual, expected) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        assert actual[key].dtype == expected[key].dtype, key
        np.testing.assert_array_equal(actual[key], expected[key], err_msg=key)


# ------------------------------------------------ same-step autoreset, exactly
@pytest.mark.parametrize("reward_mode", ["per_token", "bandit"])
@pytest.mark.parametrize("autoreset", [True, False])
def test_adapter_equals_gymnasium_same_step_sync_vector_env(
    toy_env, make_actions, sb3_actions, reward_mode, autoreset
):
    """Gymnasium's own SAME_STEP autoreset over N single envs is the reference.

    The toy task has one prompt, so N independent single envs and one batched env
    show the same observations whatever order prompts are handed out in.
    """
    n = 4
    tokenizer = make_char_tokenizer("abcde")
    kwargs = {"target": "decade", "prompt": "bad", "reward_mode": reward_mode}
    reference = SyncVectorEnv(
        [lambda: gym.make("lmgym/TargetString-v0", tokenizer=tokenizer, **kwargs)] * n,
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    native = toy_env(n, autoreset=autoreset, reward_mode=reward_mode)
    adapter = SB3VecEnv(native, bootstrap_truncated=True)

    ref_obs, _ = reference.reset(seed=0)
    _assert_obs_equal(adapter.reset(), ref_obs)
    finished = 0
    for actions in make_actions(native, 60, seed=0):
        ref_obs, ref_rewards, terminated, truncated, ref_info = reference.step(actions)
        obs, rewards, dones, infos = adapter.step(sb3_actions(adapter, actions))
        _assert_obs_equal(obs, ref_obs)
        assert rewards.dtype == np.float32
        np.testing.assert_array_equal(rewards, ref_rewards.astype(np.float32))
        np.testing.assert_array_equal(dones, terminated | truncated)
        for i in range(n):
            if not dones[i]:
                assert infos[i] == {}
                continue
            finished += 1
            _assert_obs_equal(infos[i]["terminal_observation"], ref_info["final_obs"][i])
            assert infos[i]["TimeLimit.truncated"] == bool(truncated[i] and not terminated[i])
    assert finished > 20  # many episodes, ending both by EOS and by the token budget


@pytest.mark.parametrize("env_id", TASK_IDS)
def test_adapter_equals_native_env_restarting_finished_rows(
    env_id, make_actions, sb3_actions, accepts
):
    """For every task: the adapter (over a next-step autoreset env where the task
    allows one) equals the native episode-synchronous env stepped and restarted by
    hand with ``reset_mask``, row for row, on the same seed and actions."""
    kwargs = {"autoreset": True} if accepts(env_id, "autoreset") else {}
    adapter = SB3VecEnv(gym.make_vec(env_id, num_envs=4, **kwargs))
    native = gym.make_vec(env_id, num_envs=4)
    assert native.metadata["autoreset_mode"] == AutoresetMode.DISABLED

    def numpy_obs(obs):
        # ids as they are, the masks (attention, and a multi-turn env's policy) as int8
        return {
            k: v.numpy() if k == "input_ids" else v.numpy().astype(np.int8) for k, v in obs.items()
        }

    adapter.seed(11)
    ref_obs, _ = native.reset(seed=11)
    _assert_obs_equal(adapter.reset(), numpy_obs(ref_obs))
    ref_return = np.zeros(4)
    for actions in make_actions(native, 30, seed=5):
        obs, rewards, dones, infos = adapter.step(sb3_actions(adapter, actions))
        ref_obs, ref_rewards, terminated, truncated, _ = native.step(torch.as_tensor(actions))
        ref_dones = (terminated | truncated).numpy()
        ref_return += ref_rewards.numpy()
        np.testing.assert_array_equal(rewards, ref_rewards.numpy())
        np.testing.assert_array_equal(dones, ref_dones)
        for i in np.flatnonzero(ref_dones):
            _assert_obs_equal(
                infos[i]["terminal_observation"], {k: v[i] for k, v in numpy_obs(ref_obs).items()}
            )
            assert infos[i]["TimeLimit.truncated"] is False  # the budget is part of the task
            assert infos[i]["episode"]["r"] == pytest.approx(ref_return[i], abs=1e-5)
        ref_return[ref_dones] = 0.0
        if ref_dones.any():
            ref_obs, _ = native.reset(options={"reset_mask": terminated | truncated})
        _assert_obs_equal(obs, numpy_obs(ref_obs))


def test_adapter_episode_statistics_match_the_episode(toy_env, sb3_actions):
    adapter = SB3VecEnv(toy_env(2))
    adapter.reset()
    a, d, c, e = (adapter.env.tokenizer.convert_tokens_to_ids(ch) for ch in "adce")
    eos = adapter.env.tokenizer.eos_token_id
    # Row 0 writes "decade" (return 1, length 6); row 1 writes "d", "e", then EOS.
    script = [[d, d], [e, e], [c, eos], [a, d], [d, d], [e, d]]
    for t, actions in enumerate(script):
        _, _, dones, infos = adapter.step(sb3_actions(adapter, np.array(actions)))
        if t == 2:
            assert infos[1]["episode"]["l"] == 3
            assert infos[1]["episode"]["r"] == pytest.approx(2 / 6)
    assert dones[0] and infos[0]["episode"]["l"] == 6
    assert infos[0]["episode"]["r"] == pytest.approx(1.0)


# ------------------------------------------------------------ SB3 plumbing
def test_sb3_plumbing(toy_env):
    adapter = SB3VecEnv(toy_env(3))
    # 8 ids, of which <pad> and <unk> are refused: SB3 sees the other 6.
    assert adapter.num_envs == 3 and adapter.action_space == gym.spaces.Discrete(6)
    assert adapter.action_ids.tolist() == [1, 3, 4, 5, 6, 7]
    assert adapter.get_attr("vocab_size") == [8, 8, 8]
    assert adapter.get_attr("max_new_tokens", indices=[1]) == [6]
    assert adapter.env_is_wrapped(gym.Wrapper) == [False, False, False]
    assert adapter.env_method("decode_completions", torch.tensor([[5, 6]])) == [["cd"]] * 3
    adapter.set_attr("unfinished_penalty", -2.0)
    assert adapter.env.unfinished_penalty == -2.0
    with pytest.raises(ValueError, match=r"set_attr: the rows of a TokenVectorEnv share one env"):
        adapter.set_attr("unfinished_penalty", 0.0, indices=[0])
    with pytest.raises(ValueError, match=r"env_method: .* got indices=1"):
        adapter.env_method("close", indices=1)
    with pytest.raises(RuntimeError, match=r"step_wait\(\) called without step_async"):
        adapter.step_wait()


def test_adapter_refuses_non_integer_actions(toy_env):
    adapter = SB3VecEnv(toy_env(2))
    adapter.reset()
    for bad in (np.array([1.0, 2.0]), np.array([2.7, 1.2]), np.array([True, False])):
        with pytest.raises(ValueError, match=r"actions: expected integer actions, got dtype"):
            adapter.step(bad)
    with pytest.raises(
        ValueError, match=r"actions\[1\]=6 is outside the action space Discrete\(6\)"
    ):
        adapter.step(np.array([0, 6]))
    _, _, dones, _ = adapter.step(np.array([0, 1], dtype=np.int64))  # action 0 is <eos>
    assert dones.tolist() == [True, False]


def test_sb3_ppo_never_sends_a_refused_special_token(toy_env, monkeypatch):
    adapter = SB3VecEnv(toy_env(4))
    sent = []
    step = adapter.env.step
    monkeypatch.setattr(adapter.env, "step", lambda actions: sent.append(actions) or step(actions))
    PPO("MultiInputPolicy", adapter, n_steps=16, batch_size=32, n_epochs=1, seed=0).learn(64)
    sent = torch.stack(sent)
    assert not torch.isin(sent, torch.tensor([0, 2])).any()  # <pad>, <unk>
    assert set(sent.unique().tolist()) == set(adapter.action_ids.tolist())


def test_seed_reseeds_the_prompt_stream():
    env_id = "lmgym/Reverse-v0" if "lmgym/Reverse-v0" in TASKS else TASK_IDS[0]
    adapter = make_sb3_vec_env(env_id, 4)
    native = gym.make_vec(env_id, num_envs=4)
    adapter.seed(123)
    first = adapter.reset()
    np.testing.assert_array_equal(first["input_ids"], native.reset(seed=123)[0]["input_ids"])
    adapter.seed(123)
    np.testing.assert_array_equal(adapter.reset()["input_ids"], first["input_ids"])


def test_different_options_per_env_are_refused(toy_env):
    adapter = SB3VecEnv(toy_env(2))
    adapter.set_options([{"a": 1}, {"a": 2}])
    with pytest.raises(ValueError, match="one options dict for the whole batch"):
        adapter.reset()


def test_a_non_native_env_is_refused(toy_env):
    with pytest.raises(TypeError, match=r"env: expected a TokenVectorEnv .* got SyncVectorEnv"):
        SB3VecEnv(gym.make_vec("lmgym/TargetString-v0", 2, vectorization_mode="sync"))


# ------------------------------------------------------------------ bad input
def _wide_vocab_env(num_chars: int, prompt_len: int, target_len: int):
    chars = "ab" + "".join(chr(0x4E00 + i) for i in range(num_chars - 2))
    tokenizer = make_char_tokenizer(chars)
    return make_target_string_vector(
        2, target="ab" * (target_len // 2), prompt="a" * prompt_len, tokenizer=tokenizer
    )


def test_too_wide_observation_names_the_key_and_the_fitting_view():
    env = _wide_vocab_env(5000, prompt_len=20, target_len=10)  # V = 5003, S = 30
    expected = (
        "observation['input_ids'] (MultiDiscrete, shape (30,)) would be one-hot encoded by "
        "SB3 policies into 150,090 input features (150,120 in all), more than "
        "max_features=100,000: vocabulary 5,003 x positions. Use a smaller observation from "
        "lmgym.integrations, e.g. SB3VecEnv(env, observation=LastTokensObservation(k=8)) "
        "(40,043 features: the last 8 tokens and the position), or any k <= 19; or raise "
        "max_features if the policy really should be that wide."
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        SB3VecEnv(env)
    # The suggested fix works: SB3 builds a policy of the promised width and trains.
    adapter = SB3VecEnv(env, LastTokensObservation(k=8))
    assert sum(policy_input_features(adapter.observation_space).values()) == 40_043
    PPO("MlpPolicy", adapter, n_steps=8, batch_size=16, n_epochs=1, seed=0).learn(16)


def test_vocabulary_too_wide_for_any_one_hot_suggests_the_embedding_extractor(toy_env):
    env = toy_env(2)  # V = 8, L = 6: one one-hot token costs 9 + 7 features
    with pytest.raises(ValueError, match=r"too large to one-hot even once") as caught:
        SB3VecEnv(env, TokenIdsObservation(), max_features=15)
    assert "LastTokensObservation(k=8, as_ids=True)" in str(caught.value)
    assert "features_extractor_class=TokenEmbeddingExtractor" in str(caught.value)
    adapter = SB3VecEnv(env, LastTokensObservation(k=8, as_ids=True), max_features=15)
    model = PPO(
        "MlpPolicy",
        adapter,
        n_steps=8,
        batch_size=16,
        n_epochs=1,
        seed=0,
        policy_kwargs={"features_extractor_class": TokenEmbeddingExtractor},
    )
    model.learn(16)
    assert isinstance(model.policy.features_extractor, TokenEmbeddingExtractor)


def test_check_observation_size_accepts_what_fits(toy_env):
    env = toy_env(2)
    check_observation_size(env.single_observation_space, 8, 6, max_features=9 * 8 + 9)
    with pytest.raises(ValueError, match=r"observation\['input_ids'\]"):
        check_observation_size(env.single_observation_space, 8, 6, max_features=9 * 8 + 8)
    with pytest.raises(TypeError, match="cannot encode a Text space"):
        policy_input_features(gym.spaces.Text(5))
