"""Evaluation: mean reward, pass@k and mean completion length on a task's eval prompts.

``evaluate_policy(policy, env, num_prompts)`` draws ``num_prompts`` prompts from
``env`` (a pass over its prompts in an order seeded by ``seed``, repeated when the
source is smaller) and samples ``k = env.group_size`` completions for each, with a
generator of its own, so evaluating never moves a training run's random streams.

``make_eval_env`` builds that env for a registered task: the task's held-out
``split="eval"`` where its factory has one (Reverse, Sort, CopyRule, Arithmetic,
ArithmeticProcess, a ``--prompts`` file: ``lmgym.training.holdout``), otherwise the
task's only prompts, which are its training prompts (``TRAINING_SPLIT`` says so).

pass@k. A completion is *correct* when its reward reaches the task's maximum
(``TaskInfo.reward_range[1]``, minus 1e-6) on the tasks whose reward is an
exact-match verifier, listed in ``VERIFIED_TASKS``: reward 1 there means the
answer is exactly right. Other tasks report no pass@k unless a
``correct_threshold`` is given. With ``n`` samples of which ``c`` are correct,
``pass@k = 1 - C(n - c, k) / C(n, k)`` (the unbiased estimator of Chen et al.,
2021), averaged over prompts; ``pass@1`` is then the mean share of correct samples.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import gymnasium as gym
import torch
from transformers import PreTrainedTokenizerBase

from lmgym.envs.registration import batch_arguments, vector_entry_point
from lmgym.envs.task_factory import factory_arguments
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.policy.causal_lm import CausalLMPolicy
from lmgym.rollout import collect
from lmgym.training.sample_text import episode_texts, prompt_label
from lmgym.typed_values import check_at_least

# How varied a policy's answers are: what shows a policy collapsing to one answer.
#
# A policy that collapses answers every prompt the same way ("Yes" to every yes/no
# question): its completions stop differing within a prompt's samples and across
# prompts. An evaluation measures both (``answer_spread``), on the completions'
# *answers* (``answer_key``: case, surrounding space and trailing punctuation
# ignored, so ``"Yes."`` and ``" yes"`` are one answer):
#
# - ``distinct_per_prompt``: the mean number of distinct answers among a prompt's
#   ``k`` samples (``k`` when every sample differs, 1 when all agree);
# - ``top_answer`` and ``top_answer_share``: the most common answer over every
#   sample of every prompt, and its share (1.0: one answer to everything);
# - ``top_answer_reward``: the mean reward of the completions giving it. On a task
#   with one right answer for every prompt, a policy that gives it everywhere has
#   collapsed onto the solution (reward the best); one that gives "Yes" to yes/no
#   questions has not (reward about the share of "Yes" rows).


_TRAILING = ".!?,;:\"'`"


def answer_key(completion: str) -> str:
    """A completion as an answer: lower case, without surrounding space or trailing punctuation."""
    return completion.strip().rstrip(_TRAILING).strip().lower()


@dataclass(frozen=True)
class AnswerSpread:
    """How varied an evaluation's answers were (the comment above ``answer_key``)."""

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


VERIFIED_TASKS: dict[str, str] = {
    "lmgym/TargetString-v0": "the completion starts with the target string",
    "lmgym/Reverse-v0": "every answer position is right",
    "lmgym/Sort-v0": "every answer position is right",
    "lmgym/CopyRule-v0": "every answer position is right",
    "lmgym/Arithmetic-v0": "the exact answer, then EOS",
    "lmgym/WordProblem-v0": "the exact answer from the task's answer column",
    "lmgym/ArithmeticProcess-v0": "the exact answer, then EOS",
    "lmgym/ChatArithmetic-v0": "the answer, as the task's answer= rule extracts it",
}
"""Tasks whose maximal reward means an exactly right answer: pass@k is defined there."""

TRAINING_SPLIT = "training prompts (no held-out split)"
"""The split an evaluation names when the task has no held-out prompts: it ran on the
prompts the run trains on (a task without a ``split``, or ``--prompts`` with ``--no-holdout``)."""

EVAL_BATCH_PROMPTS = 32
"""Prompts per evaluation rollout (the env's ``num_prompts``)."""


vector_factory = vector_entry_point
"""The callable behind ``gymnasium.make_vec(task, ...)`` (``lmgym.envs.registration``)."""


def factory_accepts(task: str, name: str) -> bool:
    """Whether the task's vector factory takes the keyword ``name``
    (``lmgym.envs.task_factory.factory_arguments``)."""
    arguments, takes_any = factory_arguments(vector_factory(task))
    return name in arguments or takes_any


def correct_threshold_for(task: str) -> float | None:
    """The reward at which a completion counts as correct, or None (no verifier)."""
    from lmgym.envs.registration import TASKS

    if task in VERIFIED_TASKS and task in TASKS:
        return TASKS[task].reward_range[1] - 1e-6
    return None


