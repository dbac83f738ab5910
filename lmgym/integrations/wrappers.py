"""Observation views and Gymnasium wrappers that let standard RL tooling read lmgym envs.

lmgym's observation is the whole token buffer, ``{"input_ids": [N, S] int64,
"attention_mask": [N, S] bool}`` with ``S = Lp + L`` (prompt width plus token
budget). That is Markov and exactly what a language model reads, but a generic
policy such as Stable-Baselines3's ``MlpPolicy`` one-hot encodes every
``MultiDiscrete`` position, i.e. ``S * V`` input features for a vocabulary of
``V`` ids. An *observation view* is a batched, vectorised function of the buffer
that gives such policies something smaller:

- ``FullObservation``: the buffer itself (``Dict`` of ids and mask).
- ``TokenIdsObservation``: the ids alone (``MultiDiscrete``), for ``MlpPolicy``.
- ``LastTokensObservation``: the last ``k`` tokens of the text plus the number of
  completion tokens so far, ``k * (V + 1) + L + 1`` one-hot features whatever the
  prompt width; with ``as_ids=True`` a ``Box`` of raw ids for an embedding
  features extractor (``lmgym.integrations.sb3.TokenEmbeddingExtractor``) when
  even one one-hot position is too wide.

``TerminateOnTokenBudget`` reports the end of the token budget as ``terminated``
on the single env, for libraries that would otherwise bootstrap it (see its doc).

A view is applied in three places: by the Stable-Baselines3 adapter
(``lmgym.integrations.sb3.SB3VecEnv(env, observation=view)``), on the single env
(``TokenObservationWrapper``, a ``gymnasium.ObservationWrapper``) and on the native
vector env (``VectorTokenObservation``). ``TorchToNumpy`` turns the native vector
env's torch outputs into numpy so that Gymnasium's numpy-based vector wrappers
(``RecordEpisodeStatistics``, ``NormalizeReward``, ...) apply to it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import VectorEnv, VectorObservationWrapper, VectorWrapper
from gymnasium.vector.utils import batch_space
from torch import Tensor

from lmgym.envs.token_env import TokenVectorEnv

TensorObs = Tensor | dict[str, Tensor]


class ObservationView(ABC):
    """A batched function of the token buffer and the single-env space it lands in.

    Implementations are pure: they never write into the tensors they are given.
    """

    @abstractmethod
    def observation_space(self, env: TokenVectorEnv) -> spaces.Space:
        """The single-env observation space of the view on ``env``."""

    @abstractmethod
    def __call__(self, env: TokenVectorEnv, obs: dict[str, Tensor]) -> TensorObs:
        """Apply the view to a batch.

        Args:
            env: The env the buffer comes from (for ``V``, ``Lp``, ``L``).
            obs: ``{"input_ids": [B, S] int64, "attention_mask": [B, S] bool}``.

        Returns:
            ``[B, ...]`` tensors whose dtypes are the space's dtypes, so that
            ``.numpy()`` lands inside ``observation_space(env)``.
        """


class FullObservation(ObservationView):
    """The whole buffer: ``{"input_ids": [B, S] int64, "attention_mask": [B, S] int8}``,
    and for a multi-turn env ``"policy_mask": [B, S] int8`` (the policy's tokens).

    The same space and dtypes as the single env ``lmgym.envs.TokenEnv``.
    """

    def observation_space(self, env: TokenVectorEnv) -> spaces.Space:
        return env.single_observation_space

    def __call__(self, env: TokenVectorEnv, obs: dict[str, Tensor]) -> TensorObs:
        out = {
            "input_ids": obs["input_ids"].long(),
            "attention_mask": obs["attention_mask"].to(torch.int8),
        }
        if "policy_mask" in obs:
            out["policy_mask"] = obs["policy_mask"].to(torch.int8)
        return out


class TokenIdsObservation(ObservationView):
    """The ids alone, ``[B, S] int64`` in ``MultiDiscrete([V] * S)``.

    Padding is the tokenizer's pad id, so the mask is redundant unless the pad id
    is also a real token inside a prompt. SB3's ``MlpPolicy`` one-hot encodes it:
    ``S * V`` input features.
    """

    def observation_space(self, env: TokenVectorEnv) -> spaces.Space:
        return spaces.MultiDiscrete(np.full((env.seq_len,), env.vocab_size, dtype=np.int64))

    def __call__(self, env: TokenVectorEnv, obs: dict[str, Tensor]) -> TensorObs:
        return obs["input_ids"].long()


class LastTokensObservation(ObservationView):
    """The last ``k`` tokens of the text (prompt + completion so far) and the position.

    Entry ``j < k`` of a row is the ``(k - j)``-th last real token, or ``V`` (an id
    no token has) where the text is shorter than ``k``; entry ``k`` is the number
    of completion tokens so far, ``0..L``. The result is Markov whenever ``k`` covers
    the prompt and the completion, and a compact summary otherwise.

    Args:
        k: Tokens to keep (``k >= 1``).
        as_ids: ``False`` (default): ``MultiDiscrete([V + 1] * k + [L + 1])``, int64,
            which SB3 one-hot encodes into ``k * (V + 1) + L + 1`` features.
            ``True``: a float32 ``Box`` of the same ids (bounds ``[0, V]`` and
            ``[0, L]``), which SB3 passes through unencoded; pair it with
            ``TokenEmbeddingExtractor`` for vocabularies too large to one-hot.
    """

    def __init__(self, k: int, as_ids: bool = False) -> None:
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r}: must be a positive integer")
        self.k = k
        self.as_ids = as_ids

    def _nvec(self, env: TokenVectorEnv) -> np.ndarray:
        return np.array([env.vocab_size + 1] * self.k + [env.max_new_tokens + 1], dtype=np.int64)

    def observation_space(self, env: TokenVectorEnv) -> spaces.Space:
        nvec = self._nvec(env)
        if self.as_ids:
            high = (nvec - 1).astype(np.float32)
            return spaces.Box(low=np.zeros_like(high), high=high, dtype=np.float32)
        return spaces.MultiDiscrete(nvec)

    def __call__(self, env: TokenVectorEnv, obs: dict[str, Tensor]) -> TensorObs:
        ids, mask = obs["input_ids"], obs["attention_mask"].bool()
        lp = env.prompt_width
        # Completion tokens are written left to right from column Lp, so the text
        # ends at column Lp + n_completion (exclusive); the prompt is left-padded
        # and ends at Lp, so the real text is contiguous up to that end.
        n_completion = mask[:, lp:].sum(dim=1)  # [B]
        end = lp + n_completion
        columns = end[:, None] - self.k + torch.arange(self.k, device=ids.device)[None, :]
        inside = columns >= 0
        safe = columns.clamp(min=0)
        real = inside & mask.gather(1, safe)
        last = torch.where(real, ids.gather(1, safe), torch.full_like(safe, env.vocab_size))
        out = torch.cat([last, n_completion[:, None]], dim=1).long()  # [B, k + 1]
        return out.float() if self.as_ids else out


# ----------------------------------------------------------------------- gymnasium
class TokenObservationWrapper(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Apply an ``ObservationView`` to the single env (``gymnasium.make("lmgym/...")``).

    Args:
        env: A single lmgym env, possibly already wrapped; ``env.unwrapped`` must be a
            ``lmgym.envs.TokenEnv``.
        view: The view to apply.
    """

    def __init__(self, env: gym.Env, view: ObservationView) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, view=view)
        gym.ObservationWrapper.__init__(self, env)
        vector_env = getattr(env.unwrapped, "vector_env", None)
        if not isinstance(vector_env, TokenVectorEnv):
            raise TypeError(
                f"env: expected an lmgym single env (TokenEnv), got {type(env.unwrapped).__name__}"
            )
        self.view = view
        self._vector_env = vector_env
        self.observation_space = view.observation_space(vector_env)

    def observation(self, observation: dict[str, np.ndarray]) -> Any:
        batch = {
            name: torch.as_tensor(value, dtype=torch.long if name == "input_ids" else torch.bool)[
                None
            ]
            for name, value in observation.items()
        }
        return _to_numpy(self.view(self._vector_env, batch), row=0)


