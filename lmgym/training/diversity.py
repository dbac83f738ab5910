"""How varied a policy's answers are: what shows a policy collapsing to one answer.

A policy that collapses answers every prompt the same way ("Yes" to every yes/no
question): its completions stop differing within a prompt's samples and across
prompts. An evaluation measures both (``answer_spread``), on the completions'
*answers* (``answer_key``: case, surrounding space and trailing punctuation
ignored, so ``"Yes."`` and ``" yes"`` are one answer):

- ``distinct_per_prompt``: the mean number of distinct answers among a prompt's
  ``k`` samples (``k`` when every sample differs, 1 when all agree);
- ``top_answer`` and ``top_answer_share``: the most common answer over every
  sample of every prompt, and its share (1.0: one answer to everything);
- ``top_answer_reward``: the mean reward of the completions giving it. On a task
  with one right answer for every prompt, a policy that gives it everywhere has
  collapsed onto the solution (reward the best); one that gives "Yes" to yes/no
  questions has not (reward about the share of "Yes" rows).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_TRAILING = ".!?,;:\"'`"


def answer_key(completion: str) -> str:
    """A completion as an answer: lower case, without surrounding space or trailing punctuation."""
    return completion.strip().rstrip(_TRAILING).strip().lower()


@dataclass(frozen=True)
class AnswerSpread:
    """How varied an evaluation's answers were (see the module docstring)."""

    distinct_per_prompt: float
    top_answer: str
    top_answer_share: float
    top_answer_reward: float


def answer_spread(
    completions: Sequence[str], prompt_ids: Sequence[int], rewards: Sequence[float]
) -> AnswerSpread:
    """The spread of ``completions``, each sampled for the prompt ``prompt_ids[i]`` and
    scored ``rewards[i]``.

    Raises:
        ValueError: no completions, or the sequences differ in length.
    """
    if not completions or not len(completions) == len(prompt_ids) == len(rewards):
        raise ValueError(
            f"answer_spread: need as many prompt ids and rewards as completions (at least "
            f"one), got {len(completions)}, {len(prompt_ids)} and {len(rewards)}"
        )
    keys = [answer_key(c) for c in completions]
    per_prompt: dict[int, set[str]] = {}
    for key, prompt in zip(keys, prompt_ids, strict=True):
        per_prompt.setdefault(int(prompt), set()).add(key)
    top, count = Counter(keys).most_common(1)[0]
    top_rewards = [float(r) for key, r in zip(keys, rewards, strict=True) if key == top]
    return AnswerSpread(
        distinct_per_prompt=sum(len(s) for s in per_prompt.values()) / len(per_prompt),
        top_answer=top,
        top_answer_share=count / len(keys),
        top_answer_reward=sum(top_rewards) / len(top_rewards),
    )
