"""The env's prompt stream: which prompt each new row gets and which group it joins.

``PromptStream`` is a value: ``take`` returns the slots and a *new* stream and never
edits the one it is called on (its generator included). The env computes a step's
new stream alongside everything else and commits it only once the reward model has
succeeded, so a failing reward leaves the stream where it was.

Sharding (data parallelism). With ``world_size`` ranks of ``num_prompts`` prompts
each, the *global* stream is the one a single env with ``num_prompts * world_size``
prompts per reset would draw (same seed, same permutations, same group counter).
It is cut into rounds of ``num_prompts * world_size`` groups (one reset's worth);
rank ``r`` takes groups ``[r * P, (r + 1) * P)`` of every round (``P =
num_prompts``), in order, so the ranks' shares are disjoint, together they are
exactly the global stream, and group ids (the global group index) are unique
across ranks. Every rank draws the whole global prompt order (cheap: an index
permutation) and keeps its share, so no communication is needed; the ranks must
be seeded alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor


def _generator(state: Tensor) -> torch.Generator:
    generator = torch.Generator()
    generator.set_state(state)
    return generator


@dataclass(frozen=True)
class PromptStream:
    """Passes over the prompt source, cut into slots of ``group_size`` per group.

    Attributes:
        num_source_prompts: Prompts in the source.
        group_size: Slots per group.
        shuffle: A fresh permutation per pass (``prompt_order="shuffle"``), else
            the source order.
        rng_state: ``torch.Generator`` state that draws the next permutation.
        order: ``[n] int64`` the current pass's prompt order.
        cursor: How much of ``order`` has been handed out.
        next_slot: The next slot number; slot ``s`` belongs to group ``s // group_size``.
        group_prompt: ``[g] int64`` prompt of group ``group_base + k`` for the groups
            still open (some of their slots not handed out yet).
        group_base: Group id of ``group_prompt[0]``.
        num_prompts: Groups per round of this rank (its env's ``num_prompts``).
        rank: This rank's index in ``[0, world_size)``.
        world_size: Ranks sharing the global stream (1: no sharding).
    """

    num_source_prompts: int
    group_size: int
    shuffle: bool
    rng_state: Tensor
    order: Tensor
    cursor: int
    next_slot: int
    group_prompt: Tensor
    group_base: int
    num_prompts: int = 1
    rank: int = 0
    world_size: int = 1

    @classmethod
    def start(
        cls,
        num_source_prompts: int,
        group_size: int,
        shuffle: bool,
        seed: int,
        *,
        num_prompts: int = 1,
        shard: tuple[int, int] = (0, 1),
    ) -> PromptStream:
        """A stream at its beginning, its permutations drawn from ``seed``; ``shard``
        is ``(rank, world_size)`` (see the module docstring)."""
        generator = torch.Generator()
        generator.manual_seed(seed)
        none = torch.empty(0, dtype=torch.long)
        rank, world_size = shard
        return cls(
            num_source_prompts,
            group_size,
            shuffle,
            generator.get_state(),
            none,
            0,
            0,
            none,
            0,
            num_prompts,
            rank,
            world_size,
        )

    def global_groups(self, local: Tensor) -> Tensor:
        """Global group ids of this rank's ``local`` group numbers (``[k] int64``):
        local group ``l`` is group ``l % P`` of this rank's share of round ``l // P``."""
        if self.world_size == 1:
            return local
        p = self.num_prompts
        return (local // p) * (p * self.world_size) + self.rank * p + local % p

    def _draw_prompts(self, k: int) -> tuple[Tensor, PromptStream]:
        """``[k]`` prompt indices continuing the current pass, and the stream after them."""
        out = []
        order, cursor, rng_state = self.order, self.cursor, self.rng_state
        n = self.num_source_prompts
        while k > 0:
            if cursor == len(order):
                if self.shuffle:
                    generator = _generator(rng_state)
                    order = torch.randperm(n, generator=generator)
                    rng_state = generator.get_state()
                else:
                    order = torch.arange(n)
                cursor = 0
            take = min(k, len(order) - cursor)
            out.append(order[cursor : cursor + take])
            cursor += take
            k -= take
        return torch.cat(out), replace(self, order=order, cursor=cursor, rng_state=rng_state)

    def take(self, k: int) -> tuple[Tensor, Tensor, PromptStream]:
        """Hand out the next ``k`` slots.

        Returns:
            ``(group_ids [k] int64, prompt_index [k] int64, stream_after)``, on CPU.
        """
        slots = self.next_slot + torch.arange(k)
        next_slot = self.next_slot + k
        group_ids = self.global_groups(slots // self.group_size)
        stream, group_prompt = self, self.group_prompt
        # Every global group up to the last one needed is drawn, other ranks' included,
        # so that the prompt order stays the global one.
        missing = int(group_ids[-1]) + 1 - (self.group_base + len(group_prompt))
        if missing > 0:
            drawn, stream = self._draw_prompts(missing)
            group_prompt = torch.cat([group_prompt, drawn])
        prompt_index = group_prompt[group_ids - self.group_base]
        # Forget groups no future slot can belong to (never past what has been drawn).
        next_group = torch.tensor([next_slot // self.group_size])
        first_open = min(
            int(self.global_groups(next_group)[0]), self.group_base + len(group_prompt)
        )
        group_prompt = group_prompt[first_open - self.group_base :]
        after = replace(
            stream, next_slot=next_slot, group_prompt=group_prompt, group_base=first_open
        )
        return group_ids, prompt_index, after
