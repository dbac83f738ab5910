"""Pieces the built-in tasks share: token-level target rewards, splits and the
random-policy baseline. (The env options and builder are ``lmgym.envs.options``.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lmgym.envs.prompts import PromptSubset, split_prompts
from lmgym.envs.task_factory import TaskParams
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.types import PromptSource, RewardInput

Split = Literal["train", "eval", "all"]


@dataclass(frozen=True, kw_only=True)
class DataSplit(TaskParams):
    """Which part of a task's data its env serves: the parameters of every task that
    holds data out derive from it, so its factory takes the fields as keyword
    arguments (``gymnasium.make_vec(id, split="eval", eval_fraction=0.2, data_seed=1)``).

    Attributes:
        split: ``"train"``, ``"eval"`` (the held-out part) or ``"all"``.
        eval_fraction: share of the data held out for ``"eval"``, in ``(0, 1)``
            (checked when a ``"train"``/``"eval"`` part is taken).
        data_seed: seeds the split (and the task's own draws of its data).
    """

    split: Split = "train"
    eval_fraction: float = 0.25
    data_seed: int = 0

    def _subset(self, source: PromptSource) -> PromptSubset | None:
        """The ``split`` part of ``source`` (``split_prompts`` under ``data_seed``);
        ``None`` for ``"all"``.

        Raises:
            ValueError: an unknown ``split``, or an ``eval_fraction`` that
                ``split_prompts`` refuses.
        """
        if self.split == "all":
            return None
        if self.split not in ("train", "eval"):
            raise ValueError(f"split={self.split!r} is not one of ['train', 'eval', 'all']")
        train, held_out = split_prompts(source, self.eval_fraction, self.data_seed)
        return train if self.split == "train" else held_out

    def part(self, source: PromptSource) -> PromptSource:
        """The ``split`` part of a prompt source (``"all"``: the source itself)."""
        subset = self._subset(source)
        return source if subset is None else subset

    def select(self, items: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """The ``split`` part of ``(prompt, answer)`` pairs, in their order."""
        subset = self._subset([prompt for prompt, _ in items])
        return list(items) if subset is None else [items[i] for i in subset.indices]


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def target_table(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-pad per-prompt target ids into one tensor.

    Returns:
        ``(ids [P, K] int64, lengths [P] int64)``, ``K`` = the longest target.

    Raises:
        ValueError: an empty target (the message gives its row).
    """
    for i, row in enumerate(rows):
        if len(row) == 0:
            raise ValueError(f"target {i} tokenises to zero tokens; every target needs text")
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):  # once at construction, not a hot path
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return ids, torch.tensor([len(row) for row in rows], dtype=torch.long)


def _in_place_hits(
    batch: RewardInput, target_ids: Tensor, target_lengths: Tensor
) -> tuple[Tensor, Tensor]:
    """Which target positions the completion reproduces, looked up per prompt.

    Args:
        target_ids: ``[P, K] int64`` right-padded targets, one row per prompt (``P = 1``:
            the same target for every prompt).
        target_lengths: ``[P] int64``.

    Returns:
        ``(hits [N, K] bool, lengths [N] int64)``; ``hits[i, t]`` is True iff
        completion token ``t`` of row ``i`` is real and equals the target's.
    """
    device = batch.completion_ids.device
    rows = batch.prompt_index.to(device) if target_ids.shape[0] > 1 else None
    targets = target_ids.to(device)
    lengths = target_lengths.to(device)
    if rows is None:
        targets = targets.expand(len(batch), -1)
        lengths = lengths.expand(len(batch))
    else:
        targets, lengths = targets[rows], lengths[rows]
    k = min(targets.shape[1], batch.completion_ids.shape[1])
    positions = torch.arange(targets.shape[1], device=device)
    hits = torch.zeros(targets.shape, dtype=torch.bool, device=device)
    hits[:, :k] = (batch.completion_ids[:, :k] == targets[:, :k]) & batch.completion_mask[:, :k]
    return hits & (positions[None, :] < lengths[:, None]), lengths


