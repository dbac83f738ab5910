"""Typed records the update passes between its steps (docs/algorithms.md#notation).

``RolloutBatch`` (lmgym.types) is what the env produced; ``PreparedBatch`` is
what the update needs that does not change during it; ``Counts`` are the
whole-minibatch normalisers; ``LossModules`` what a micro-batch's loss runs;
``PolicyOutput`` is one micro-batch's forward pass;
``MicroBatchLoss`` is its loss by named term; ``UpdateLog`` is what an update's
optimizer steps leave for its metrics. Masks are ``bool`` throughout.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lmgym.distributed import DataParallelGroup

if TYPE_CHECKING:
    from lmgym.policy.causal_lm import CausalLMPolicy
    from lmgym.policy.value import Critic


@dataclass(frozen=True)
class PreparedBatch:
    """One rollout batch made ready for the update (``B`` rows, ``L`` completion tokens).

    Attributes:
        ids: ``[B, S] int64`` prompt and completion joined (``S = Lp + L``).
        attn: ``[B, S] bool`` attention mask of ``ids``.
        mask: ``[B, L] bool`` the loss's tokens: the policy's tokens of valid rows (a
            multi-turn env's observation tokens are never in it).
        group_ids: ``[B] int64`` the env's group of each row (set at reset).
        sampler_logprobs: ``[B, L] float32`` ``lp_s``.
        old_logprobs: ``[B, L] float32`` ``lp_old``, or ``None`` when the update's own
            first forward pass provides it (one epoch, one minibatch).
        ref_logprobs: ``[B, L] float32`` ``lp_ref``, or ``None`` without a reference.
        advantages: ``[B, L] float32`` detached.
        returns: ``[B, L] float32`` value targets, or ``None`` without a critic.
        values: ``[B, L] float32`` ``V_old``, or ``None`` without a critic.
        lengths: ``[B] int64`` real completion tokens of each row (the columns it
            spans, observation tokens included: ``trimmed`` cuts after them).
    """

    ids: Tensor
    attn: Tensor
    mask: Tensor
    group_ids: Tensor
    sampler_logprobs: Tensor
    old_logprobs: Tensor | None
    ref_logprobs: Tensor | None
    advantages: Tensor
    returns: Tensor | None
    values: Tensor | None
    lengths: Tensor

    @property
    def max_new_tokens(self) -> int:
        return self.mask.shape[1]

    def rows(self, index: Tensor) -> PreparedBatch:
        """The sub-batch of rows ``index`` (``[b] int64``), of the same class: a
        subclass's extra per-row fields (tensors with a leading ``[B]``) follow."""
        taken = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(self, **{k: v[index] for k, v in taken.items() if v is not None})

    def trimmed(self) -> PreparedBatch:
        """The same rows with the completion cut after its longest row's last token.

        Columns past every row's completion are padding: a causal model's outputs on
        the earlier positions do not depend on them, so the cut changes no value.
        """
        length = max(int(self.lengths.max()), 1) if self.lengths.numel() else 1
        if length == self.max_new_tokens:
            return self
        width = self.ids.shape[1] - self.max_new_tokens + length
        cut = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in cut.items():
            if value is None or value.dim() < 2:
                continue
            cut[name] = value[:, :width] if name in ("ids", "attn") else value[:, :length]
        return replace(self, **cut)


@dataclass(frozen=True)
class Counts:
    """Whole-minibatch normalisers (docs/algorithms.md#aggregation).

    Attributes:
        sequences: ``B``, every row of the minibatch (masked rows included).
        tokens: the number of loss tokens in the minibatch.
        max_len: ``L_max``.
    """

    sequences: float
    tokens: float
    max_len: int

    @classmethod
    def of(cls, mask: Tensor, group: DataParallelGroup | None = None) -> Counts:
        """Counts of a minibatch's ``[b, L] bool`` loss mask, summed over data-parallel
        ranks (each rank holds its share of the minibatch's rows)."""
        counts = torch.tensor([mask.shape[0], mask.sum().item()], dtype=torch.float64)
        if group is not None:
            counts = group.all_reduce_sum(counts.to(mask.device))
        sequences, tokens = counts.tolist()
        return cls(sequences, tokens, mask.shape[1])

    def normalisers(self) -> dict[str, Any]:
        """``aggregation.aggregate``'s keyword arguments: ``num_sequences``,
        ``num_tokens``, ``max_len``."""
        return {"num_sequences": self.sequences, "num_tokens": self.tokens, "max_len": self.max_len}


@dataclass(frozen=True)
class PolicyOutput:
    """The policy's teacher-forced pass over one micro-batch (``b`` rows).

    Attributes:
        logprobs: ``[b, L] float32`` ``lp``, with gradient.
        entropy: ``[b, L] float32`` next-token entropy, with gradient.
        hidden: ``[b, L, H]`` last hidden states (a shared critic reads them).
        values: ``[b, L] float32`` the critic's ``V(s_t)``, with gradient; ``None``
            without a critic.
    """

    logprobs: Tensor
    entropy: Tensor
    hidden: Tensor
    values: Tensor | None = None


@dataclass(frozen=True)
class LossModules:
    """The modules one micro-batch's loss runs (``Agent.micro_batch_loss``).

    One process and DDP: the agent's own policy and critic. Data-parallel FSDP: views
    of them computing with the sharded replicas (``CausalLMPolicy.on_model``,
    ``Critic.on_modules``), so the agent's own objects are never changed.

    Attributes:
        policy: runs the teacher-forced pass (its model trains).
        critic: computes the values, or ``None`` without a critic.
    """

    policy: CausalLMPolicy
    critic: Critic | None


@dataclass(frozen=True)
class MicroBatchLoss:
    """One micro-batch's loss and what the metrics need from it.

    Attributes:
        total: 0-dim, the minimised loss (every term times its coefficient).
        terms: name -> 0-dim detached unweighted term, each normalised by the
            minibatch's ``Counts`` (so its sum over micro-batches is the minibatch's
            value): ``policy_loss`` and any extra term (``value_loss``, ...).
        old_logprobs: ``[b, L]`` the ``lp_old`` used.
        ratio: ``[b, L]`` the policy ratio, or ``None`` for rules without one.
        tis: ``[b, L]`` the TIS weights, or ``None``.
        logprobs: ``[b, L]`` detached ``lp``.
        entropy: ``[b, L]`` detached entropy.
    """

    total: Tensor
    terms: dict[str, Tensor]
    old_logprobs: Tensor
    ratio: Tensor | None
    tis: Tensor | None
    logprobs: Tensor
    entropy: Tensor


@dataclass
class UpdateLog:
    """What one update's optimizer steps leave for its metrics (``report.update_metrics``).

    Attributes:
        micro_batches: ``(rows [b] int64, loss)`` of every micro-batch of every step.
        step_terms: per optimizer step, each loss term's minibatch value (the sum of
            its micro-batch parts, already summed over ranks).
        grad_norms: per optimizer step, the gradient norm before clipping.
        skipped: minibatches whose step was skipped as non-finite (``skip_nonfinite``).
    """

    micro_batches: list[tuple[Tensor, MicroBatchLoss]] = field(default_factory=list)
    step_terms: list[dict[str, float]] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    skipped: int = 0

    def add(
        self, parts: list[tuple[Tensor, MicroBatchLoss]], terms: dict[str, float], grad_norm: float
    ) -> None:
        """Record one optimizer step: its micro-batches, loss terms and gradient norm."""
        self.micro_batches += parts
        self.step_terms.append(terms)
        self.grad_norms.append(grad_norm)
