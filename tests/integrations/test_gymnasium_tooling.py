"""Every registered task passes both env checkers and works under Gymnasium's wrappers."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env as gymnasium_check_env
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers import vector as vector_wrappers
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from lmgym.envs import TASKS
from lmgym.integrations import (
    FullObservation,
    LastTokensObservation,
    TerminateOnTokenBudget,
    TokenIdsObservation,
    TokenObservationWrapper,
    TorchToNumpy,
    VectorTokenObservation,
)

TASK_IDS = sorted(TASKS)
VIEWS = {
    "full": FullObservation(),
    "ids": TokenIdsObservation(),
    "last3": LastTokensObservation(3),
    "last3_ids": LastTokensObservation(3, as_ids=True),
}
# Gymnasium says this when handed a wrapper; checking a wrapper is the point here.
WRAPPED_NOTE = "is different from the unwrapped version"


def _non_stop_action(env: gym.Env) -> int:
    stops = set(env.unwrapped.vector_env.stop_token_ids.tolist())
    legal = env.unwrapped.vector_env.legal_token_ids.tolist()
    return next(i for i in legal if i not in stops)


def _checked(check, env: gym.Env, **kwargs) -> list[str]:
    """Run a checker and return the warnings it raised (other than WRAPPED_NOTE)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check(env, **kwargs)
    return [str(w.message) for w in caught if WRAPPED_NOTE not in str(w.message)]


# ------------------------------------------------------------------- checkers
@pytest.mark.parametrize("env_id", TASK_IDS)
def test_single_env_passes_gymnasium_check_env_without_warnings(env_id):
    env = gym.make(env_id)
    assert _checked(gymnasium_check_env, env.unwrapped, skip_render_check=True) == []


@pytest.mark.parametrize("env_id", TASK_IDS)
def test_single_env_passes_sb3_check_env_without_warnings(env_id):
    # warn=True also runs SB3's "is this space supported" checks.
    assert _checked(sb3_check_env, gym.make(env_id).unwrapped, warn=True) == []
    assert _checked(sb3_check_env, gym.make(env_id), warn=True) == []


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("env_id", TASK_IDS)
def test_observation_views_pass_both_checkers(env_id, view):
    env = TokenObservationWrapper(gym.make(env_id), VIEWS[view])
    assert _checked(gymnasium_check_env, env, skip_render_check=True) == []
    assert _checked(sb3_check_env, env, warn=True) == []


# ------------------------------------------------------- single-env wrappers
@pytest.mark.parametrize("env_id", TASK_IDS)
def test_record_episode_statistics_sums_the_rewards(env_id):
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
    env.action_space.seed(0)
    for episode in range(3):
        env.reset(seed=episode)
        total, length, done = 0.0, 0, False
        while not done:
            _, reward, terminated, truncated, info = env.step(env.action_space.sample())
            total, length, done = total + reward, length + 1, terminated or truncated
        assert info["episode"]["l"] == length
        assert info["episode"]["r"] == pytest.approx(total, abs=1e-6)


@pytest.mark.parametrize("env_id", TASK_IDS)
def test_time_limit_truncates_after_two_steps(env_id):
    env = gym.wrappers.TimeLimit(gym.make(env_id), max_episode_steps=2)
    env.reset(seed=0)
    action = _non_stop_action(env)
    _, _, terminated, truncated, _ = env.step(action)
    assert not terminated
    assert truncated == (env.unwrapped.vector_env.max_new_tokens == 1)
    _, _, terminated, truncated, _ = env.step(action)
    assert (terminated, truncated) == (False, True)


@pytest.mark.parametrize("env_id", TASK_IDS)
def test_flatten_and_filter_observation(env_id):
    base = gym.make(env_id)
    seq_len = base.unwrapped.vector_env.seq_len
    vocab = base.unwrapped.vector_env.vocab_size
    flat = gym.wrappers.FlattenObservation(base)
    obs, _ = flat.reset(seed=0)
    # Gymnasium flattens MultiDiscrete one-hot and MultiBinary as is: the attention
    # mask, and a multi-turn env's policy mask.
    masks = 2 if base.unwrapped.vector_env.responder is not None else 1
    assert obs.shape == (seq_len * vocab + masks * seq_len,)
    assert flat.observation_space.contains(obs)
    only_ids = gym.wrappers.FilterObservation(gym.make(env_id), ["input_ids"])
    obs, _ = only_ids.reset(seed=0)
    assert list(obs) == ["input_ids"] and obs["input_ids"].shape == (seq_len,)


