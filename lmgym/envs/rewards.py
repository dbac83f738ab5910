"""Reward-model adapters and the validation every reward output goes through.

A reward model is any callable ``RewardInput -> [N] floats`` (``lmgym.types.RewardModel``).
Three adapters cover the usual sources:

- ``FunctionReward``: a plain Python function over decoded prompt/completion strings;
- ``SequenceClassifierReward``: a transformers ``AutoModelForSequenceClassification``
  (re-tokenises the text with its own tokenizer, so it need not share the policy's);
- ``TokenModuleReward``: any torch module over token ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lmgym.types import RewardInput, RewardModel


class RewardError(ValueError):
    """A reward model returned something lmgym cannot use (wrong count, NaN, not a number)."""


def reward_name(reward: RewardModel) -> str:
    """A readable name for error messages and per-reward logs."""
    name = getattr(reward, "name", None)
    if isinstance(name, str):
        return name
    return getattr(reward, "__qualname__", type(reward).__qualname__)


def validate_rewards(
    values: Tensor | Sequence[float], batch: RewardInput, reward: RewardModel
) -> Tensor:
    """Convert a reward output to ``[N] float32`` and reject anything unusable.

    Raises:
        RewardError: wrong number of values, a value that is not a real number,
            or NaN/inf; the message names the reward model and the offending row.
    """
    name = reward_name(reward)
    n = batch.completion_ids.shape[0]
    try:
        scores = torch.as_tensor(values, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as err:
        raise RewardError(
            f"reward {name!r} returned {type(values).__name__} that is not a sequence of "
            f"numbers ({err}); return one float per completion"
        ) from err
    scores = scores.to(batch.completion_ids.device).reshape(-1)
    if scores.shape[0] != n:
        raise RewardError(
            f"reward {name!r} returned {scores.shape[0]} values for {n} completions; "
            "return exactly one float per completion, in input order"
        )
    bad = ~torch.isfinite(scores)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise RewardError(
            f"reward {name!r} returned {scores[row].item()} for row {row} "
            f"(prompt={batch.prompts[row]!r}, completion={batch.completions[row]!r}); "
            "rewards must be finite: map failures to a finite penalty instead"
        )
    return scores


class FunctionReward:
    """Wrap a Python function over decoded strings as a reward model.

    Args:
        fn: ``fn(prompts: list[str], completions: list[str]) -> Sequence[float]``
            when ``batched`` (default), else ``fn(prompt: str, completion: str) -> float``
            called once per row.
        batched: Whether ``fn`` takes whole lists.
        name: Name used in errors and logs (default: the function's name).
    """

    def __init__(
        self,
        fn: Callable[..., Sequence[float] | Tensor | float],
        batched: bool = True,
        name: str | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
        self.fn = fn
        self.batched = batched
        self.name = name or getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, batch: RewardInput) -> Tensor | Sequence[float]:
        prompts, completions = list(batch.prompts), list(batch.completions)
        if self.batched:
            return self.fn(prompts, completions)
        return [self.fn(p, c) for p, c in zip(prompts, completions, strict=True)]


class SequenceClassifierReward:
    """Score prompt + completion with a transformers sequence-classification model.

    The text is re-tokenised with ``tokenizer`` (the reward model's own), so the
    reward model may use another vocabulary than the policy. The score is logit
    ``label_index`` of the model's output.

    Args:
        model: e.g. ``AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)``.
        tokenizer: The reward model's tokenizer; needs a pad token.
        label_index: Which output logit is the reward.
        max_length: Truncation length of the re-tokenised text (the model's limit).
        name: Name used in errors and logs.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        label_index: int = 0,
        max_length: int | None = None,
        name: str = "sequence_classifier",
    ) -> None:
        if tokenizer.pad_token_id is None:
            raise ValueError(
                "tokenizer: the reward model's tokenizer has no pad token; "
                "set tokenizer.pad_token (e.g. to its eos token)"
            )
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.label_index = label_index
        self.max_length = max_length
        self.name = name

    @torch.no_grad()
    def __call__(self, batch: RewardInput) -> Tensor:
        texts = [p + c for p, c in zip(batch.prompts, batch.completions, strict=True)]
        enc = self.tokenizer(
            texts,
            return_tensors="pt",
            padding=True,
            truncation=self.max_length is not None,
            max_length=self.max_length,
        )
        device = next(self.model.parameters()).device
        out = self.model(**{k: v.to(device) for k, v in enc.items()})
        return out.logits[:, self.label_index].float()


class TokenModuleReward:
    """Any torch module over token ids as a reward model.

    The module is called as ``module(input_ids [N, S] int64, attention_mask [N, S] bool)``
    on prompt and completion joined (left-padded prompt, right-padded completion:
    padding may sit inside the row, the mask says where) and must return ``[N]``
    (or ``[N, 1]``) scores.
    """

    def __init__(
        self, module: torch.nn.Module | Callable[[Tensor, Tensor], Tensor], name: str | None = None
    ):
        self.module = module
        self.name = name or type(module).__name__

    @torch.no_grad()
    def __call__(self, batch: RewardInput) -> Tensor:
        ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
        mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
        return self.module(ids, mask).reshape(-1)
