"""Stable-Baselines3 helpers for the learning tests (imports ``stable_baselines3``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback


class EpisodeReturns(BaseCallback):
    """Collects the return of every finished episode, in order (the ``"episode"``
    statistics the vector env reports in the info of a row that is done).

    Args:
        stop_once: called with the returns so far after every step; training stops
            (SB3's callback protocol) once it says True. ``None``: never.
    """

    def __init__(self, stop_once: Callable[[list[float]], bool] | None = None) -> None:
        super().__init__()
        self.returns: list[float] = []
        self.stop_once = stop_once

    def _on_step(self) -> bool:
        infos = self.locals["infos"]
        self.returns.extend(infos[i]["episode"]["r"] for i in np.flatnonzero(self.locals["dones"]))
        return self.stop_once is None or not self.stop_once(self.returns)
