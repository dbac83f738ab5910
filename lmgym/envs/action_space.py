"""Action spaces over token ids that leave out the ids the env refuses.

The env refuses special tokens other than its stop ids (``lmgym.special_tokens``);
those ids are not contiguous (``<eos>`` often sits between ``<pad>`` and ``<unk>``),
so a plain ``Discrete`` cannot describe the legal actions. ``TokenActionSpace`` is
``Discrete(V)`` whose ``sample`` draws only legal ids and whose ``contains`` is False
on refused ones, so ``action_space.sample()`` (Gymnasium's checker, a random agent)
always gives an action the env accepts. ``batch_space`` of it is a
``TokenActionsSpace``, the same for ``N`` rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space


def _legal_mask(n: int, refused: Sequence[int]) -> np.ndarray:
    legal = np.ones(n, dtype=np.int8)
    legal[list(refused)] = 0
    return legal


class TokenActionSpace(spaces.Discrete):
    """``Discrete(n)`` over token ids, without the ``refused`` ids.

    Args:
        n: Vocabulary size ``V``.
        refused: Ids that are not legal actions.
        seed: Seed of the space's sampler.

    Attributes:
        refused: The refused ids, sorted.
        legal_mask: ``[n] int8``, 1 on legal ids (Gymnasium's mask format).
    """

    def __init__(self, n: int, refused: Sequence[int] = (), seed: Any = None) -> None:
        super().__init__(n, seed=seed)
        self.refused = tuple(sorted(int(i) for i in refused))
        self.legal_mask = _legal_mask(n, self.refused)

    def sample(
        self, mask: np.ndarray | None = None, probability: np.ndarray | None = None
    ) -> np.int64:
        """A legal id; a caller's ``mask`` or ``probability`` is restricted to legal ids."""
        if probability is not None:
            probability = np.asarray(probability, dtype=np.float64) * self.legal_mask
            total = probability.sum()
            if total <= 0:
                raise ValueError("probability: puts no mass on a legal token id")
            return super().sample(probability=probability / total)
        legal = (
            self.legal_mask if mask is None else np.asarray(mask, dtype=np.int8) & self.legal_mask
        )
        return super().sample(mask=legal)

    def contains(self, x: Any) -> bool:
        return super().contains(x) and bool(self.legal_mask[int(x) - int(self.start)])

    def __repr__(self) -> str:
        return f"TokenActionSpace({self.n}, refused={list(self.refused)})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TokenActionSpace)
            and self.n == other.n
            and self.refused == other.refused
        )


class TokenActionsSpace(spaces.MultiDiscrete):
    """``N`` token-id actions (``MultiDiscrete([V] * N)``) without the ``refused`` ids."""

    def __init__(self, n: int, num_envs: int, refused: Sequence[int] = (), seed: Any = None):
        super().__init__(np.full((num_envs,), n, dtype=np.int64), seed=seed)
        self.refused = tuple(sorted(int(i) for i in refused))
        self.legal_mask = _legal_mask(n, self.refused)

    def sample(
        self,
        mask: tuple[np.ndarray, ...] | None = None,
        probability: tuple[np.ndarray, ...] | None = None,
    ) -> np.ndarray:
        """``[N]`` legal ids; see ``TokenActionSpace.sample``."""
        if probability is not None:
            rows = [np.asarray(p, dtype=np.float64) * self.legal_mask for p in probability]
            if any(p.sum() <= 0 for p in rows):
                raise ValueError("probability: a row puts no mass on a legal token id")
            return super().sample(probability=tuple(p / p.sum() for p in rows))
        if mask is None:
            mask = tuple(self.legal_mask for _ in range(len(self.nvec)))
        else:
            mask = tuple(np.asarray(m, dtype=np.int8) & self.legal_mask for m in mask)
        return super().sample(mask=mask)

    def contains(self, x: Any) -> bool:
        return super().contains(x) and bool(self.legal_mask[np.asarray(x)].all())

    def __repr__(self) -> str:
        return (
            f"TokenActionsSpace({int(self.nvec[0])}, num_envs={len(self.nvec)}, "
            f"refused={list(self.refused)})"
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TokenActionsSpace)
            and np.array_equal(self.nvec, other.nvec)
            and self.refused == other.refused
        )


@batch_space.register(TokenActionSpace)
def _batch_token_actions(space: TokenActionSpace, n: int = 1) -> TokenActionsSpace:
    return TokenActionsSpace(int(space.n), n, space.refused, seed=deepcopy(space.np_random))
