"""TargetString: reproduce a fixed target string.

Reward: the fraction of target positions whose completion token is the target's
token, ``R = (1/K) * sum_{t<K} [y_t == target_t]`` with ``K = len(target)`` in
tokens; range ``[0, 1]``. Tokens past ``K`` do not count. In per-token mode the
potential form gives ``r_t = [y_t == target_t] / K`` exactly.

Random-policy baseline: ``1 / V`` per position (``V`` = vocabulary size; about
0.02 with the default character tokenizer). Solved: ``R >= 0.9``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs.single import single_env_factory
from lmgym.envs.tasks._common import PositionMatchReward, build_env, encode
from lmgym.envs.token_env import RewardMode, TokenVectorEnv, Unfinished
from lmgym.policy.special_tokens import AllowedSpecialTokens

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


def make_target_string_vector(
    num_envs: int = 1,
    group_size: int = 1,
    target: str = "hello",
    prompt: str = "say hello:",
    max_new_tokens: int | None = None,
    reward_mode: RewardMode = "bandit",
    unfinished: Unfinished = "score",
    autoreset: bool = False,
    allowed_special_tokens: AllowedSpecialTokens = (),
    tokenizer: PreTrainedTokenizerBase | None = None,
    device: torch.device | str = "cpu",
) -> TokenVectorEnv:
    """The native vector env (``gymnasium.make_vec("lmgym/TargetString-v0", num_envs=...)``).

    Args:
        num_envs: ``num_prompts * group_size`` rows; must be a multiple of ``group_size``.
        group_size: completions per prompt (e.g. 8 for GRPO).
        target: the string to reproduce.
        prompt: the single prompt.
        max_new_tokens: token budget (default ``len(target)`` tokens).
        tokenizer: default the built-in character tokenizer.
    """
    tokenizer = tokenizer or make_char_tokenizer()
    target_ids = torch.tensor(encode(tokenizer, target), dtype=torch.long)
    return build_env(
        tokenizer,
        [prompt],
        TargetMatchReward(target_ids),
        num_envs=num_envs,
        group_size=group_size,
        max_new_tokens=max_new_tokens or len(target_ids),
        reward_mode=reward_mode,
        unfinished=unfinished,
        autoreset=autoreset,
        allowed_special_tokens=allowed_special_tokens,
        device=device,
    )


make_target_string = single_env_factory(make_target_string_vector)
