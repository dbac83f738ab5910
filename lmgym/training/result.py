"""What ``Trainer.run`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lmgym.agents.base import Agent
from lmgym.training.evaluation import EvalResult


@dataclass
class TrainResult:
    """What a run did.

    Attributes:
        run_dir: its directory.
        history: one metrics dict per iteration trained in this session.
        before, after: evaluations at the start and the end of this session (``None``
            on data-parallel ranks other than 0: rank 0 evaluates).
        seconds: wall time of ``learn``.
        iteration: the agent's iteration count at the end (all sessions).
        tokens_generated: tokens the policy sampled (all sessions, all ranks; a
            multi-turn episode's observations not counted).
        checkpoint: the final checkpoint.
        stopped_early: whether early stopping ended it.
        agent: the trained agent.
        merged: ``RUN/merged`` when ``save_merged`` wrote it.
    """

    run_dir: Path
    history: list[dict[str, float]]
    before: EvalResult | None
    after: EvalResult | None
    seconds: float
    iteration: int
    tokens_generated: int
    checkpoint: Path | None
    stopped_early: bool
    agent: Agent = field(repr=False)
    merged: Path | None = None

    def report_line(self) -> str | None:
        """The line ``lmgym train`` ends with: the reward before and after, and the split
        and prompts they were measured on (``None`` without both evaluations)."""
        if self.before is None or self.after is None:
            return None
        after = self.after
        return (
            f"reward before: {self.before.reward_mean:.3f}   after: {after.reward_mean:.3f}"
            f"   ({len(self.history)} iterations in {self.seconds:.1f} s, "
            f"{self.tokens_generated} tokens generated; measured on split {after.split or '?'}: "
            f"{after.num_prompts} prompts x {after.samples_per_prompt} samples)"
        )
