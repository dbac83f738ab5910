"""Warnings that a run's result is suspect, each naming what to try.

A run can print a rising reward while the model gets worse. ``SuspectWatch`` warns,
in the log and on the progress bar, when:

- **the policy collapses to one answer**: at an evaluation, one answer makes up at
  least ``COLLAPSE_SHARE`` of the held-out completions and its share rose by at
  least ``COLLAPSE_RISE`` since the evaluation before training, or each prompt's
  samples agree (``distinct_per_prompt`` at most ``COLLAPSE_DISTINCT``) where before
  training they differed (at least ``COLLAPSE_DISTINCT + COLLAPSE_DISTINCT_DROP``)
  and the held-out reward gained less than ``DIVERGE_MARGIN`` (sharpening onto
  better answers is learning); either while the most common answer's reward is
  short of the task's best (on a task with one target for every prompt, one answer
  everywhere is the solution);
- **groups go flat at a high share**: the share of groups whose completions all got
  the same reward (``frac_reward_zero_std``), averaged over the last ``FLAT_WINDOW``
  iterations, reaches ``FLAT_SHARE`` and is ``FLAT_RISE`` above the session's first
  ``FLAT_WINDOW`` iterations, while the training reward has stalled (``STALL_GAIN``)
  short of the best (a run solving its task goes flat as its reward climbs). ``NoSignalWarning`` covers the other case,
  every group flat for 20 iterations in a row;
- **the held-out score falls while the training reward rises**: an evaluation's
  held-out reward is ``DIVERGE_MARGIN`` below the one before training while the
  training reward of the last ``FLAT_WINDOW`` iterations is ``DIVERGE_MARGIN`` above
  the session's first ``FLAT_WINDOW``.

Each warning is printed once, and again only after its condition cleared. The
evaluation checks run at every evaluation (periodic ones, and the one after
training); the flat-group check at every iteration. The thresholds are here only.

No learning signal at all (``NoSignalWarning``): a group-relative method learns from
the spread of rewards within a group. When every completion of every group gets the
same reward (``frac_reward_zero_std`` 1.0: typically all 0 on a task the model never
solves), every advantage is 0, the loss has no gradient, and the model does not move,
however long it trains. The same holds whenever ``grad_norm`` is 0. ``NoSignalWarning``
counts such iterations in a row and, at ``NO_SIGNAL_PATIENCE``, prints one line saying
so and what to change; it warns again only after the signal came back and went away.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lmgym.training.callbacks import Printer, TrainingCallback, tqdm_print
from lmgym.training.evaluation import EvalResult
from lmgym.typed_values import check_at_least

COLLAPSE_SHARE = 0.9
"""Share of held-out completions with one answer at which the policy counts as collapsed."""
COLLAPSE_RISE = 0.2
"""... provided that share rose at least this much since before training."""
COLLAPSE_DISTINCT = 1.25
"""Mean distinct answers among a prompt's samples at or below which its samples agree."""
COLLAPSE_DISTINCT_DROP = 0.75
"""... provided that before training the mean was at least this much higher."""
FLAT_WINDOW = 5
"""Iterations in the rolling means of the flat-group and training-reward checks."""
FLAT_SHARE = 0.5
"""Rolling share of flat groups that warns ..."""
FLAT_RISE = 0.25
"""... when it is this much above the session's first iterations'."""
DIVERGE_MARGIN = 0.05
"""How far the held-out reward must fall, and the training reward rise, to warn."""
STALL_GAIN = 0.02
"""The flat-group warning needs the training reward stalled: its mean over the last
``FLAT_WINDOW`` iterations gained less than this over the ``FLAT_WINDOW`` before (a run
that solves its task goes flat while its reward still climbs)."""
SOLVED = 0.95
"""Share of the task's best reward above which a flat or single-answer policy is a solved one."""


@dataclass(frozen=True)
class RunKnobs:
    """The run's settings the advice quotes."""

    learning_rate: float
    temperature: float
    group_size: int
    beta: float

    def advice(self, *kinds: str) -> str:
        """``Try ...`` naming the settings of ``kinds`` (kl, lr, temperature, group_size)."""
        text = {
            "kl": f"a KL penalty to the initial model (--beta 0.04; now {self.beta:g})",
            "lr": f"a lower --learning-rate (now {self.learning_rate:g})",
            "temperature": f"a higher --temperature (now {self.temperature:g})",
            "group_size": f"more completions per prompt (--group-size; now {self.group_size})",
        }
        return "try " + ", ".join(text[k] for k in kinds)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@dataclass(eq=False)
