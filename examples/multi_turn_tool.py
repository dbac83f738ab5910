"""A multi-turn tool-use task: the policy may call a calculator before it answers.

Run ``python examples/multi_turn_tool.py``. ``lmgym/Calculator-v0`` asks for the
value of an expression (``"what is 4+7+2?"``); in each turn the policy writes either
``calc: EXPR`` (the environment, speaking as a tool, answers with the value) or
``answer: N`` (scored 1 if right, and the episode ends). The script

1. plays one episode with a scripted policy, to show what a row's buffer holds:
   the prompt, the policy's turns and, between them, the tool's answers, which the
   env appended as tokens (state, not actions: ``policy_mask`` is False on them);
2. trains a tiny GPT-2 on the task with GRPO for a few iterations and prints one of
   its sampled episodes the same way. An untrained tiny model rarely writes the
   ``calc:``/``answer:`` format, so expect rewards near 0 here: the point is the
   loop. Give ``lmgym train --task lmgym/Calculator-v0`` a pretrained model (and
   ``stop_token_ids=policy.stop_token_ids``) for a real run.

The same code runs any multi-turn task: ``lmgym/GuessNumber-v0``,
``lmgym/FrozenLake-v0``, or your own responder (``register_responder_env``,
docs/tasks.md).
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import Tensor

import lmgym  # noqa: F401  (registers the lmgym/... tasks)
from lmgym import CausalLMPolicy, make_tiny_model
from lmgym.agents import GRPO
from lmgym.rollout import collect

TASK = "lmgym/Calculator-v0"
# One-digit operands and only "+": values a reader can check at a glance.
TASK_OPTIONS = {"digits": 1, "operations": "+", "dataset_size": 200}


def show(tokenizer, ids: Tensor, mask: Tensor, policy_mask: Tensor) -> str:
    """A row's completion region as text, the environment's tokens in ``[...]``.

    Args:
        ids: ``[L] int64`` the row's completion region.
        mask: ``[L] bool`` True on real tokens (the rest is padding).
        policy_mask: ``[L] bool`` True on the tokens the policy wrote.
    """
    pieces: list[tuple[bool, list[int]]] = []
    for token, mine in zip(ids[mask].tolist(), policy_mask[mask].tolist(), strict=True):
        if pieces and pieces[-1][0] == mine:
            pieces[-1][1].append(token)
        else:
            pieces.append((mine, [token]))
    return "".join(
        tokenizer.decode(run) if mine else f"[{tokenizer.decode(run)}]" for mine, run in pieces
    )


def scripted_episode(seed: int = 0) -> tuple[float, str]:
    """Play one episode whose policy calls the calculator on the question, then
    copies the value; returns ``(return, the completion region shown by show)``."""
    env = gym.make_vec(TASK, num_envs=1, group_size=1, **TASK_OPTIONS)
    tok = env.tokenizer
    obs, info = env.reset(seed=seed)
    prompt = env.prompt_table.prompts[int(info["prompt_index"][0])]
    expression = prompt.split("what is ")[1].split("?")[0]
    value = env.prompt_table.columns["answer"][int(info["prompt_index"][0])]
    total = 0.0
    for turn in (f"calc: {expression}", f"answer: {value}"):
        for token in tok(turn, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]:
            obs, reward, terminated, truncated, info = env.step(torch.tensor([token]))
            total += float(reward[0])
    region = slice(env.prompt_width, None)
    text = show(
        tok,
        obs["input_ids"][0, region],
        obs["attention_mask"][0, region].bool(),
        obs["policy_mask"][0, region],
    )
    return total, f"{prompt!r}\n  -> {text!r}"


def main(
    iterations: int = 10, num_envs: int = 32, group_size: int = 8, seed: int = 0
) -> tuple[float, list[dict[str, float]]]:
    """Show a scripted episode, then train GRPO briefly; returns the scripted
    episode's return and the training history (one dict per iteration)."""
    torch.manual_seed(seed)
    total, text = scripted_episode(seed)
    print(f"a scripted episode (return {total:g}); [...] is what the tool said")
    print(f"(the character tokenizer shows a newline as <unk>):\n{text}\n")

    env = gym.make_vec(TASK, num_envs=num_envs, group_size=group_size, **TASK_OPTIONS)
    policy = CausalLMPolicy(make_tiny_model(len(env.tokenizer), seed=seed), env.tokenizer)
    agent = GRPO(policy, env, seed=seed)
    history = agent.learn(iterations=iterations)
    for row in history[:: max(1, iterations // 5)]:
        print(f"iteration {int(row['iteration']):3d}  mean reward {row['reward_mean']:.3f}")

    batch = collect(env, policy, seed=seed)
    # Show the episode in which the environment spoke most.
    row = int((batch.completion_mask & ~batch.policy_mask).sum(1).argmax())
    sample = show(
        env.tokenizer, batch.completion_ids[row], batch.completion_mask[row], batch.policy_mask[row]
    )
    print(f"\na sampled episode of the trained policy:\n  {sample!r}")
    return total, history


if __name__ == "__main__":
    # Tiny models are overhead-bound: one thread is several times faster than two.
    torch.set_num_threads(1)
    main()
