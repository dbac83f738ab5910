"""Plug in your own reward: a Python function becomes a registered Gymnasium env, and
GRPO trains a tiny GPT-2 on it.

Run ``python examples/custom_reward.py``. The reward below is the share of vowels in
the completion; any ``fn(prompt, completion) -> float`` works the same way (batched
``fn(prompts, completions) -> list`` with ``FunctionReward(fn)``, several rewards with
``CombinedReward([(r1, 1.0), (r2, 0.5)])``). A reward with a reference answer names
the data's column: ``fn(prompt, completion, answer)`` over
``JsonlPrompts("data.jsonl")`` whose lines hold ``{"prompt": ..., "answer": ...}``.
The registered env takes every env option of a built-in task (``tokenizer``,
``device``, ``autoreset``, ``stop_token_ids``, ...; ``lmgym.envs.EnvOptions``).
"""

from __future__ import annotations

import gymnasium as gym
import torch

from lmgym import CausalLMPolicy, make_tiny_model
from lmgym.agents import GRPO
from lmgym.envs import FunctionReward, register_reward_env


def vowel_share(prompt: str, completion: str) -> float:
    """The reward: share of vowels in the completion (0 for an empty one)."""
    return sum(c in "aeiou" for c in completion) / max(len(completion), 1)


def main(iterations: int = 40, seed: int = 0) -> tuple[float, float]:
    """Train, print the mean reward before and after; return ``(before, after)``."""
    # --- the ten lines: reward function -> registered env -> agent -> learn ---
    env_id = register_reward_env(
        "VowelShare",
        FunctionReward(vowel_share, batched=False),
        prompts=["sing:", "hum:", "chant:", "say:"],
        max_new_tokens=8,
        solved_threshold=0.9,
    )
    env = gym.make_vec(env_id, num_envs=32, group_size=8)  # 4 prompts x 8 completions
    policy = CausalLMPolicy(make_tiny_model(len(env.tokenizer), seed=seed), env.tokenizer)
    history = GRPO(policy, env, seed=seed).learn(iterations=iterations)
    # ---------------------------------------------------------------------------
    window = max(1, min(5, iterations // 4))
    before = sum(h["reward_mean"] for h in history[:window]) / window
    after = sum(h["reward_mean"] for h in history[-window:]) / window
    print(
        f"{env_id}: mean reward {before:.3f} (first {window} iterations) -> {after:.3f} (last {window})"
    )
    return before, after


if __name__ == "__main__":
    # Tiny models are overhead-bound: one thread is several times faster than two.
    torch.set_num_threads(1)
    main()