class InPlaceTargetReward:
    """Base of the rewards that compare a completion with its prompt's target tokens
    in place (``PositionMatchReward``, ``ExactMatchReward``).

    Args:
        target_ids: ``[P, K] int64`` right-padded targets (``P = 1``: one target for all).
        target_lengths: ``[P] int64``.
        name: Name in errors and logs.
    """

    def __init__(self, target_ids: Tensor, target_lengths: Tensor, name: str) -> None:
        self.target_ids, self.target_lengths, self.name = target_ids, target_lengths, name

    def _hits(self, batch: RewardInput) -> tuple[Tensor, Tensor]:
        """``(hits [N, K] bool, lengths [N] int64)`` of ``batch`` (see ``_in_place_hits``)."""
        return _in_place_hits(batch, self.target_ids, self.target_lengths)


class PositionMatchReward(InPlaceTargetReward):
    """Fraction of the prompt's target tokens reproduced in place; vectorised over rows.

    ``R_i = (1/K_i) * sum_{t < K_i} [y_{i,t} == target_{p(i),t}]`` with ``p(i)`` the
    row's prompt index and ``K_i`` its target length; range ``[0, 1]``. Tokens past
    ``K_i`` do not count. On a prefix the same formula counts the positions written
    so far, so the env's per-token potential form gives ``r_t = [y_t correct] / K``
    exactly: a reward per correct step (process supervision).

    Args: ``target_ids``, ``target_lengths``, ``name``, as ``InPlaceTargetReward``.
    """

    def __call__(self, batch: RewardInput) -> Tensor:
        hits, lengths = self._hits(batch)
        return hits.float().sum(dim=1) / lengths.float()


class ExactMatchReward(InPlaceTargetReward):
    """1 if the completion reproduces the prompt's whole target, else 0 (outcome reward).

    ``R_i = prod_{t < K_i} [y_{i,t} == target_{p(i),t}]``. Put the stop id at the
    end of each target to demand that the completion ends right after the answer.

    Args: ``target_ids``, ``target_lengths``, ``name``, as ``InPlaceTargetReward``.
    """

    def __call__(self, batch: RewardInput) -> Tensor:
        hits, lengths = self._hits(batch)
        return (hits.sum(dim=1) == lengths).float()


def select_split(
    items: Sequence[tuple[str, str]], split: Split, eval_fraction: float, data_seed: int
) -> list[tuple[str, str]]:
    """The ``split`` part of ``(prompt, answer)`` pairs: ``DataSplit(...).select(items)``."""
    return DataSplit(split=split, eval_fraction=eval_fraction, data_seed=data_seed).select(items)


def random_policy_return(env: TokenVectorEnv, num_batches: int = 4, seed: int = 0) -> float:
    """Mean episode return of the uniform random policy: every step, every row draws a
    token id uniformly from the env's legal actions (``env.legal_token_ids``: every id
    but the refused special tokens).

    Args:
        env: an episode-synchronous env (``autoreset=False``); it is reset.
        num_batches: batches of ``env.num_envs`` episodes to average over.
        seed: seeds both the env's prompt stream and the action sampler.

    Returns:
        The mean over ``num_batches * num_envs`` episodes of the summed step rewards.
    """
    if env.autoreset:
        raise ValueError("env: random_policy_return needs an env built with autoreset=False")
    generator = torch.Generator()
    generator.manual_seed(seed)
    total = 0.0
    for batch in range(num_batches):
        env.reset(seed=seed + batch)
        returns = torch.zeros(env.num_envs)
        legal = env.legal_token_ids
        for _ in range(env.max_new_tokens):
            actions = legal[torch.randint(0, len(legal), (env.num_envs,), generator=generator)]
            _, reward, terminated, truncated, _ = env.step(actions.to(env.device))
            returns += reward.cpu()
            if bool((terminated | truncated).all()):
                break
        total += float(returns.sum())
    return total / (num_batches * env.num_envs)
