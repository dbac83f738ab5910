"""The training run's progress bar: the metrics that say whether it learns.

``Agent.learn(progress_bar=True)`` shows reward, a KL and length whatever the run;
without a reference model (``beta`` 0) that KL is always 0. ``RunProgressBar``
shows the reward, the share of flat groups (``flat``: groups whose rewards are all
equal give no signal), the completion length, and the KL to the reference only
when the run has one (``beta > 0``), and ``warn``: the suspect-result warnings that
hold now (``lmgym.training.suspect``: ``collapse``, ``flat``, ``held-out falls``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmgym.training.callbacks import TrainingCallback


def postfix(metrics: dict[str, float], show_kl: bool, warn: str = "") -> dict[str, str]:
    """The bar's ``name: value`` fields for one iteration's metrics (and warnings)."""
    fields = {"reward": f"{metrics.get('reward_mean', float('nan')):.3f}"}
    if "frac_reward_zero_std" in metrics:
        fields["flat"] = f"{metrics['frac_reward_zero_std']:.0%}"
    if show_kl:
        kl = metrics.get("kl_ref_k3", metrics.get("kl_ref", float("nan")))
        fields["kl"] = f"{kl:.4f}"
    if "completion_length" in metrics:
        fields["len"] = f"{metrics['completion_length']:.1f}"
    if warn:
        fields["warn"] = warn
    return fields


class RunProgressBar(TrainingCallback):
    """A tqdm bar over a session's iterations (from the agent's iteration to ``total``).

    Args:
        total: the run's total iterations.
        name: the bar's label (the algorithm).
        show_kl: show the KL to the reference (the run has ``beta > 0``).
        warnings: returns the warnings that hold now (``SuspectWatch.status``), if any.
    """

    def __init__(
        self,
        total: int,
        name: str,
        show_kl: bool,
        warnings: Callable[[], str] | None = None,
    ) -> None:
        self.total, self.name, self.show_kl, self.warnings = total, name, show_kl, warnings
        self.bar: Any = None

    def on_learn_start(self, agent: Any) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.total, initial=agent.iteration, desc=self.name, unit="it")

    def __call__(self, agent: Any, metrics: dict[str, float]) -> bool | None:
        if self.bar is not None:
            self.bar.update(1)
            warn = self.warnings() if self.warnings is not None else ""
            self.bar.set_postfix(postfix(metrics, self.show_kl, warn))
        return None

    def on_learn_end(self, agent: Any, history: list[dict[str, float]]) -> None:
        self.close()

    def close(self) -> None:
        """Close the bar (also after an exception, when ``on_learn_end`` is not called)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
