"""The records that flow through lmgym and the protocols users plug in.

Data flow: a ``PromptSource`` feeds the env; the env's ``RewardModel`` scores
completions inside ``step``; ``lmgym.rollout.collect`` drives env and policy and
returns one ``RolloutBatch``; agents read only that batch, never ``info``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

#: A chat conversation: ``[{"role": "user", "content": "..."}, ...]``.
Messages = Sequence[Mapping[str, Any]]

#: One prompt: plain text, or chat messages that the env renders with the tokenizer's
#: chat template (``lmgym.envs.prompts``).
Prompt = str | Messages


@dataclass(frozen=True)
class RolloutBatch:
    """One batch of finished episodes, batch-major.

    ``B`` rows = ``P`` prompts x ``G`` completions; ``Lp`` = longest prompt (left
    padded); ``L`` = ``max_new_tokens`` of the run. Completion token ``t`` of row
    ``i`` sits at ``completion_ids[i, t]``; position ``t`` is real iff
    ``completion_mask[i, t]``.

    Multi-turn episodes (a ``TokenVectorEnv`` with a responder): the completion
    region holds the policy's turn 1, the environment's observation 1, the policy's
    turn 2, ... interleaved, as the env's buffer held them; ``policy_mask`` marks the
    tokens the policy sampled. Environment tokens are state, not actions: their sampler log-prob
    and reward are 0, and the loss, its normalisers and the metrics count policy
    tokens only. The last token of an episode is always a policy token.

    Attributes:
        prompt_ids: ``[B, Lp] int64`` left-padded prompt ids.
        prompt_mask: ``[B, Lp] bool`` True on real prompt tokens.
        completion_ids: ``[B, L] int64`` sampled ids, pad id after the last token.
        completion_mask: ``[B, L] bool`` True on real completion tokens, the
            terminating EOS included (in a multi-turn episode, the environment's
            observation tokens too).
        sampler_logprobs: ``[B, L] float32`` log-prob of each sampled token under
            the sampling distribution (``lp_s``, docs/algorithms.md#notation); 0 on
            padding and on environment tokens.
        rewards: ``[B, L] float32`` reward of each step as returned by ``env.step``
            (bandit mode: nonzero only at the last token; multi-turn: a turn's
            reward at its last token); 0 on padding and on environment tokens.
        dones: ``[B, L] bool`` True at each row's last completion token.
        group_ids: ``[B] int64`` one id per drawn prompt instance, shared by its
            ``G`` completions (never inferred from prompt text or row order).
        prompt_index: ``[B] int64`` index of the prompt in the prompt source.
        lengths: ``[B] int64`` number of completion tokens (``T_i``; in a multi-turn
            episode the observation tokens too, as the env's ``info["length"]``:
            the columns the row spans; ``policy_lengths`` counts the policy's).
        terminated: ``[B] bool`` ended on a stop id (multi-turn: the responder ended
            the episode).
        truncated: ``[B] bool`` cut at ``max_new_tokens`` without a stop id
            (multi-turn: also at ``max_turns``, or for want of budget).
        valid: ``[B] bool`` False for rows the env's unfinished-completion policy
            ``"mask"`` dropped from the loss.
        special_mass: ``[B] float32`` probability the policy's special-token mask
            removed, averaged over the row's steps (0 when nothing is masked); how
            much the model wanted ``<pad>``, ``<unk>``, ... (``CausalLMPolicy``,
            ``allowed_special_tokens``).
        policy_mask: ``[B, L] bool`` True on the tokens the policy sampled, a subset
            of ``completion_mask``. Defaults to ``completion_mask`` (a single-turn
            batch, every completion token is the policy's).
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    sampler_logprobs: Tensor
    rewards: Tensor
    dones: Tensor
    group_ids: Tensor
    prompt_index: Tensor
    lengths: Tensor
    terminated: Tensor
    truncated: Tensor
    valid: Tensor
    special_mass: Tensor
    policy_mask: Tensor = None  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        if self.policy_mask is None:
            object.__setattr__(self, "policy_mask", self.completion_mask)
        mask, like = self.policy_mask, self.completion_mask
        if mask.shape != like.shape or mask.dtype != torch.bool:
            raise ValueError(
                f"RolloutBatch.policy_mask: expected a bool tensor shaped like "
                f"completion_mask {tuple(like.shape)}, got {mask.dtype} "
                f"{tuple(mask.shape)}; leave it out for a single-turn batch"
            )

    @property
    def batch_size(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def max_new_tokens(self) -> int:
        return self.completion_ids.shape[1]

    @property
    def policy_lengths(self) -> Tensor:
        """``[B] int64`` tokens the policy sampled in each row (``lengths`` less the
        environment's observation tokens)."""
        return self.policy_mask.sum(dim=1)

    @property
    def scores(self) -> Tensor:
        """``[B] float32`` episode return without discount: the sum of step rewards
        (multi-turn: of the turn rewards)."""
        return self.rewards.sum(dim=1)

    def input_ids(self) -> tuple[Tensor, Tensor]:
        """Prompt and completion joined for a teacher-forced pass.

        Returns:
            ``(ids [B, Lp + L] int64, attention_mask [B, Lp + L] bool)``.
        """
        ids = torch.cat([self.prompt_ids, self.completion_ids], dim=1)
        mask = torch.cat([self.prompt_mask, self.completion_mask], dim=1)
        return ids, mask

    def select(self, rows: Tensor) -> RolloutBatch:
        """The sub-batch of the given rows (``[b] int64`` indices or ``[B] bool`` mask)."""
        return RolloutBatch(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})

    def to(self, device: torch.device | str) -> RolloutBatch:
        return RolloutBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


class RewardInput:
    """What a reward model sees for ``N`` rows at one scoring call.

    Completion text is decoded only if a reward model reads ``completions``, and a
    column is gathered only when read, so token-level reward models pay nothing for
    text.

    Attributes:
        prompt_ids: ``[N, Lp] int64`` left-padded prompts.
        prompt_mask: ``[N, Lp] bool``.
        completion_ids: ``[N, T] int64`` completions so far (right-padded).
        completion_mask: ``[N, T] bool``.
        prompts: the prompts as given by the prompt source, ``N`` of them: strings,
            or message lists for chat prompts.
        prompt_texts: the text each prompt was rendered to (a chat prompt through the
            tokenizer's chat template; a plain prompt is its own text), ``N`` strings.
        prompt_index: ``[N] int64`` index of each prompt in the prompt source
            (lets a task look up per-prompt data such as a reference answer).
        finished: ``[N] bool`` True where the completion has ended (stop id or budget).
        columns: the prompt source's other per-prompt fields for these rows,
            ``{name: N values}`` (e.g. ``{"answer": ["7", "12", ...]}`` from a JSONL
            file's ``answer`` field); empty for a source without columns.
    """

    def __init__(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        completion_mask: Tensor,
        prompts: Sequence[Prompt],
        prompt_index: Tensor,
        finished: Tensor,
        decode: Callable[[Tensor], list[str]],
        columns: Mapping[str, Sequence[Any]] | None = None,
        prompt_texts: Sequence[str] | None = None,
    ) -> None:
        self.prompt_ids = prompt_ids
        self.prompt_mask = prompt_mask
        self.completion_ids = completion_ids
        self.completion_mask = completion_mask
        self.prompts = prompts
        self.prompt_texts = prompts if prompt_texts is None else prompt_texts
        self.prompt_index = prompt_index
        self.finished = finished
        self.columns: Mapping[str, Sequence[Any]] = {} if columns is None else columns
        self._decode = decode

    @cached_property
    def completions(self) -> list[str]:
        """Decoded completion strings: in an lmgym env, the text of exactly the chosen
        tokens, special tokens included, only a final special stop token (``<eos>``)
        and the padding left out (``lmgym.envs.text``)."""
        return self._decode(self.completion_ids)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]


@runtime_checkable
class RewardModel(Protocol):
    """Scores whole completions: ``[N]`` float rewards, one per row of the input."""

    def __call__(self, batch: RewardInput) -> Tensor | Sequence[float]: ...


@runtime_checkable
class PromptSource(Protocol):
    """A finite, indexable collection of prompts (strings or chat message lists).

    A source may also have a ``columns`` attribute, ``{name: sequence of len(source)}``:
    per-prompt fields (a reference answer, ...) that reach reward models as
    ``RewardInput.columns`` and ``FunctionReward`` keyword arguments.
    """

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Prompt: ...
