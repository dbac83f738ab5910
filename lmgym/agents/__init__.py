"""Policy-gradient agents, each a small composition of the shared pieces.

``ALGORITHMS`` is the one registry of them: the CLI's ``--algo`` choices, the
benchmark's ``--agents all`` and the tests' agent matrices are read from it, and
``tests/agents/test_registry.py`` checks this table against it.

| --algo        | agent         | advantage                              | ratio control                      | default aggregation     |
|---------------|---------------|----------------------------------------|------------------------------------|-------------------------|
| reinforce     | REINFORCE     | reward-to-go - baseline                | none (TIS optional)                | token-mean              |
| rloo          | RLOO          | leave-one-out group baseline           | none (TIS optional)                | token-mean              |
| ppo           | PPO           | GAE with a learned critic              | token clip                         | token-mean              |
| grpo          | GRPO          | group-normalised reward                | token clip                         | seq-mean-token-mean     |
| drgrpo        | Dr. GRPO      | group-centred reward                   | token clip                         | seq-mean-token-sum-norm |
| gspo          | GSPO          | group-normalised reward                | sequence ratio clip                | seq-mean-token-mean     |
| cispo         | CISPO         | group-normalised reward                | clipped, detached IS weight        | token-mean              |
| reinforce_pp  | REINFORCE++   | returns-to-go, z-scored over the batch | token clip                         | token-mean              |
| gspo_token    | GSPO-token    | group-normalised reward (or per token) | sequence ratio, token gradients    | seq-mean-token-mean     |
| dual_clip_ppo | dual-clip PPO | GAE with a learned critic              | token clip, loss <= -c*A for A < 0 | token-mean              |
| remax         | ReMax         | reward - greedy completion's reward    | none (TIS optional)                | token-mean              |
| vapo          | VAPO          | decoupled, length-adaptive GAE         | token clip (clip-higher)           | token-mean              |
"""

from lmgym.agents.base import Agent, Callback
from lmgym.agents.cispo import CISPO, CISPOConfig
from lmgym.agents.config import AgentConfig
from lmgym.agents.dual_clip_ppo import DualClipPPO, DualClipPPOConfig
from lmgym.agents.grpo import GRPO, DrGRPO, DrGRPOConfig, GRPOConfig
from lmgym.agents.gspo import GSPO, GSPOConfig
from lmgym.agents.gspo_token import GSPOToken, GSPOTokenConfig
from lmgym.agents.numerics import NonFiniteUpdateError
from lmgym.agents.ppo import PPO, PPOConfig
from lmgym.agents.reinforce import REINFORCE, REINFORCEConfig
from lmgym.agents.reinforce_pp import REINFORCEPP, REINFORCEPPConfig
from lmgym.agents.remax import ReMax, ReMaxConfig
from lmgym.agents.rloo import RLOO, RLOOConfig
from lmgym.agents.vapo import VAPO, VAPOConfig

ALGORITHMS: dict[str, type[Agent]] = {
    "reinforce": REINFORCE,
    "rloo": RLOO,
    "ppo": PPO,
    "grpo": GRPO,
    "drgrpo": DrGRPO,
    "gspo": GSPO,
    "cispo": CISPO,
    "reinforce_pp": REINFORCEPP,
    "gspo_token": GSPOToken,
    "dual_clip_ppo": DualClipPPO,
    "remax": ReMax,
    "vapo": VAPO,
}

__all__ = [
    "ALGORITHMS",
    "CISPO",
    "GRPO",
    "GSPO",
    "PPO",
    "REINFORCE",
    "REINFORCEPP",
    "RLOO",
    "VAPO",
    "Agent",
    "AgentConfig",
    "CISPOConfig",
    "Callback",
    "DualClipPPO",
    "DualClipPPOConfig",
    "DrGRPO",
    "DrGRPOConfig",
    "GRPOConfig",
    "GSPOConfig",
    "GSPOToken",
    "GSPOTokenConfig",
    "NonFiniteUpdateError",
    "PPOConfig",
    "REINFORCEConfig",
    "REINFORCEPPConfig",
    "RLOOConfig",
    "ReMax",
    "ReMaxConfig",
    "VAPOConfig",
]
