"""LengthControl: stop after exactly ``n`` tokens.

The prompt ``"len=n:"`` asks for ``n`` tokens (default ``n`` in ``[1, 8]``), any
tokens, then the stop id. With ``T`` the completion's length without its final
stop id, the reward is

    R = max(0, 1 - |T - n| / tolerance)        (tolerance = 4 by default),

so ``R = 1`` for the exact length, 0.75 one token off, 0 four or more off; range
``[0, 1]``.

EOS handling and the unfinished policy. The default budget is ``max_length + 2``
tokens and the default ``unfinished="penalty"`` with ``unfinished_penalty=0``: a
completion that never stops earns exactly 0, whatever its length. With
``unfinished="score"`` a cut-off completion is scored by its length like any
other (``T`` = the budget), and with ``"mask"`` it is scored but dropped from the
loss; the three settings give visibly different learning signals, which is the
point of the task.

In per-token mode the potential form scores every prefix by its length: the
reward rises by ``1/tolerance`` per token while ``T <= n`` and falls after, a
dense shaping of the same objective (its sum is the bandit score).

Random-policy baseline (uniform token ids, default settings): about 0.07 (the
random policy rarely emits EOS). Solved: ``R >= 0.9``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lmgym.envs.options import EnvOptions
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import TaskParams, build_env, task_factory
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.types import RewardInput

SOLVED_THRESHOLD = 0.9


class LengthReward:
    """``R = max(0, 1 - |T - n_p| / tolerance)``; vectorised over rows.

    Args:
        target_lengths: ``[P] int64`` target ``n`` of each prompt.
        stop_token_ids: ``[S] int64`` ids that end a completion (not counted in ``T``).
        tolerance: how many tokens off brings the reward to 0.
    """

    name = "length"

    def __init__(self, target_lengths: Tensor, stop_token_ids: Tensor, tolerance: float) -> None:
        if not tolerance > 0:
            raise ValueError(f"tolerance={tolerance!r}: must be > 0")
        self.target_lengths = target_lengths
        self.stop_token_ids = stop_token_ids
        self.tolerance = float(tolerance)

    def completion_lengths(self, batch: RewardInput) -> Tensor:
        """``[N] int64`` tokens per completion, a final stop id excluded."""
        real = batch.completion_mask.sum(dim=1)
        last = batch.completion_ids.gather(1, (real - 1).clamp(min=0)[:, None]).squeeze(1)
        stopped = (real > 0) & torch.isin(last, self.stop_token_ids.to(last.device))
        return real - stopped.long()

    def __call__(self, batch: RewardInput) -> Tensor:
        device = batch.completion_ids.device
        target = self.target_lengths.to(device)[batch.prompt_index.to(device)]
        error = (self.completion_lengths(batch) - target).abs().float()
        return (1.0 - error / self.tolerance).clamp(min=0.0)


@dataclass(frozen=True, kw_only=True)
class LengthControlParams(TaskParams):
    """LengthControl's parameters.

    Attributes:
        min_length: shortest target length ``n`` (tokens, >= 0).
        max_length: longest target length; one prompt per ``n`` in between.
        tolerance: tokens off at which the reward reaches 0.
    """

    min_length: int = 1
    max_length: int = 8
    tolerance: float = 4.0


@task_factory(LengthControlParams, unfinished="penalty", unfinished_penalty=0.0)
def make_length_control_vector(options: EnvOptions, params: LengthControlParams) -> TokenVectorEnv:
    """``lmgym/LengthControl-v0`` as a native vector env (parameters:
    ``LengthControlParams``).

    Env options it sets a default for or reads:
        max_new_tokens: token budget (default ``max_length + 2``; must exceed
            ``max_length`` so every target is reachable with its stop id).
        unfinished: the env's unfinished-completion policy (default ``"penalty"``).
        unfinished_penalty: the return of a completion that never stops (default 0).
        stop_token_ids: the ids that end a completion (not counted in its length);
            default the tokenizer's EOS.
    """
    min_length, max_length = params.min_length, params.max_length
    if not 0 <= min_length <= max_length:
        raise ValueError(
            f"min_length={min_length}, max_length={max_length}: need 0 <= min_length <= max_length"
        )
    max_new_tokens = options.max_new_tokens or max_length + 2
    if max_new_tokens <= max_length:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} leaves no room for the stop id after "
            f"max_length={max_length} tokens; use max_new_tokens > max_length"
        )
    if options.stop_token_ids is None and options.text_tokenizer().eos_token_id is None:
        raise ValueError("tokenizer: LengthControl ends completions with EOS; it has none")
    lengths = torch.arange(min_length, max_length + 1)
    reward = LengthReward(lengths, torch.tensor(options.stop_ids()), params.tolerance)
    return build_env(
        options, [f"len={n}:" for n in lengths.tolist()], reward, max_new_tokens=max_new_tokens
    )


make_length_control = single_env_factory(make_length_control_vector)
