"""The single env passes Gymnasium's checker; the vector env declares proper spaces."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import lmgym  # noqa: F401


def test_single_env_passes_gymnasium_check_env():
    env = gym.make("lmgym/TargetString-v0")
    check_env(env.unwrapped, skip_render_check=True)


def test_single_env_passes_gymnasium_check_env_with_its_render_mode():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checker warns on any rendering problem
        check_env(gym.make("lmgym/WordProblem-v0", render_mode="ansi").unwrapped)


def test_single_env_episode_follows_the_gymnasium_contract():
    env = gym.make("lmgym/TargetString-v0", target="hi", prompt="say hi:")
    obs, info = env.reset(seed=0)
    assert set(info) >= {"group_id", "prompt_index", "prompt_length"}
    h, i = (env.unwrapped.vector_env.tokenizer.convert_tokens_to_ids(c) for c in "hi")
    obs, reward, terminated, truncated, _ = env.step(h)
    assert (reward, terminated, truncated) == (0.0, False, False)
    obs, reward, terminated, truncated, _ = env.step(np.int64(i))
    assert (reward, terminated, truncated) == (1.0, False, True)
    assert env.unwrapped.decode(obs) == "say hi:hi"
    assert env.observation_space.contains(obs)


def test_vector_spaces_are_batched_single_spaces():
    env = gym.make_vec("lmgym/TargetString-v0", num_envs=4)
    assert env.observation_space["input_ids"].shape == (4, env.seq_len)
    assert env.action_space.shape == (4,)
    assert env.single_action_space.n == env.vocab_size
    obs, _ = env.reset(seed=0)
    numpy_obs = {k: v.numpy().astype(env.single_observation_space[k].dtype) for k, v in obs.items()}
    assert env.observation_space.contains(numpy_obs)


def test_single_factory_takes_the_vector_arguments_but_not_batching():
    from lmgym.envs.tasks.target_string import make_target_string

    params = make_target_string.arguments()
    assert "target" in params and "num_envs" not in params and "group_size" not in params
    with pytest.raises(
        TypeError, match=r"got \['group_size'\]: a single env \(gymnasium.make\) has one row"
    ):
        gym.make("lmgym/TargetString-v0", group_size=4)
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['colour'\]; valid: "):
        gym.make("lmgym/TargetString-v0", colour="red")
