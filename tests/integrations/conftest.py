"""Fixtures for the integration tests: every registered task, and the small SB3 toy task."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs import TokenVectorEnv, env_option_names
from lmgym.envs.tasks.target_string import make_target_string_vector

#: The SB3 toy task: vocabulary 8 (<pad>, <eos>, <unk>, a..e), a 6-token target,
#: a reward every token. Random policy: about 0.1 per episode; solved: 0.9.
TOY = {"target": "decade", "prompt": "bad", "reward_mode": "per_token"}


def toy_vector_env(num_envs: int, autoreset: bool = True, **overrides) -> TokenVectorEnv:
    kwargs = {**TOY, **overrides}
    return make_target_string_vector(
        num_envs, autoreset=autoreset, tokenizer=make_char_tokenizer("abcde"), **kwargs
    )


def vector_accepts(env_id: str, name: str) -> bool:
    """Whether the task's vector entry point takes keyword ``name``."""
    return name in env_option_names(env_id)


def random_actions(
    env: TokenVectorEnv, steps: int, seed: int, stop_p: float = 0.25
) -> list[np.ndarray]:
    """``steps`` arrays of ``[N]`` token ids, uniform over the env's legal ids, with a
    stop id with probability ``stop_p`` so episodes end at varied lengths."""
    rng = np.random.default_rng(seed)
    stops = env.stop_token_ids.cpu().numpy()
    legal = env.legal_token_ids.numpy()
    out = []
    for _ in range(steps):
        ids = legal[rng.integers(0, len(legal), env.num_envs)]
        stop = rng.random(env.num_envs) < stop_p
        out.append(np.where(stop, rng.choice(stops, env.num_envs), ids).astype(np.int64))
    return out


@pytest.fixture
def toy_env() -> Callable[..., TokenVectorEnv]:
    """``toy_env(num_envs, autoreset=True, **overrides)``: the toy task's vector env."""
    return toy_vector_env


@pytest.fixture
def make_actions() -> Callable[..., list[np.ndarray]]:
    """``make_actions(env, steps, seed, stop_p=0.25)``: see ``random_actions``."""
    return random_actions


def to_sb3_actions(adapter, token_ids: np.ndarray) -> np.ndarray:
    """The adapter's actions for legal ``token_ids`` (action ``a`` is ``action_ids[a]``)."""
    actions = np.searchsorted(adapter.action_ids, token_ids)
    assert np.array_equal(adapter.action_ids[actions], token_ids)
    return actions


@pytest.fixture
def sb3_actions() -> Callable[..., np.ndarray]:
    """``sb3_actions(adapter, token_ids)``: see ``to_sb3_actions``."""
    return to_sb3_actions


@pytest.fixture
def accepts() -> Callable[[str, str], bool]:
    """``accepts(env_id, name)``: see ``vector_accepts``."""
    return vector_accepts
