"""The processes of one training run under ``torchrun``: who writes, and how they agree.

Rank 0 alone touches the run directory (lock, ``config.json``, logs, checkpoints)
and prints; the other ranks train and write nothing. Whatever can fail on one
rank only (the directory is locked, the disk is full) runs through ``on_main`` or
``on_every``, which share an ok flag after the step: a failure ends every rank
with an error naming the rank and its message, never a hang. Outside a process
group (one process) every method just calls its function.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from lmgym.distributed import DEFAULT_TIMEOUT_S, DataParallelGroup, init_from_env

T = TypeVar("T")


class RankFailedError(ValueError):
    """Another rank failed in a step every rank takes; this rank stops too."""


def launched_ranks() -> int:
    """``WORLD_SIZE`` as torchrun set it (1 when not launched by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_device(device: str) -> str:
    """``cuda`` (or ``cuda:N``) becomes this process's GPU ``cuda:LOCAL_RANK`` under torchrun;
    anything else is kept."""
    if launched_ranks() > 1 and torch.device(device).type == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return f"cuda:{index}"
    return device


class Ranks:
    """This process's place in the run: ``rank``, ``size``, ``is_main``, and agreement steps.

    Args:
        group: the process group (``None``: the default group, when initialised).
        alone: act as a group of one (every step is this process's alone).
    """

    def __init__(self, group: dist.ProcessGroup | None = None, *, alone: bool = False) -> None:
        self.dp = DataParallelGroup(group)
        if alone:  # this process by itself, whatever group it is in (an async learner 0)
            self.dp.active, self.dp.rank, self.dp.size = False, 0, 1
        self.group = group
        self.rank, self.size = self.dp.rank, self.dp.size
        self.is_main = self.rank == 0

    @classmethod
    def start(cls, device: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Ranks:
        """Join torchrun's process group (NCCL on CUDA, gloo otherwise), if launched by it."""
        init_from_env(device, timeout_s)
        return cls()

    def _fail(self, failures: list[tuple[int, str] | None], own: BaseException | None) -> None:
        failed = [f for f in failures if f is not None]
        if not failed:
            return
        if own is not None:
            raise own
        rank, message = failed[0]
        raise RankFailedError(f"rank {rank} failed, so this rank stops too: {message}")

    def on_main(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on rank 0 and return its result on every rank (it must pickle).

        Raises:
            on rank 0, what ``fn`` raised; on the others, ``RankFailedError`` with its message.
        """
        if not self.dp.active:
            return fn()
        own: BaseException | None = None
        box: list[Any] = [None]
        if self.is_main:
            try:
                box = [("ok", fn())]
            except Exception as exc:  # shared with every rank, then re-raised here
                own, box = exc, [("error", f"{type(exc).__name__}: {exc}")]
        dist.broadcast_object_list(box, src=0, group=self.group)
        kind, value = box[0]
        self._fail([(0, value)] if kind == "error" else [None], own)
        return value

    def on_every(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on every rank; if it raised on any, every rank raises.

        Raises:
            on a rank where ``fn`` failed, its exception; on the others,
            ``RankFailedError`` naming the first rank that failed.
        """
        if not self.dp.active:
            return fn()
        own: BaseException | None = None
        result: Any = None
        try:
            result = fn()
            mine: tuple[int, str] | None = None
        except Exception as exc:
            own, mine = exc, (self.rank, f"{type(exc).__name__}: {exc}")
        failures: list[Any] = [None] * self.size
        dist.all_gather_object(failures, mine, group=self.group)
        self._fail(failures, own)
        return result

    def gather(self, value: T) -> list[T]:
        """Every rank's ``value`` (plain data and CPU tensors), rank order, on every rank."""
        if not self.dp.active:
            return [value]
        values: list[Any] = [None] * self.size
        dist.all_gather_object(values, value, group=self.group)
        return values

    def sum(self, value: int) -> int:
        """``value`` summed over ranks."""
        return int(self.dp.all_reduce_sum(torch.tensor([value], dtype=torch.int64)).item())

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank."""
        return self.sum(int(flag)) > 0

    def check_same(self, what: str, value: dict[str, Any]) -> None:
        """``ValueError`` on every rank if ``value`` differs between ranks (names the keys)."""
        self.dp.check_same_on_every_rank(what, value)