@pytest.mark.parametrize("env_id", TASK_IDS)
def test_terminate_on_token_budget(env_id):
    env = TerminateOnTokenBudget(gym.make(env_id))
    env.reset(seed=0)
    action = _non_stop_action(env)
    for _ in range(env.unwrapped.vector_env.max_new_tokens):
        _, _, terminated, truncated, _ = env.step(action)
    assert (terminated, truncated) == (True, False)
    # A TimeLimit on top still truncates.
    limited = gym.wrappers.TimeLimit(TerminateOnTokenBudget(gym.make(env_id)), 1)
    limited.reset(seed=0)
    _, _, terminated, truncated, _ = limited.step(action)
    assert truncated


# -------------------------------------------------------- vector-env wrappers
def _drive(env: gym.vector.VectorEnv, actions: list[np.ndarray]):
    """Step ``env`` with ``actions``, restarting finished rows as its autoreset mode needs.

    Yields ``(rewards, dones, info)`` per step.
    """
    disabled = env.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    for step_actions in actions:
        _, rewards, terminated, truncated, info = env.step(step_actions)
        dones = np.logical_or(terminated, truncated)
        yield rewards, dones, info
        if disabled and dones.any():
            env.reset(options={"reset_mask": dones})


@pytest.mark.parametrize("env_id", TASK_IDS)
def test_vector_record_episode_statistics_over_torch_to_numpy(env_id, make_actions):
    native = gym.make_vec(env_id, num_envs=4)
    if native.max_new_tokens > 32:  # a game's long budget: 40 random steps must end one
        native = gym.make_vec(env_id, num_envs=4, max_new_tokens=32)
    env = vector_wrappers.RecordEpisodeStatistics(TorchToNumpy(native))
    obs, info = env.reset(seed=0)
    assert isinstance(obs["input_ids"], np.ndarray) and obs["attention_mask"].dtype == np.int8
    assert env.single_observation_space.contains({k: v[0] for k, v in obs.items()})
    next_step = env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    running = np.zeros(4)
    skip = np.zeros(4, dtype=bool)  # next-step autoreset: the step after a done is a reset
    episodes = 0
    for rewards, dones, info in _drive(env, make_actions(native, 40, seed=1)):
        assert isinstance(rewards, np.ndarray) and isinstance(dones, np.ndarray)
        running = np.where(skip, 0.0, running + rewards)
        if dones.any():
            np.testing.assert_allclose(info["episode"]["r"][dones], running[dones], atol=1e-6)
            episodes += int(dones.sum())
            running[dones] = 0.0
        skip = dones if next_step else np.zeros(4, dtype=bool)
    assert episodes > 0 and len(env.return_queue) == min(episodes, 100)


@pytest.mark.parametrize("env_id", TASK_IDS)
def test_vector_observation_view_and_transform_reward(env_id, make_actions):
    native = gym.make_vec(env_id, num_envs=4)
    view = LastTokensObservation(2)
    env = vector_wrappers.TransformReward(
        TorchToNumpy(VectorTokenObservation(native, view)), lambda r: 2.0 * r
    )
    reference = gym.make_vec(env_id, num_envs=4)
    obs, _ = env.reset(seed=3)
    ref_obs, _ = reference.reset(seed=3)
    np.testing.assert_array_equal(obs, view(reference, ref_obs).numpy())
    assert env.observation_space.contains(obs)
    for actions in make_actions(native, 10, seed=2):
        obs, rewards, *_ = env.step(actions)
        ref_obs, ref_rewards, terminated, truncated, _ = reference.step(torch.as_tensor(actions))
        np.testing.assert_array_equal(obs, view(reference, ref_obs).numpy())
        np.testing.assert_array_equal(rewards, 2.0 * ref_rewards.numpy())
        done = terminated | truncated
        if reference.metadata["autoreset_mode"] == AutoresetMode.DISABLED and done.any():
            reference.reset(options={"reset_mask": done})
            env.reset(options={"reset_mask": done.numpy()})
