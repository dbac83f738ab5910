"""Train Stable-Baselines3 PPO on an lmgym task, through the native vector env.

The task: write the target string "decade" after the prompt "bad", one character
per step, with an 8-token vocabulary (``<pad>``, ``<eos>``, ``<unk>``, a..e) and a
reward of 1/6 for every character in place. The adapter's actions are the env's 6
legal token ids (a..e and ``<eos>``; the env refuses ``<pad>``/``<unk>`` and SB3
cannot mask a ``Discrete`` space), so a random policy scores about 0.11 per
episode; the task counts as solved at a rolling mean of 0.9 over 100 episodes.

Three lines do the integration:

1. ``gymnasium.make_vec("lmgym/TargetString-v0", ...)`` builds lmgym's native,
   batched torch env (one object for all 16 rows, no Python loop over envs).
2. ``SB3VecEnv(env, TokenIdsObservation())`` exposes it as an SB3 ``VecEnv``
   with same-step autoreset and the token ids as a ``MultiDiscrete`` observation,
   which SB3's ``MlpPolicy`` one-hot encodes (9 positions x 8 ids).
3. ``PPO("MlpPolicy", vec_env, ...).learn(...)`` is plain SB3.

Run from the repository root (about 13k env steps, a few seconds on a CPU)::

    .venv/bin/python examples/sb3_ppo.py [--seed 0]
"""

from __future__ import annotations

import argparse
import time
from collections import deque

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback

import lmgym  # noqa: F401  (registers the lmgym/... tasks)
from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs import TASKS
from lmgym.integrations import TokenIdsObservation
from lmgym.integrations.sb3 import SB3VecEnv

ENV_ID = "lmgym/TargetString-v0"
TARGET, PROMPT = "decade", "bad"


class StopWhenSolved(BaseCallback):
    """Stop training once the mean return of the last ``window`` episodes reaches ``threshold``."""

    def __init__(self, threshold: float, window: int = 100) -> None:
        super().__init__()
        self.threshold = threshold
        self.returns: deque[float] = deque(maxlen=window)
        self.solved_at: int | None = None

    def _on_step(self) -> bool:
        # The adapter fills infos[i]["episode"] on the step row i finishes.
        infos = self.locals["infos"]
        self.returns.extend(infos[i]["episode"]["r"] for i in np.flatnonzero(self.locals["dones"]))
        full = len(self.returns) == self.returns.maxlen
        if full and np.mean(self.returns) >= self.threshold:
            self.solved_at = self.num_timesteps
            return False  # stop learn()
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=200_000, help="env steps budget")
    args = parser.parse_args()
    torch.set_num_threads(1)  # a tiny MLP gains nothing from more threads

    tokenizer = make_char_tokenizer("abcde")  # 8 ids
    native = gym.make_vec(
        ENV_ID,
        num_envs=16,
        target=TARGET,
        prompt=PROMPT,
        reward_mode="per_token",
        tokenizer=tokenizer,
    )
    vec_env = SB3VecEnv(native, TokenIdsObservation())
    model = PPO(
        "MlpPolicy",
        vec_env,
        n_steps=64,
        batch_size=128,
        n_epochs=10,
        learning_rate=3e-4,
        seed=args.seed,
        device="cpu",
    )

    threshold = TASKS[ENV_ID].solved_threshold
    stopper = StopWhenSolved(threshold)
    start = time.perf_counter()
    model.learn(args.max_steps, callback=stopper)
    seconds = time.perf_counter() - start
    if stopper.solved_at is None:
        print(f"not solved within {args.max_steps} env steps ({seconds:.1f} s)")
    else:
        print(
            f"solved: rolling mean return {np.mean(stopper.returns):.3f} >= {threshold} "
            f"after {stopper.solved_at} env steps, {seconds:.1f} s"
        )

    # Greedy decoding with the trained policy, one episode on one row.
    obs = vec_env.reset()
    for _ in range(native.max_new_tokens):
        actions, _ = model.predict(obs, deterministic=True)
        obs, _, dones, infos = vec_env.step(actions)
        if dones[0]:
            break
    final = infos[0]["terminal_observation"]
    completion = native.decode_completions(torch.as_tensor(final[None, native.prompt_width :]))
    print(f"greedy completion after {PROMPT!r}: {completion[0]!r} (target {TARGET!r})")


if __name__ == "__main__":
    main()