def make_eval_env(
    task: str,
    tokenizer: PreTrainedTokenizerBase,
    num_prompts: int,
    samples_per_prompt: int,
    *,
    split: str = "eval",
    env_kwargs: dict[str, Any] | None = None,
    device: torch.device | str = "cpu",
) -> tuple[TokenVectorEnv, str]:
    """An episode-synchronous env for evaluating ``task``.

    Args:
        task: a registered task id.
        tokenizer: the policy's tokenizer.
        num_prompts: prompts the evaluation will draw (at most ``EVAL_BATCH_PROMPTS``
            per rollout).
        samples_per_prompt: completions per prompt (the env's ``group_size``).
        split: ``"eval"`` (held-out prompts), ``"train"`` or ``"all"``; used where the
            task's factory takes a ``split``.
        env_kwargs: the run's other env factory arguments (reward mode, ...).
        device: where the env's tensors live.

    Returns:
        ``(env, split)``, ``split`` saying which prompts were used, e.g. ``"eval"`` or
        ``TRAINING_SPLIT``.
    """
    kwargs = dict(env_kwargs or {})
    kwargs.pop("split", None)
    if factory_accepts(task, "autoreset"):
        kwargs["autoreset"] = False
    used = TRAINING_SPLIT
    if factory_accepts(task, "split"):
        kwargs["split"] = split
        used = split
    batch = min(num_prompts, EVAL_BATCH_PROMPTS)
    env = gym.make_vec(
        task,
        **batch_arguments(task, batch, samples_per_prompt),
        tokenizer=tokenizer,
        device=device,
        **kwargs,
    )
    return env, used  # type: ignore[return-value]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct: ``1 - C(n-c, k) / C(n, k)``.

    Raises:
        ValueError: ``k > n`` or ``c`` outside ``[0, n]``.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class EvalResult:
    """What one evaluation measured.

    Attributes:
        reward_mean, reward_std: over every sampled completion's episode return.
        completion_length: mean number of tokens the policy sampled per episode (EOS
            included; a multi-turn episode's observations are not the policy's), as
            the update's ``completion_length`` counts them.
        pass_at_1, pass_at_k: ``None`` when the task has no verifier.
        num_prompts, samples_per_prompt: ``n`` prompts times ``k`` completions.
        split: which prompts (see ``make_eval_env``).
        correct_threshold: the reward counted as correct, if any.
        samples: a few ``(prompt, completion, reward)``, one per prompt first; a chat
            prompt as its last user message (``sample_text.prompt_label``), a
            multi-turn completion as its whole episode (``sample_text.episode_texts``).
        distinct_per_prompt, top_answer, top_answer_share, top_answer_reward: how varied
            the answers were (``answer_spread``); ``None`` in records written
            before them.
    """

    reward_mean: float
    reward_std: float
    completion_length: float
    pass_at_1: float | None
    pass_at_k: float | None
    num_prompts: int
    samples_per_prompt: int
    split: str = ""
    correct_threshold: float | None = None
    samples: list[tuple[str, str, float]] = field(default_factory=list, repr=False)
    distinct_per_prompt: float | None = None
    top_answer: str | None = None
    top_answer_share: float | None = None
    top_answer_reward: float | None = None

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """The numbers as a flat metrics dict (``eval/reward_mean``, ``eval/pass@4``, ...)."""
        out = {
            f"{prefix}reward_mean": self.reward_mean,
            f"{prefix}reward_std": self.reward_std,
            f"{prefix}completion_length": self.completion_length,
        }
        if self.pass_at_1 is not None and self.pass_at_k is not None:
            out[f"{prefix}pass@1"] = self.pass_at_1
            out[f"{prefix}pass@{self.samples_per_prompt}"] = self.pass_at_k
        if self.distinct_per_prompt is not None and self.top_answer_share is not None:
            out[f"{prefix}distinct_per_prompt"] = self.distinct_per_prompt
            out[f"{prefix}top_answer_share"] = self.top_answer_share
        return out

    def summary(self) -> str:
        """One line: reward, pass@1/pass@k, length and what was sampled."""
        parts = [f"reward {self.reward_mean:.3f} (std {self.reward_std:.3f})"]
        if self.pass_at_1 is not None and self.pass_at_k is not None:
            parts.append(f"pass@1 {self.pass_at_1:.3f}")
            parts.append(f"pass@{self.samples_per_prompt} {self.pass_at_k:.3f}")
        parts.append(f"length {self.completion_length:.2f}")
        return (
            ", ".join(parts)
            + f"  ({self.num_prompts} prompts x {self.samples_per_prompt} samples, "
            + f"split {self.split or '?'})"
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (samples as lists)."""
        data = asdict(self)
        data["samples"] = [list(s) for s in self.samples]
        return data


@torch.no_grad()
def evaluate_policy(
    policy: CausalLMPolicy,
    env: TokenVectorEnv,
    num_prompts: int,
    *,
    seed: int = 0,
    correct_threshold: float | None = None,
    split: str = "",
    num_samples_kept: int = 8,
) -> EvalResult:
    """Sample ``env.group_size`` completions for each of ``num_prompts`` prompts and score them.

    The env is reset with ``seed`` and the sampler uses its own generator seeded
    with ``seed``: the same call gives the same result, and no other RNG moves.

    Args:
        policy: the policy to sample from (not updated).
        env: an episode-synchronous env (``make_eval_env``); groups = prompts.
        num_prompts: prompts to draw (``env.num_prompts`` per rollout).
        seed: seeds the prompt order and the sampler.
        correct_threshold: reward counted as correct; ``None``: no pass@k.
        split: recorded in the result.
        num_samples_kept: how many ``(prompt, completion, reward)`` to keep.

    Returns:
        An ``EvalResult``.
    """
    check_at_least("num_prompts", num_prompts)
    generator = torch.Generator(device=policy.device)
    generator.manual_seed(seed)
    k = env.group_size
    scores, lengths, groups, prompt_index, completions = [], [], [], [], []
    have = 0
    first = True
    while have < num_prompts:
        batch = collect(env, policy, seed=seed if first else None, generator=generator)
        first = False
        keep = batch.group_ids < num_prompts  # group ids count from 0 after reset(seed)
        batch = batch.select(keep)
        scores.append(batch.scores.cpu())
        lengths.append(batch.policy_lengths.cpu())
        groups.append(batch.group_ids.cpu())
        prompt_index.append(batch.prompt_index.cpu())
        completions += episode_texts(env, batch)
        have = int(torch.cat(groups).unique().numel())
    score = torch.cat(scores)
    group = torch.cat(groups)
    spread = answer_spread(completions, group.tolist(), score.tolist())
    index = torch.cat(prompt_index)
    pass1 = passk = None
    if correct_threshold is not None:
        correct = score >= correct_threshold
        per_group = [int(correct[group == g].sum()) for g in group.unique().tolist()]
        pass1 = sum(pass_at_k(k, c, 1) for c in per_group) / len(per_group)
        passk = sum(pass_at_k(k, c, k) for c in per_group) / len(per_group)
    # One sample per prompt first, then the rest, so a few lines show several prompts.
    order = sorted(range(len(completions)), key=lambda i: (i % k, i // k))[:num_samples_kept]
    table = env.prompt_table
    samples = [
        (prompt_label(table.prompts[j], table.texts[j]), completions[i], float(score[i]))
        for i, j in ((i, int(index[i])) for i in order)
    ]
    return EvalResult(
        reward_mean=float(score.mean()),
        reward_std=float(score.std()) if score.numel() > 1 else 0.0,
        completion_length=float(torch.cat(lengths).float().mean()),
        pass_at_1=pass1,
        pass_at_k=passk,
        num_prompts=num_prompts,
        samples_per_prompt=k,
        split=split,
        correct_threshold=correct_threshold,
        samples=samples,
        distinct_per_prompt=spread.distinct_per_prompt,
        top_answer=spread.top_answer,
        top_answer_share=spread.top_answer_share,
        top_answer_reward=spread.top_answer_reward,
    )


def derived_seed(seed: int, iteration: int, stream: int) -> int:
    """A seed for side stream ``stream`` (eval, samples, ...) at ``iteration``: a fixed
    function of the run's seed, so a resumed run draws the same evaluations."""
    return (seed * 1_000_003 + iteration * 7_919 + stream * 104_729) % (2**62)


@dataclass(frozen=True)
class HeldOut:
    """What a run evaluates on, the one record its evaluations share.

    Attributes:
        env: the evaluation env (``make_eval_env``).
        num_prompts: prompts per evaluation.
        seed: the run's seed; each evaluation derives its own (``derived_seed``).
        correct_threshold: reward counted as correct for pass@k (``None``: no pass@k).
        split: which prompts, for the record.
    """

    env: TokenVectorEnv
    num_prompts: int
    seed: int = 0
    correct_threshold: float | None = None
    split: str = ""

    def evaluate(self, policy: CausalLMPolicy, iteration: int, stream: int) -> EvalResult:
        """Evaluate ``policy`` with the seed of side stream ``stream`` at ``iteration``."""
        return evaluate_policy(
            policy,
            self.env,
            self.num_prompts,
            seed=derived_seed(self.seed, iteration, stream),
            correct_threshold=self.correct_threshold,
            split=self.split,
        )
