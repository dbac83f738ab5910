"""Stable-Baselines3 bridge: the native ``TokenVectorEnv`` as an SB3 ``VecEnv``.

``SB3VecEnv`` steps all rows in one batched call and converts the whole batch
from torch to numpy once per step; there is no Python loop over envs except the
list of info dicts SB3's API requires, and only finished rows get a non-empty one.

Autoreset. SB3 wants *same-step* autoreset: the step on which row ``i`` finishes
returns ``done[i] = True``, the first observation of the next episode in
``obs[i]``, and the final observation in ``infos[i]["terminal_observation"]``.
lmgym's native env resets *next step* (``autoreset=True``) or never
(``autoreset=False``). The adapter bridges both the same way: after each step it
restarts exactly the finished rows with
``env.reset(options={"reset_mask": done})``, which hands them the next prompt
slots in row order, as the native autoreset would. Either autoreset mode of the
wrapped env therefore gives identical results.

Truncation. lmgym reports a completion cut off at ``max_new_tokens`` as
``truncated``, but the token budget is part of the task, not a time limit outside
it: the observation holds the position, the episode's return is complete, and
no reward follows. So by default the adapter reports such a row as done with
``infos[i]["TimeLimit.truncated"] = False``, and SB3 does not bootstrap it. SB3's
own ``DummyVecEnv`` sets ``TimeLimit.truncated`` for every ``truncated`` without
``terminated`` and then adds ``gamma * V(terminal_observation)`` to the last
reward; the terminal observation (a full buffer) never occurs as a training
state, so that value is an untrained extrapolation that depends on the last token
chosen. On the vocabulary-8, length-6 TargetString task SB3 PPO then never
reaches 0.9 in 60k env steps (final rolling means 0.2 to 0.83 over five seeds,
against about 13k steps to solve without it; ``benchmarks/results/sb3_ppo.md``).
``bootstrap_truncated=True`` restores SB3's convention.

Actions. SB3's policies sample from every action of a ``Discrete`` space and
cannot mask any, while the env refuses special tokens other than its stop ids
(``allowed_special_tokens``). So the adapter's action space is
``Discrete(len(action_ids))`` over the env's legal ids only: SB3 action ``a`` is
token ``action_ids[a]`` (``action_ids = env.legal_token_ids``, sorted; the
identity when the env refuses nothing, e.g. ``allowed_special_tokens="all"``).
Actions must be integers (SB3 passes ``[N] int64`` arrays); floats and bools are
refused.

Multi-turn envs. The default view passes a multi-turn env's ``policy_mask`` on
(``int8``, as the single env does), so the observation matches the env's space; SB3
sees the environment's tokens as part of the state, as it should, and its actions
are only ever the policy's tokens.

Observation size. SB3 policies one-hot encode ``MultiDiscrete`` observations, so
the default full-buffer observation costs ``(Lp + L) * V`` input features. The
adapter refuses, with a message naming the fix, any observation beyond
``max_features`` (default 100,000) instead of letting SB3 build a huge first layer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices, VecEnvObs, VecEnvStepReturn
from torch import Tensor, nn

from lmgym.envs.token_env import TokenVectorEnv
from lmgym.integrations.wrappers import FullObservation, ObservationView

DEFAULT_MAX_FEATURES = 100_000


# ------------------------------------------------------------- observation size
def policy_input_features(space: spaces.Space) -> dict[str, int]:
    """Input features an SB3 policy builds per observation key.

    SB3 one-hot encodes ``Discrete`` (``n``) and ``MultiDiscrete`` (``sum(nvec)``)
    spaces and flattens ``MultiBinary`` and ``Box`` (their size).

    Args:
        space: A single-env observation space (``Dict`` or a leaf space).

    Returns:
        ``{key: features}``; a leaf space has the key ``""``.

    Raises:
        TypeError: a space SB3 cannot encode (``Text``, ``Sequence``, nested ``Dict``...).
    """
    if isinstance(space, spaces.Dict):
        out = {}
        for key, sub in space.spaces.items():
            if isinstance(sub, spaces.Dict):
                raise TypeError(f"observation[{key!r}]: SB3 does not support nested Dict spaces")
            out[key] = policy_input_features(sub)[""]
        return out
    if isinstance(space, spaces.Discrete):
        return {"": int(space.n)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"": int(np.sum(space.nvec))}
    if isinstance(space, spaces.MultiBinary | spaces.Box):
        return {"": int(np.prod(space.shape))}
    raise TypeError(f"observation: SB3 policies cannot encode a {type(space).__name__} space")


def check_observation_size(
    space: spaces.Space,
    vocab_size: int,
    max_new_tokens: int,
    max_features: int = DEFAULT_MAX_FEATURES,
) -> None:
    """Raise a clear error if SB3 would one-hot ``space`` into too many features.

    Args:
        space: The single-env observation space the SB3 policy will read.
        vocab_size: ``V`` of the env (for the suggested view's size).
        max_new_tokens: ``L`` of the env (for the suggested view's size).
        max_features: The largest acceptable policy input.

    Raises:
        ValueError: the total exceeds ``max_features``; the message names the largest
            key and suggests a ``LastTokensObservation`` that fits, or, if no one-hot
            view fits, ``LastTokensObservation(as_ids=True)`` with
            ``TokenEmbeddingExtractor``.
    """
    features = policy_input_features(space)
    total = sum(features.values())
    if total <= max_features:
        return
    key, widest = max(features.items(), key=lambda item: item[1])
    name = f"observation[{key!r}]" if key else "the observation"
    sub = cast(spaces.Dict, space)[key] if key else space
    per_token = vocab_size + 1  # LastTokensObservation's V ids plus "before the text"
    k_fit = (max_features - (max_new_tokens + 1)) // per_token
    if k_fit >= 1:
        k = min(k_fit, 8)
        fix = (
            f"SB3VecEnv(env, observation=LastTokensObservation(k={k})) "
            f"({k * per_token + max_new_tokens + 1:,} features: the last {k} tokens and "
            "the position), or any k <= "
            f"{k_fit}"
        )
    else:
        fix = (
            "SB3VecEnv(env, observation=LastTokensObservation(k=8, as_ids=True)) with "
            "policy_kwargs=dict(features_extractor_class=TokenEmbeddingExtractor) "
            f"(a vocabulary of {vocab_size:,} is too large to one-hot even once)"
        )
    raise ValueError(
        f"{name} ({type(sub).__name__}, shape {sub.shape}) would be one-hot encoded by "
        f"SB3 policies into {widest:,} input features ({total:,} in all), more than "
        f"max_features={max_features:,}: vocabulary {vocab_size:,} x positions. Use a "
        f"smaller observation from lmgym.integrations, e.g. {fix}; or raise max_features "
        "if the policy really should be that wide."
    )


# ------------------------------------------------------------------ the adapter
class SB3VecEnv(VecEnv):
    """A ``TokenVectorEnv`` as a Stable-Baselines3 ``VecEnv`` (same-step autoreset).

    Args:
        env: The native vector env, either autoreset mode (see the module doc).
        observation: The view SB3 sees; default ``FullObservation()``, the ``Dict``
            buffer (use ``"MultiInputPolicy"``). ``TokenIdsObservation()`` or
            ``LastTokensObservation(k)`` give a single space for ``"MlpPolicy"``.
        max_features: Refuse observations an SB3 policy would encode into more input
            features than this (see ``check_observation_size``).
        bootstrap_truncated: ``False`` (default): a row cut off at the token budget
            is done and not bootstrapped (see the module doc). ``True``: report it as
            ``TimeLimit.truncated`` so SB3 bootstraps it, as ``DummyVecEnv`` would.
        episode_statistics: Put ``{"r": return, "l": length, "t": seconds}`` in
            ``infos[i]["episode"]`` when row ``i`` finishes, as SB3's ``VecMonitor``
            would, so ``ep_rew_mean`` is logged without wrapping.

    Observations are numpy: ``{"input_ids": [N, S] int64, "attention_mask": [N, S]
    int8}`` by default (and ``"policy_mask": [N, S] int8`` for a multi-turn env);
    rewards ``[N] float32``; dones ``[N] bool``.

    Attributes:
        action_ids: ``[A] int64`` numpy, the token id of each action (the env's legal
            ids; see the module doc).
    """

    def __init__(
        self,
        env: TokenVectorEnv,
        observation: ObservationView | None = None,
        *,
        max_features: int = DEFAULT_MAX_FEATURES,
        bootstrap_truncated: bool = False,
        episode_statistics: bool = True,
    ) -> None:
        if not isinstance(env, TokenVectorEnv):
            raise TypeError(
                f"env: expected a TokenVectorEnv (e.g. gymnasium.make_vec('lmgym/<Task>-v0', "
                f"num_envs=...)), got {type(env).__name__}; wrappers that change the "
                "observation go in `observation=` instead"
            )
        if env.responder_park_after is not None:
            raise ValueError(
                f"env: responder_park_after={env.responder_park_after} parks rows whose "
                "responder call is in flight (their actions ignored, their reward late); "
                "SB3 would train on those steps as actions. Build the env without "
                "responder_park_after for SB3 (ContinuousCollector is the loop that parks)"
            )
        self.env = env
        self.view = observation if observation is not None else FullObservation()
        observation_space = self.view.observation_space(env)
        check_observation_size(observation_space, env.vocab_size, env.max_new_tokens, max_features)
        self.bootstrap_truncated = bootstrap_truncated
        self.episode_statistics = episode_statistics
        self._actions: Tensor | None = None
        self._action_ids = env.legal_token_ids.to(env.device)
        self.action_ids = env.legal_token_ids.cpu().numpy()
        self._returns = np.zeros(env.num_envs, dtype=np.float64)
        self._lengths = np.zeros(env.num_envs, dtype=np.int64)
        self._starts = np.zeros(env.num_envs, dtype=np.float64)
        super().__init__(env.num_envs, observation_space, spaces.Discrete(len(self.action_ids)))

    # -------------------------------------------------------------- reset / step
    def reset(self) -> VecEnvObs:
        """Restart every row; uses the seed from ``seed()`` once (one seed per batch).

        Returns:
            The observation of the view, batched: ``[N, ...]`` numpy arrays.
        """
        seed = self._seeds[0]
        options = self._options[0] or None
        if any(o != self._options[0] for o in self._options):
            raise ValueError(
                "set_options: the native env takes one options dict for the whole batch; "
                "pass the same options for every env"
            )
        obs, _ = self.env.reset(seed=seed, options=options)
        self._reset_seeds()
        self._reset_options()
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self._starts[:] = time.perf_counter()
        return self._numpy_obs(obs)

    def step_async(self, actions: np.ndarray) -> None:
        """Remember ``actions`` (``[N]`` integers in ``[0, len(action_ids))``) for ``step_wait``.

        Raises:
            ValueError: not ``N`` integers (a float or bool array), or one out of range.
        """
        array = np.asarray(actions)
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError(
                f"actions: expected integer actions, got dtype {array.dtype}; SB3VecEnv's "
                f"action space is Discrete({len(self.action_ids)})"
            )
        if array.size != self.num_envs:
            raise ValueError(
                f"actions: expected {self.num_envs} actions, one per env, got shape {array.shape}"
            )
        array = array.reshape(self.num_envs)
        bad = np.flatnonzero((array < 0) | (array >= len(self.action_ids)))
        if bad.size:
            row = int(bad[0])
            raise ValueError(
                f"actions[{row}]={int(array[row])} is outside the action space "
                f"Discrete({len(self.action_ids)}); action a is token action_ids[a]"
            )
        self._actions = self._action_ids[torch.as_tensor(array, device=self.env.device)]

    def step_wait(self) -> VecEnvStepReturn:
        """Step every row, then restart the finished ones in the same call.

        Returns:
            ``(obs, rewards [N] float32, dones [N] bool, infos)``; ``obs`` is the first
            observation of the new episode on finished rows, whose final observation
            is in ``infos[i]["terminal_observation"]``.
        """
        if self._actions is None:
            raise RuntimeError("step_wait() called without step_async(actions)")
        obs, rewards, terminated, truncated, _ = self.env.step(self._actions)
        self._actions = None
        done = terminated | truncated
        rewards_np = rewards.detach().cpu().numpy().astype(np.float32, copy=False)
        done_np = done.cpu().numpy()
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        if self.episode_statistics:
            self._returns += rewards_np
            self._lengths += 1
        if done_np.any():
            terminal_obs = self._numpy_obs(obs)
            obs, _ = self.env.reset(options={"reset_mask": done})
            self._fill_infos(infos, done_np, terminal_obs, terminated, truncated)
        return self._numpy_obs(obs), rewards_np, done_np, infos

    def _fill_infos(
        self,
        infos: list[dict[str, Any]],
        done: np.ndarray,
        terminal_obs: VecEnvObs,
        terminated: Tensor,
        truncated: Tensor,
    ) -> None:
        """Write the final observation (and episode stats) of each finished row."""
        rows = np.flatnonzero(done)
        cut_off = (truncated & ~terminated).cpu().numpy() if self.bootstrap_truncated else None
        now = time.perf_counter()
        for i in rows:  # finished rows only
            info = infos[i]
            if isinstance(terminal_obs, dict):
                info["terminal_observation"] = {k: v[i] for k, v in terminal_obs.items()}
            else:
                info["terminal_observation"] = terminal_obs[i]
            info["TimeLimit.truncated"] = bool(cut_off[i]) if cut_off is not None else False
            if self.episode_statistics:
                info["episode"] = {
                    "r": float(self._returns[i]),
                    "l": int(self._lengths[i]),
                    "t": round(now - self._starts[i], 6),
                }
        if self.episode_statistics:
            self._returns[rows] = 0.0
            self._lengths[rows] = 0
            self._starts[rows] = now

    def _numpy_obs(self, obs: dict[str, Tensor]) -> VecEnvObs:
        """Apply the view and copy the whole batch to numpy once.

        A copy, not a view of the env's tensors, so a terminal observation handed
        to SB3 can never change under it.
        """
        viewed = self.view(self.env, obs)
        if isinstance(viewed, dict):
            return {key: value.detach().cpu().numpy().copy() for key, value in viewed.items()}
        return viewed.detach().cpu().numpy().copy()

    def close(self) -> None:
        self.env.close()

    # ---------------------------------------------------- SB3's per-env plumbing
    # The rows share one batched env, so attributes and methods are the env's own:
    # a getter returns the same value for every index, a setter or method acts once.
    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        value = getattr(self.env, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        self._require_all(indices, "set_attr")
        setattr(self.env, attr_name, value)

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        self._require_all(indices, "env_method")
        result = getattr(self.env, method_name)(*method_args, **method_kwargs)
        return [result for _ in range(self.num_envs)]

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None
    ) -> list[bool]:
        # No row is a separate gym.Env, so none is wrapped by a gym.Wrapper.
        return [False for _ in self._get_indices(indices)]

    def _require_all(self, indices: VecEnvIndices, what: str) -> None:
        chosen = sorted(set(self._get_indices(indices)))
        if chosen != list(range(self.num_envs)):
            raise ValueError(
                f"{what}: the rows of a TokenVectorEnv share one env; it can only act on all "
                f"{self.num_envs} envs at once (indices=None), got indices={indices!r}"
            )


def make_sb3_vec_env(
    env_id: str,
    num_envs: int,
    observation: ObservationView | None = None,
    env_kwargs: dict[str, Any] | None = None,
    *,
    max_features: int = DEFAULT_MAX_FEATURES,
    bootstrap_truncated: bool = False,
) -> SB3VecEnv:
    """``gymnasium.make_vec(env_id, num_envs, **env_kwargs)`` wrapped for SB3.

    Args:
        env_id: A registered lmgym task, e.g. ``"lmgym/TargetString-v0"``.
        num_envs: Rows of the native vector env.
        observation: See ``SB3VecEnv``.
        env_kwargs: Keyword arguments of the task's vector factory.
        max_features: See ``SB3VecEnv``.
        bootstrap_truncated: See ``SB3VecEnv``.
    """
    env = gym.make_vec(
        env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **(env_kwargs or {})
    )
    return SB3VecEnv(
        cast(TokenVectorEnv, env.unwrapped),
        observation,
        max_features=max_features,
        bootstrap_truncated=bootstrap_truncated,
    )


# ------------------------------------------------------------ features extractor
class TokenEmbeddingExtractor(BaseFeaturesExtractor):
    """Embed a ``Box`` of ids (e.g. ``LastTokensObservation(k, as_ids=True)``) for SB3.

    Column ``j`` holds an integer id in ``[0, high[j]]``. All columns share one
    embedding table of ``max(high) + 1`` rows; a learned per-column vector tells
    the columns apart. Features are the concatenation, ``[B, n_columns * embed_dim]``.
    The table grows with the vocabulary, the policy's input does not.

    Args:
        observation_space: ``Box`` of shape ``[n_columns]`` with integer bounds.
        embed_dim: Width of each column's embedding.
    """

    def __init__(self, observation_space: spaces.Box, embed_dim: int = 16) -> None:
        if not isinstance(observation_space, spaces.Box) or len(observation_space.shape) != 1:
            raise TypeError(
                "TokenEmbeddingExtractor: expected a 1-D Box of ids, e.g. "
                f"LastTokensObservation(k, as_ids=True), got {observation_space}"
            )
        n_columns = observation_space.shape[0]
        super().__init__(observation_space, features_dim=n_columns * embed_dim)
        self.embedding = nn.Embedding(int(np.max(observation_space.high)) + 1, embed_dim)
        self.column = nn.Parameter(torch.zeros(n_columns, embed_dim))

    def forward(self, observations: Tensor) -> Tensor:
        """``[B, n_columns] float32`` ids -> ``[B, n_columns * embed_dim]`` features."""
        ids = observations.round().long()
        return (self.embedding(ids) + self.column).flatten(1)


__all__: Sequence[str] = [
    "DEFAULT_MAX_FEATURES",
    "SB3VecEnv",
    "TokenEmbeddingExtractor",
    "check_observation_size",
    "make_sb3_vec_env",
    "policy_input_features",
]
