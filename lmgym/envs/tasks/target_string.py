"""TargetString: reproduce a fixed target string.

Reward: the fraction of target positions whose completion token is the target's
token, ``R = (1/K) * sum_{t<K} [y_t == target_t]`` with ``K = len(target)`` in
tokens; range ``[0, 1]``. Tokens past ``K`` do not count. In per-token mode the
potential form gives ``r_t = [y_t == target_t] / K`` exactly.

Random-policy baseline: ``1 / V`` per position (``V`` = vocabulary size; about
0.02 with the default character tokenizer). Solved: ``R >= 0.9``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lmgym.envs.options import EnvOptions
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import TaskParams, build_env, task_factory
from lmgym.envs.tasks._common import PositionMatchReward, encode
from lmgym.envs.token_env import TokenVectorEnv

SOLVED_THRESHOLD = 0.9


class TargetMatchReward(PositionMatchReward):
    """Fraction of the target's tokens reproduced in place; vectorised over rows.

    Args:
        target_ids: ``[K] int64`` the target's token ids.
    """

    def __init__(self, target_ids: Tensor) -> None:
        if target_ids.numel() == 0:
            raise ValueError("target: tokenises to zero tokens; pass a non-empty target")
        super().__init__(
            target_ids.reshape(1, -1), torch.tensor([target_ids.numel()]), "target_match"
        )


@dataclass(frozen=True, kw_only=True)
class TargetStringParams(TaskParams):
    """TargetString's parameters.

    Attributes:
        target: the string to reproduce.
        prompt: the single prompt.
    """

    target: str = "hello"
    prompt: str = "say hello:"


@task_factory(TargetStringParams)
def make_target_string_vector(options: EnvOptions, params: TargetStringParams) -> TokenVectorEnv:
    """The native vector env (``gymnasium.make_vec("lmgym/TargetString-v0", num_envs=...)``);
    token budget ``len(target)`` tokens by default."""
    target_ids = torch.tensor(encode(options.text_tokenizer(), params.target), dtype=torch.long)
    return build_env(
        options, [params.prompt], TargetMatchReward(target_ids), max_new_tokens=len(target_ids)
    )


make_target_string = single_env_factory(make_target_string_vector)