class TerminateOnTokenBudget(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Report the end of the token budget as ``terminated`` on the single env.

    lmgym flags a completion cut off at ``max_new_tokens`` as ``truncated``. The
    budget is part of the task (the observation holds the position and no reward
    follows), but libraries that follow Gymnasium's reading of ``truncated`` (a
    time limit outside the MDP) bootstrap such a step with the value of the final
    observation, a state never trained on. Stable-Baselines3's ``DummyVecEnv`` does
    exactly that. Under this wrapper a budget cut-off is ``terminated=True,
    truncated=False``; a ``TimeLimit`` stacked on top still truncates as usual.

    Args:
        env: A single lmgym env (``env.unwrapped`` is a ``TokenEnv``) whose ``info``
            still carries ``"length"``.
    """

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        vector_env = getattr(env.unwrapped, "vector_env", None)
        if not isinstance(vector_env, TokenVectorEnv):
            raise TypeError(
                f"env: expected an lmgym single env (TokenEnv), got {type(env.unwrapped).__name__}"
            )
        self._budget = vector_env.max_new_tokens

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if truncated and info["length"] >= self._budget:
            terminated, truncated = True, False
        return obs, reward, terminated, truncated, info


class VectorTokenObservation(VectorObservationWrapper):
    """Apply an ``ObservationView`` to the native ``TokenVectorEnv``; outputs stay torch.

    Args:
        env: A ``TokenVectorEnv`` (or a wrapper whose ``unwrapped`` is one and whose
            observations are still the native torch buffer).
        view: The view to apply.
    """

    def __init__(self, env: VectorEnv, view: ObservationView) -> None:
        super().__init__(env)
        if not isinstance(env.unwrapped, TokenVectorEnv):
            raise TypeError(f"env: expected a TokenVectorEnv, got {type(env.unwrapped).__name__}")
        self.view = view
        self._token_env = env.unwrapped
        self.single_observation_space = view.observation_space(self._token_env)
        self.observation_space = batch_space(self.single_observation_space, env.num_envs)

    def observations(self, observations: dict[str, Tensor]) -> TensorObs:
        return self.view(self._token_env, observations)


class TorchToNumpy(VectorWrapper):
    """Torch in the env, numpy outside: observations, rewards, flags and info as numpy.

    Gymnasium's own vector wrappers (``RecordEpisodeStatistics``,
    ``NormalizeReward``, ``TransformReward``, ...) assume numpy arrays; put this
    wrapper under them. Observations are cast to the dtypes of
    ``single_observation_space`` (so the attention mask becomes int8, as in the
    single env); actions may be numpy or torch. Gymnasium's ``ArrayConversion``
    does the same when the optional ``array-api-compat`` package is installed.
    """

    def __init__(self, env: VectorEnv) -> None:
        super().__init__(env)
        self._device = getattr(env.unwrapped, "device", torch.device("cpu"))

    def _obs(self, obs: TensorObs) -> Any:
        space: Any = self.single_observation_space  # a Dict space when obs is a dict
        if isinstance(obs, dict):
            return {key: _numpy(value, space[key].dtype) for key, value in obs.items()}
        return _numpy(obs, space.dtype)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return self._obs(obs), _to_numpy(info)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = torch.as_tensor(np.asarray(actions), device=self._device)
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        return (
            self._obs(obs),
            _numpy(rewards),
            _numpy(terminated),
            _numpy(truncated),
            _to_numpy(info),
        )


def _numpy(value: Any, dtype: Any = None) -> np.ndarray:
    array = value.detach().cpu().numpy() if isinstance(value, Tensor) else np.asarray(value)
    return array if dtype is None else array.astype(dtype, copy=False)


def _to_numpy(value: Any, row: int | None = None) -> Any:
    """Tensors (also inside dicts) to numpy; ``row`` picks one row of each."""
    if isinstance(value, dict):
        return {key: _to_numpy(item, row) for key, item in value.items()}
    if isinstance(value, Tensor):
        array = value.detach().cpu().numpy()
        return array if row is None else array[row]
    return value
