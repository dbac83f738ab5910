"""Stable-Baselines3 helpers for the learning tests (imports ``stable_baselines3``)."""

from __future__ import annotations

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback


class EpisodeReturns(BaseCallback):
    """Collects the return of every finished episode, in order (the ``"episode"``
    statistics the vector env reports in the info of a row that is done)."""

    def __init__(self) -> None:
        super().__init__()
        self.returns: list[float] = []

    def _on_step(self) -> bool:
        infos = self.locals["infos"]
        self.returns.extend(infos[i]["episode"]["r"] for i in np.flatnonzero(self.locals["dones"]))
        return True
