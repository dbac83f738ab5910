"""The optimizer state of a ``data_parallel="fsdp"`` run: one shard per rank.

Under FSDP each rank's optimizer holds its own shard of the state.
``ShardedUpdate.optimizer_state_dict`` gives it out marked
``"fsdp_shard": {"rank", "world_size"}``; a checkpoint stores every rank's shard
(``lmgym.persistence.agent.rank_state``), and on resume each rank loads its own
(``ShardedUpdate.load_optimizer_state_dict``). A whole optimizer (DDP, one process:
``DataParallelUpdate.load_optimizer_state_dict``) refuses a marked state: a shard
loaded as the whole state would train with the wrong moments.
"""

from __future__ import annotations

MARKER = "fsdp_shard"


def shard_refused(marker: dict[str, int]) -> str:
    """The error for a whole optimizer given rank ``marker["rank"]``'s shard."""
    size = marker["world_size"]
    return (
        f"resume: this optimizer state is rank {marker['rank']}'s shard of a "
        f"data_parallel='fsdp' run of {size} processes, not a whole optimizer state; "
        f"resume the run with the same number of processes (lmgym train --nproc-per-node "
        f"{size} --resume ...), where each rank loads its own shard. Its weights are "
        "complete: to start a new run from them, use CausalLMPolicy.from_pretrained on the "
        "checkpoint's policy directory"
    )


def wrong_shard(marker: dict[str, int] | None, rank: int, size: int) -> str:
    """The error for a sharded optimizer (rank ``rank`` of ``size``) given another state."""
    if marker is None:
        got = "a whole optimizer state (a data_parallel='ddp' or one-process run)"
    else:
        got = f"rank {marker['rank']}'s shard of a run of {marker['world_size']} processes"
    return (
        f"resume: this data_parallel='fsdp' optimizer is rank {rank} of {size} and loads "
        f"only its own shard, but was given {got}; resume with the data_parallel mode and "
        "number of processes that wrote the checkpoint"
    )