class SuspectWatch(TrainingCallback):
    """Warn when a run's result is suspect (see the module docstring).

    Call it after every iteration (it is a callback); give it the evaluation before
    training (``baseline``) and every later one (``check_eval``).

    Args:
        knobs: the run's settings, quoted in the advice.
        max_reward: the task's best reward (``None``: 1.0).
        out: where warning lines go (``None``: silent).

    Attributes:
        warnings: ``(iteration, kind, line)`` of every warning so far.
        active: the kinds whose condition holds now (the progress bar shows them).
    """

    state_key: ClassVar[str] = "suspect_watch"

    knobs: RunKnobs
    max_reward: float | None = None
    out: Printer | None = tqdm_print
    before: EvalResult | None = field(default=None, init=False)
    first_flat: list[float] = field(default_factory=list, init=False)
    first_reward: list[float] = field(default_factory=list, init=False)
    recent_flat: list[float] = field(default_factory=list, init=False)
    recent_reward: list[float] = field(default_factory=list, init=False)
    active: set[str] = field(default_factory=set, init=False)
    warnings: list[tuple[int, str, str]] = field(default_factory=list, init=False)

    @property
    def best(self) -> float:
        return self.max_reward if self.max_reward is not None else 1.0

    def status(self) -> str:
        """What the progress bar shows: the active warnings, or ``""``."""
        return ",".join(sorted(self.active))

    def _set(self, kind: str, holds: bool, iteration: int, line: Callable[[], str]) -> None:
        """Warn when ``kind`` starts to hold; forget it when it stops."""
        if not holds:
            self.active.discard(kind)
            return
        if kind in self.active:
            return
        self.active.add(kind)
        text = f"warning: {line()}"
        self.warnings.append((iteration, kind, text))
        if self.out is not None:
            self.out(text)

    # ------------------------------------------------------------- iterations
    def __call__(self, agent: Any, metrics: dict[str, float]) -> bool | None:
        flat, reward = metrics.get("frac_reward_zero_std"), metrics.get("reward_mean")
        if flat is None or reward is None:
            return None
        if len(self.first_flat) < FLAT_WINDOW:
            self.first_flat.append(flat)
            self.first_reward.append(reward)
        self.recent_flat = (self.recent_flat + [flat])[-FLAT_WINDOW:]
        self.recent_reward = (self.recent_reward + [reward])[-2 * FLAT_WINDOW :]
        if len(self.recent_reward) < 2 * FLAT_WINDOW:
            return None
        share, start = _mean(self.recent_flat), _mean(self.first_flat)
        last, earlier = self.recent_reward[FLAT_WINDOW:], self.recent_reward[:FLAT_WINDOW]
        stalled = _mean(last) - _mean(earlier) < STALL_GAIN
        unsolved = _mean(last) < SOLVED * self.best
        holds = share >= FLAT_SHARE and share - start >= FLAT_RISE and stalled and unsolved
        self._set("flat", holds, agent.iteration, lambda: self._flat_line(agent, share, start))
        return None

    def _flat_line(self, agent: Any, share: float, start: float) -> str:
        return (
            f"{share:.0%} of groups were flat over the last {FLAT_WINDOW} iterations (to "
            f"{agent.iteration}; {start:.0%} over the session's first {FLAT_WINDOW}): their "
            "completions all got the same reward, so they teach nothing, and a rising share "
            "often means the policy is collapsing to one answer; "
            + self.knobs.advice("temperature", "group_size", "lr", "kl")
        )

    def training_rise(self) -> tuple[float, float] | None:
        """``(first, recent)`` mean training reward over ``FLAT_WINDOW`` iterations, once
        both windows are full."""
        if len(self.first_reward) < FLAT_WINDOW or len(self.recent_reward) < FLAT_WINDOW:
            return None
        return _mean(self.first_reward), _mean(self.recent_reward[-FLAT_WINDOW:])

    # ------------------------------------------------------------ evaluations
    def baseline(self, result: EvalResult) -> None:
        """The evaluation before training: what later ones are compared with."""
        if self.before is None:
            self.before = result

    def check_eval(self, agent: Any, result: EvalResult) -> None:
        """Check an evaluation after training started against the one before it."""
        before = self.before
        if before is None or before.split != result.split:
            return
        self._check_collapse(agent.iteration, before, result)
        rise = self.training_rise()
        fell = result.reward_mean <= before.reward_mean - DIVERGE_MARGIN
        holds = rise is not None and fell and rise[1] - rise[0] >= DIVERGE_MARGIN
        self._set(
            "held-out falls",
            holds,
            agent.iteration,
            lambda: (
                f"the held-out reward fell from {before.reward_mean:.3f} before training to "
                f"{result.reward_mean:.3f} at iteration {agent.iteration} (split "
                f"{result.split}) while the training reward rose from {rise[0]:.3f} to "  # type: ignore[index]
                f"{rise[1]:.3f}: the policy is learning the training prompts, or the reward's "  # type: ignore[index]
                "loopholes, not the task; "
                + self.knobs.advice("lr", "kl")
                + ", or use an earlier checkpoint"
            ),
        )

    def _check_collapse(self, iteration: int, before: EvalResult, now: EvalResult) -> None:
        share, was = now.top_answer_share, before.top_answer_share
        distinct, had = now.distinct_per_prompt, before.distinct_per_prompt
        if share is None or was is None or distinct is None or had is None:
            return
        one_answer = share >= COLLAPSE_SHARE and share - was >= COLLAPSE_RISE
        no_gain = now.reward_mean < before.reward_mean + DIVERGE_MARGIN
        agree = (
            distinct <= COLLAPSE_DISTINCT and had - distinct >= COLLAPSE_DISTINCT_DROP and no_gain
        )
        top_reward = now.top_answer_reward
        unsolved = (top_reward if top_reward is not None else now.reward_mean) < SOLVED * self.best
        self._set(
            "collapse",
            (one_answer or agree) and unsolved,
            iteration,
            lambda: (
                f"the policy is collapsing to one answer at iteration {iteration}: "
                f"{share:.0%} of the held-out completions answer {now.top_answer!r} (before "
                f"training {was:.0%}; mean reward of that answer {top_reward:.2f}), "
                f"{distinct:.2f} distinct answers per prompt of "
                f"{now.samples_per_prompt} samples (before {had:.2f}), held-out reward "
                f"{now.reward_mean:.3f} (before {before.reward_mean:.3f}, split {now.split}); "
                + self.knobs.advice("kl", "lr", "temperature", "group_size")
            ),
        )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "first_flat": list(self.first_flat),
            "first_reward": list(self.first_reward),
            "recent_flat": list(self.recent_flat),
            "recent_reward": list(self.recent_reward),
            "active": sorted(self.active),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first_flat = list(state["first_flat"])
        self.first_reward = list(state["first_reward"])
        self.recent_flat = list(state["recent_flat"])
        self.recent_reward = list(state["recent_reward"])
        self.active = set(state["active"])


