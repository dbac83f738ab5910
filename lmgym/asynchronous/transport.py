"""What actors and learners send each other, as tensors: versioned rollouts and weights.

A ``VersionedRollout`` is a ``RolloutBatch`` of whole groups plus, per token, the
policy version that sampled it. On the wire it is two matrices, one ``int64``
(ids, masks, counters, versions, slots) and one ``float32`` (sampler log-probs and
rewards), so the round trip is exact. Weights travel as one flat tensor in the
model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn

from lmgym.rollout import concat_batches
from lmgym.types import RolloutBatch

# Every RolloutBatch field: (name, kind, width), width "Lp" (prompt), "L"
# (completion) or "1" (one value per row). A field missing here fails the tests.
BATCH_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("prompt_ids", "int", "Lp"),
    ("prompt_mask", "bool", "Lp"),
    ("completion_ids", "int", "L"),
    ("completion_mask", "bool", "L"),
    ("sampler_logprobs", "float", "L"),
    ("rewards", "float", "L"),
    ("dones", "bool", "L"),
    ("group_ids", "int", "1"),
    ("prompt_index", "int", "1"),
    ("lengths", "int", "1"),
    ("terminated", "bool", "1"),
    ("truncated", "bool", "1"),
    ("valid", "bool", "1"),
    ("special_mass", "float", "1"),
    ("policy_mask", "bool", "L"),
)


@dataclass(frozen=True)
class VersionedRollout:
    """Finished rows with the policy version of every sampled token.

    Attributes:
        batch: the rows (``B`` of them, ``L`` completion tokens).
        versions: ``[B, L] int64`` policy version that sampled each token; -1 on padding
            and on a multi-turn env's observation tokens (never sampled).
        slots: ``[B] int64`` the env's prompt slot of each row (``group_id * G + j``
            within one actor's stream): orders a group's rows as a synchronous
            batch orders them.
    """

    batch: RolloutBatch
    versions: Tensor
    slots: Tensor

    def select(self, rows: Tensor) -> VersionedRollout:
        return VersionedRollout(self.batch.select(rows), self.versions[rows], self.slots[rows])

    def oldest_versions(self) -> Tensor:
        """``[B] int64`` the oldest version among each row's sampled tokens."""
        big = torch.iinfo(torch.int64).max
        return self.versions.masked_fill(~self.batch.policy_mask, big).min(dim=1).values


def concat_rollouts(parts: list[VersionedRollout]) -> VersionedRollout:
    """Rows of every part, in order; prompts left-padded to the widest part's width."""
    width = max(p.batch.prompt_ids.shape[1] for p in parts)
    batches = []
    for part in parts:
        batch, extra = part.batch, width - part.batch.prompt_ids.shape[1]
        if extra:
            pad = batch.prompt_ids.new_zeros(batch.batch_size, extra)
            prompt_ids = torch.cat([pad, batch.prompt_ids], dim=1)
            prompt_mask = torch.cat([pad.bool(), batch.prompt_mask], dim=1)
            fields_ = {f.name: getattr(batch, f.name) for f in fields(batch)}
            batch = RolloutBatch(
                **{**fields_, "prompt_ids": prompt_ids, "prompt_mask": prompt_mask}
            )
        batches.append(batch)
    return VersionedRollout(
        concat_batches(batches),
        torch.cat([p.versions for p in parts]),
        torch.cat([p.slots for p in parts]),
    )


def pack(rollout: VersionedRollout) -> tuple[Tensor, Tensor]:
    """``(ints [B, 2 Lp + 5 L + 7] int64, floats [B, 2 L + 1] float32)`` on the batch's device."""
    batch = rollout.batch
    ints, floats = [], []
    for name, kind, _ in BATCH_FIELDS:
        value = getattr(batch, name)
        value = value[:, None] if value.dim() == 1 else value
        if kind == "float":
            if value.dtype != torch.float32:
                raise TypeError(f"RolloutBatch.{name}: expected float32, got {value.dtype}")
            floats.append(value)
        else:
            ints.append(value.long())
    ints += [rollout.versions.long(), rollout.slots.long()[:, None]]
    return torch.cat(ints, dim=1), torch.cat(floats, dim=1)


def unpack(ints: Tensor, floats: Tensor, prompt_width: int) -> VersionedRollout:
    """The inverse of ``pack``, given the prompt width ``Lp``."""
    length = (floats.shape[1] - 1) // 2
    widths = {"Lp": prompt_width, "L": length, "1": 1}
    expected = sum(widths[w] for _, kind, w in BATCH_FIELDS if kind != "float") + length + 1
    if ints.shape[1] != expected:
        raise ValueError(
            f"rollout message: {ints.shape[1]} int columns do not match prompt width "
            f"{prompt_width} and {length} completion tokens ({expected} expected)"
        )
    values: dict[str, Tensor] = {}
    at_int = at_float = 0
    for name, kind, width_name in BATCH_FIELDS:
        width = widths[width_name]
        if kind == "float":
            value = floats[:, at_float : at_float + width]
            at_float += width
        else:
            value = ints[:, at_int : at_int + width]
            at_int += width
            value = value.bool() if kind == "bool" else value
        values[name] = value[:, 0] if width_name == "1" else value
    versions = ints[:, at_int : at_int + length]
    slots = ints[:, at_int + length]
    return VersionedRollout(RolloutBatch(**values), versions, slots)


# ------------------------------------------------------------------------ weights
def flatten_weights(model: nn.Module, device: torch.device) -> Tensor:
    """``[1, P]`` every parameter, concatenated, in the model's dtype, on ``device``.

    Raises:
        TypeError: the parameters have more than one dtype.
    """
    params = list(model.parameters())  # tied ones once
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1:
        raise TypeError(
            f"weight publishing needs one parameter dtype, the model has {sorted(map(str, dtypes))}"
        )
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).to(device) for p in params])[None, :]


@torch.no_grad()
def load_weights(model: nn.Module, flat: Tensor) -> None:
    """Copy ``flat`` (from ``flatten_weights``) into the model's parameters, in place."""
    params = list(model.parameters())  # tied ones once
    values = flat.reshape(-1)
    if values.numel() != sum(p.numel() for p in params):
        raise ValueError(
            f"weights message has {values.numel()} values, the model "
            f"{sum(p.numel() for p in params)}: actors and learners must build the same model"
        )
    for param, chunk in zip(params, values.split([p.numel() for p in params]), strict=True):
        param.copy_(chunk.view_as(param))
