"""Stable-Baselines3 learns the toy task through the adapter, under a fixed seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stable_baselines3 import A2C, PPO
from testkit.sb3 import EpisodeReturns

from lmgym.integrations import TokenIdsObservation
from lmgym.integrations.sb3 import SB3VecEnv

pytestmark = pytest.mark.learning


@pytest.fixture
def one_thread():
    # A tiny MLP gains nothing from a second thread, and on a busy 2-core machine two
    # spinning threads can slow a run tenfold.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    "algorithm",
    [
        pytest.param(
            lambda env: PPO(
                "MlpPolicy", env, n_steps=64, batch_size=128, n_epochs=10, seed=0, device="cpu"
            ),
            id="PPO",
        ),
        pytest.param(
            lambda env: A2C("MlpPolicy", env, n_steps=8, learning_rate=3e-3, seed=0, device="cpu"),
            id="A2C",
        ),
    ],
)
def test_sb3_improves_the_reward_within_8192_steps(toy_env, one_thread, algorithm):
    env = SB3VecEnv(toy_env(16), TokenIdsObservation())
    recorder = EpisodeReturns()
    algorithm(env).learn(8192, callback=recorder)
    first, last = np.mean(recorder.returns[:100]), np.mean(recorder.returns[-100:])
    # SB3 chooses among the 6 legal ids (<pad> and <unk> are refused): random play
    # scores about 0.11 (1/6 per position, and EOS ends many episodes early); seed 0
    # starts at about 0.11 (PPO) and 0.14 (A2C) over the first 100 episodes and
    # reaches about 0.67 and 0.82 by 8192 steps.
    assert first < 0.15
    assert last > first + 0.15
