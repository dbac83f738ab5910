"""A standard single ``gymnasium.Env`` facade over one row of a ``TokenVectorEnv``.

``gymnasium.make("lmgym/<Task>-v0")`` returns this: numpy observations, an ``int``
action, the usual ``reset``/``step`` contract, so Gymnasium's checker and
wrappers and Stable-Baselines3 work on it unchanged. ``single_env_factory`` makes
a task's ``gymnasium.make`` entry point from its vector factory, with the same
options (``autoreset=True`` gives Gymnasium's ``Autoreset`` wrapper: next-step
autoreset, as the vector env's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.wrappers import Autoreset

from lmgym.envs.task_factory import factory_arguments
from lmgym.envs.token_env import TokenVectorEnv


class TokenEnv(gym.Env):
    """One completion at a time: observation ``{"input_ids": [Lp+L] int64,
    "attention_mask": [Lp+L] int8}`` (a multi-turn env adds ``"policy_mask": [Lp+L]
    int8``), action a token id. ``info`` holds the vector env's ``info`` of the row:
    Python scalars, and ``policy_mask`` as a ``[Lp+L] int8`` array (multi-turn).

    Args:
        vector_env: A ``TokenVectorEnv`` with ``num_envs == 1`` and ``autoreset=False``
            (the single env follows the plain Gymnasium contract: call ``reset``
            after an episode ends). Its ``render_mode`` is this env's.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, vector_env: TokenVectorEnv) -> None:
        if vector_env.num_envs != 1 or vector_env.autoreset:
            raise ValueError(
                "vector_env: TokenEnv needs num_prompts=1, group_size=1, autoreset=False; "
                "use the vector env directly for batches"
            )
        self.vector_env = vector_env
        self.render_mode = vector_env.render_mode
        self.observation_space = vector_env.single_observation_space
        self.action_space = vector_env.single_action_space

    def _obs(self, obs: dict[str, Any]) -> dict[str, np.ndarray]:
        out = {"input_ids": obs["input_ids"][0].cpu().numpy().astype(np.int64)}
        for key in ("attention_mask", "policy_mask"):
            if key in obs:
                out[key] = obs[key][0].cpu().numpy().astype(np.int8)
        return out

    @staticmethod
    def _info(info: dict[str, Any]) -> dict[str, Any]:
        return {
            key: value[0].item() if value.dim() == 1 else value[0].cpu().numpy().astype(np.int8)
            for key, value in info.items()
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None and not self.vector_env._started:
            # Gymnasium's contract: an unseeded first reset is still seeded, from the
            # env's own np_random, so that check_env's determinism checks hold.
            seed = int(self.np_random.integers(0, 2**62))
        obs, info = self.vector_env.reset(seed=seed, options=options)
        return self._obs(obs), self._info(info)

    def step(
        self, action: int | np.integer | np.ndarray
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        action_array = np.asarray(action)
        if action_array.size != 1:
            raise ValueError(f"action: expected one token id, got shape {action_array.shape}")
        if not np.issubdtype(action_array.dtype, np.integer):  # numpy bools are not integers
            raise ValueError(
                f"action: expected an integer token id, got {action!r} (dtype "
                f"{action_array.dtype}); a float or bool is not a token id"
            )
        obs, reward, terminated, truncated, info = self.vector_env.step(
            action_array.reshape(1).astype(np.int64)
        )
        return (
            self._obs(obs),
            float(reward[0]),
            bool(terminated[0]),
            bool(truncated[0]),
            self._info(info),
        )

    def render(self) -> str | None:  # type: ignore[override]
        """The current text, prompt and completion so far (``render_mode="ansi"``);
        ``None`` with Gymnasium's warning when the env has no render mode."""
        frames = self.vector_env.render()
        return None if frames is None else frames[0]

    def decode(self, obs: dict[str, np.ndarray]) -> str:
        """The text of an observation: prompt and completion so far, the completion as
        string rewards see it (``TokenVectorEnv.decode_completions``)."""
        env = self.vector_env
        ids = torch.as_tensor(obs["input_ids"])[None]
        mask = torch.as_tensor(obs["attention_mask"]).bool()[None]
        lp = env.prompt_width
        prompt = env.tokenizer.decode(ids[0, :lp][mask[0, :lp]].tolist())
        return prompt + env.decode_completions(ids[:, lp:], mask[:, lp:])[0]


#: Vector-factory arguments a single env fixes: one row, one completion per prompt.
_SINGLE_FIXED = ("num_envs", "group_size", "num_prompts")


def single_env_factory(vector_factory: Callable[..., TokenVectorEnv]) -> Callable[..., gym.Env]:
    """The single-env face of a task (``gymnasium.make``'s ``entry_point``).

    Returns a factory with the vector factory's arguments except ``num_envs`` and
    ``group_size`` (its ``arguments()`` lists them, as ``factory_arguments`` does
    the vector factory's), which builds one row with no group and wraps it in a
    ``TokenEnv``; ``autoreset=True`` wraps that in Gymnasium's ``Autoreset``
    (next-step autoreset).
    """
    named, takes_any = factory_arguments(vector_factory)
    arguments = {name: a for name, a in named.items() if name not in _SINGLE_FIXED}
    accepted = set(arguments)

    def make(**kwargs: Any) -> gym.Env:
        fixed = sorted(set(kwargs) & set(_SINGLE_FIXED))
        if fixed:
            raise TypeError(
                f"{make.__name__}() got {fixed}: a single env (gymnasium.make) has one row "
                "and one completion per prompt; use gymnasium.make_vec(id, num_envs=..., "
                "group_size=...) for batches"
            )
        unknown = sorted(set(kwargs) - accepted)
        if unknown and not takes_any:
            raise TypeError(
                f"{make.__name__}() got unknown argument(s) {unknown}; valid: {sorted(accepted)}"
            )
        autoreset = bool(kwargs.pop("autoreset", False))
        if "autoreset" in accepted or takes_any:
            kwargs["autoreset"] = False  # the wrapper below does it, the Gymnasium way
        env = TokenEnv(vector_factory(num_envs=1, group_size=1, **kwargs))
        return Autoreset(env) if autoreset else env

    name = vector_factory.__name__.removesuffix("_vector")
    make.__name__ = make.__qualname__ = name
    make.__module__ = vector_factory.__module__
    make.__doc__ = (
        f"``{vector_factory.__name__}`` as a single env (``gymnasium.make``): one row, "
        "numpy observations; other arguments as the vector factory."
    )
    make.arguments = lambda: dict(arguments)  # type: ignore[attr-defined]
    make.metadata = TokenEnv.metadata  # type: ignore[attr-defined]  # gymnasium.make reads render_modes here
    return make