# ------------------------------------------------------------ no learning signal
NO_SIGNAL_PATIENCE = 20
"""Iterations in a row without signal before the warning."""


def has_no_signal(metrics: dict[str, float], max_reward: float | None = None) -> bool:
    """Whether an iteration's metrics show no learning signal (flat groups or no gradient).

    Args:
        max_reward: the task's highest reward: flat groups that all reach it are a
            solved task, not a stuck one.
    """
    flat = metrics.get("frac_reward_zero_std")
    grad = metrics.get("grad_norm")
    reward = metrics.get("reward_mean")
    if max_reward is not None and reward is not None and reward >= max_reward - 1e-6:
        return False
    return (flat is not None and flat >= 1.0) or (grad is not None and grad == 0.0)


@dataclass(eq=False)
class NoSignalWarning(TrainingCallback):
    """Warn after ``patience`` iterations in a row without a learning signal.

    Args:
        group_size, temperature: the run's, quoted in the advice.
        max_reward: the task's highest reward (a solved task is flat too), if known.
        patience: iterations in a row (default ``NO_SIGNAL_PATIENCE``).
        out: where the line goes.

    Attributes:
        warned_at: the iterations at which it warned.
    """

    state_key: ClassVar[str] = "no_signal"

    group_size: int
    temperature: float
    max_reward: float | None = None
    patience: int = NO_SIGNAL_PATIENCE
    out: Printer | None = tqdm_print
    streak: int = field(default=0, init=False)
    warned_at: list[int] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        check_at_least("patience", self.patience)

    def message(self, agent: Any, metrics: dict[str, float]) -> str:
        """The warning line for the iteration that completes the streak."""
        first = agent.iteration - self.streak + 1
        why = (
            f"every group's completions got the same reward (reward_mean "
            f"{metrics.get('reward_mean', float('nan')):.3f}), so every advantage is 0"
            if metrics.get("frac_reward_zero_std", 0.0) >= 1.0
            else "the gradient norm is 0"
        )
        return (
            f"warning: no learning signal for {self.streak} iterations in a row ({first}-"
            f"{agent.iteration}): {why} and the model does not change. Sample more completions "
            f"per prompt (--group-size, now {self.group_size}), a higher --temperature (now "
            f"{self.temperature:g}), or an easier task (one the model sometimes solves)"
        )

    def __call__(self, agent: Any, metrics: dict[str, float]) -> bool | None:
        if not has_no_signal(metrics, self.max_reward):
            self.streak = 0
            return None
        self.streak += 1
        if self.streak == self.patience:
            self.warned_at.append(agent.iteration)
            if self.out is not None:
                self.out(self.message(agent, metrics))
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak, "warned_at": list(self.warned_at)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = int(state["streak"])
        self.warned_at = list(state["warned_at"])
