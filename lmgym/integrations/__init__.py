"""Bridges to other RL tooling: observation views, Gymnasium wrappers, Stable-Baselines3.

``lmgym.integrations.sb3`` imports Stable-Baselines3; the rest needs only Gymnasium.
"""

from lmgym.integrations.wrappers import (
    FullObservation,
    LastTokensObservation,
    ObservationView,
    TerminateOnTokenBudget,
    TokenIdsObservation,
    TokenObservationWrapper,
    TorchToNumpy,
    VectorTokenObservation,
)

__all__ = [
    "FullObservation",
    "LastTokensObservation",
    "ObservationView",
    "TerminateOnTokenBudget",
    "TokenIdsObservation",
    "TokenObservationWrapper",
    "TorchToNumpy",
    "VectorTokenObservation",
]
