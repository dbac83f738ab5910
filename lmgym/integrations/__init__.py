"""Bridges to other RL tooling: observation views, Gymnasium wrappers, Stable-Baselines3.

``lmgym.integrations.sb3`` imports Stable-Baselines3; ``openenv_client`` (an OpenEnv
server as a multi-turn task), ``openenv_server`` (an lmgym task served as an OpenEnv
environment), ``openenv_models`` and ``openenv_local`` need ``pip install
'lmgym[openenv]'``; the rest needs only Gymnasium.
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
