"""Policy-gradient agents, each a small composition of the shared pieces.

| agent      | advantage                     | ratio control             | default aggregation     |
|------------|-------------------------------|---------------------------|-------------------------|
| REINFORCE  | reward-to-go - baseline       | none (TIS optional)       | token-mean              |
| RLOO       | leave-one-out group baseline  | none (TIS optional)       | token-mean              |
| PPO        | GAE with a learned critic     | token clip                | token-mean              |
| GRPO       | group-normalised reward       | token clip                | seq-mean-token-mean     |
| Dr. GRPO   | group-centred reward          | token clip                | seq-mean-token-sum-norm |
| GSPO       | group-normalised reward       | sequence ratio clip       | seq-mean-token-mean     |
| CISPO      | group-normalised reward       | clipped, detached IS weight | token-mean            |
| ReMax      | reward - greedy completion's reward | none (TIS optional) | token-mean              |
| VAPO       | decoupled, length-adaptive GAE | token clip (clip-higher) | token-mean             |
"""

from lmgym.agents.base import Agent, Callback
from lmgym.agents.cispo import CISPO, CISPOConfig
from lmgym.agents.config import AgentConfig
from lmgym.agents.grpo import GRPO, DrGRPO, DrGRPOConfig, GRPOConfig
from lmgym.agents.gspo import GSPO, GSPOConfig
from lmgym.agents.numerics import NonFiniteUpdateError
from lmgym.agents.ppo import PPO, PPOConfig
from lmgym.agents.reinforce import REINFORCE, REINFORCEConfig
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
    "RLOO",
    "VAPO",
    "Agent",
    "AgentConfig",
    "CISPOConfig",
    "Callback",
    "DrGRPO",
    "DrGRPOConfig",
    "GRPOConfig",
    "GSPOConfig",
    "NonFiniteUpdateError",
    "PPOConfig",
    "REINFORCEConfig",
    "RLOOConfig",
    "ReMax",
    "ReMaxConfig",
    "VAPOConfig",
]
