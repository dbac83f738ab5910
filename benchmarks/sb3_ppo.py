"""SB3 PPO against lmgym's PPO on one token task: env steps and wall time to solve it.

The task (both sides): ``lmgym/TargetString-v0`` with the 8-id character
vocabulary ``<pad>, <eos>, <unk>, a..e``, prompt ``"bad"``, target ``"decade"``
(6 tokens, ``max_new_tokens = 6``), ``reward_mode="per_token"`` (1/6 for each
target character in place), 16 rows. Random play scores about 0.09.

Solved: the mean return of the last 100 finished episodes reaches the task's
solved threshold (``TASKS[...].solved_threshold`` = 0.9), checked after every
vector step. Reported per run: env steps at that moment (16 per vector step) and
wall seconds since the run began (env and model construction included).

Sides, each a function ``run_<side>(seed, max_env_steps) -> RunResult`` listed in
``SIDES``; the script runs every seed on every side in one process, alternating
the order of the sides from seed to seed:

- ``sb3_ppo``: ``stable_baselines3.PPO("MlpPolicy")`` on
  ``SB3VecEnv(env, TokenIdsObservation())`` (SB3 one-hot encodes the 9 token
  positions: 72 inputs), ``n_steps=64``, ``batch_size=128``, ``n_epochs=10``,
  ``learning_rate=3e-4``, every other setting SB3's default (gamma 0.99, GAE 0.95,
  clip 0.2, two 64-unit tanh layers). The adapter's defaults: the token budget
  ends an episode without bootstrapping.
- ``sb3_ppo_bootstrap`` (``--reference``): the same, but a row cut off at the
  token budget is bootstrapped as SB3's ``DummyVecEnv`` would
  (``bootstrap_truncated=True``), to show why the adapter does not.
- ``sb3_ppo_n2048`` (``--reference``): the same as ``sb3_ppo`` with SB3's default
  ``n_steps=2048`` (and ``batch_size=64``).
- ``lmgym_ppo``: lmgym's PPO (GAE, value head on the trunk of a 2-layer, 64-wide
  GPT-2 over the same 8 ids), episode-synchronous batches of the same 16 rows,
  4 epochs x 2 minibatches, ``learning_rate=1e-3``, every other setting lmgym's
  default (gamma 1, GAE 0.95, clip 0.2, whitened advantages).

Run from the repository root::

    .venv/bin/python benchmarks/sb3_ppo.py [--seeds 0 1 2 3 4] [--reference] \
        [--out benchmarks/results/sb3_ppo.md]
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import gymnasium as gym
import harness as h
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback

from lmgym.agents import PPO as LmgymPPO
from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs import TASKS, TokenVectorEnv
from lmgym.integrations import TokenIdsObservation
from lmgym.integrations.sb3 import SB3VecEnv
from lmgym.policy import CausalLMPolicy, make_tiny_model

TASK_ID = "lmgym/TargetString-v0"
TASK_KWARGS = {"target": "decade", "prompt": "bad", "reward_mode": "per_token"}
CHARS = "abcde"  # + <pad>, <eos>, <unk>: 8 ids
NUM_ENVS = 16
WINDOW = 100
THRESHOLD = TASKS[TASK_ID].solved_threshold
NUM_THREADS = 1  # tiny models: a second thread only adds contention
LMGYM_LR = 1e-3  # lmgym PPO learning rate for the tiny GPT-2


def make_task_env(autoreset: bool = True) -> TokenVectorEnv:
    """The benchmark task's native vector env (the same for every side)."""
    tok = make_char_tokenizer(CHARS)
    return gym.make_vec(TASK_ID, NUM_ENVS, autoreset=autoreset, tokenizer=tok, **TASK_KWARGS)


# ----------------------------------------------------------------- measurement
class SolveTracker:
    """Rolling mean of episode returns; notes env steps and seconds when it is solved.

    Args:
        threshold: Solved when the mean of the last ``window`` returns reaches it.
        window: Episodes in the rolling mean; the window must be full.
    """

    def __init__(self, threshold: float = THRESHOLD, window: int = WINDOW) -> None:
        self.threshold = threshold
        self.returns: deque[float] = deque(maxlen=window)
        self.start = time.perf_counter()
        self.cpu = h.CpuMeter()
        self.env_steps: int | None = None
        self.seconds: float | None = None

    def add(self, episode_returns: Iterable[float], env_steps: int) -> bool:
        """Record finished episodes' returns after ``env_steps`` env steps; True once solved."""
        self.returns.extend(episode_returns)
        if self.env_steps is None and self.rolling_mean() >= self.threshold:
            self.env_steps, self.seconds = env_steps, time.perf_counter() - self.start
        return self.env_steps is not None

    def rolling_mean(self) -> float:
        full = len(self.returns) == self.returns.maxlen
        return float(np.mean(self.returns)) if full else float("-inf")

    def result(self, side: str, seed: int, env_steps: int) -> RunResult:
        return RunResult(
            side=side,
            seed=seed,
            solved=self.env_steps is not None,
            env_steps=self.env_steps if self.env_steps is not None else env_steps,
            seconds=self.seconds if self.seconds is not None else time.perf_counter() - self.start,
            rolling_mean=float(np.mean(self.returns)) if self.returns else float("nan"),
            other_cpu=self.cpu.other_load(),
        )


@dataclass(frozen=True)
class RunResult:
    """One run of one side."""

    side: str
    seed: int
    solved: bool  # the rolling mean reached the threshold within the budget
    env_steps: int  # when solved (else: steps run)
    seconds: float  # wall seconds when solved (else: seconds run)
    rolling_mean: float  # mean return of the last ``WINDOW`` episodes at the end
    other_cpu: float  # share of the CPUs other processes used during the run


# ----------------------------------------------------------------------- sides
class _TrackSolve(BaseCallback):
    def __init__(self, tracker: SolveTracker) -> None:
        super().__init__()
        self.tracker = tracker

    def _on_step(self) -> bool:
        infos = self.locals["infos"]
        finished = (infos[i]["episode"]["r"] for i in np.flatnonzero(self.locals["dones"]))
        return not self.tracker.add(finished, self.num_timesteps)  # False stops learn()


def run_sb3_ppo(
    seed: int,
    max_env_steps: int,
    *,
    side: str = "sb3_ppo",
    n_steps: int = 64,
    batch_size: int = 128,
    bootstrap_truncated: bool = False,
) -> RunResult:
    """SB3 PPO (``MlpPolicy`` on one-hot token ids) through ``SB3VecEnv``."""
    tracker = SolveTracker()
    env = SB3VecEnv(make_task_env(), TokenIdsObservation(), bootstrap_truncated=bootstrap_truncated)
    hyper = dict(n_steps=n_steps, batch_size=batch_size, n_epochs=10, learning_rate=3e-4)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", **hyper)
    model.learn(max_env_steps, callback=_TrackSolve(tracker))
    return tracker.result(side, seed, model.num_timesteps)


def run_lmgym_ppo(seed: int, max_env_steps: int, *, learning_rate: float = LMGYM_LR) -> RunResult:
    """lmgym's PPO (GAE, value head on a tiny GPT-2's trunk) on the same task and rows.

    One iteration = one episode-synchronous batch of ``NUM_ENVS`` completions
    (``NUM_ENVS * 6`` env steps), then PPO's update (4 epochs x 2 minibatches).
    The policy is a 2-layer, 64-wide GPT-2 built from config over the same 8 ids.
    """
    tracker = SolveTracker()
    torch.manual_seed(seed)
    tokenizer = make_char_tokenizer(CHARS)
    env = make_task_env(autoreset=False)
    policy = CausalLMPolicy(make_tiny_model(len(tokenizer), seed=seed), tokenizer)
    agent = LmgymPPO(policy, env, learning_rate=learning_rate, seed=seed)
    env_steps = 0
    while env_steps < max_env_steps:
        batch, _ = agent.collect()
        env_steps += int(batch.lengths.sum())
        if tracker.add(batch.scores.tolist(), env_steps):
            break
        agent.train_on_batch(batch)
    return tracker.result("lmgym_ppo", seed, env_steps)


#: name -> (run function, default env-step budget, shown only with --reference)
SIDES: dict[str, tuple[Callable[[int, int], RunResult], int, bool]] = {
    "sb3_ppo": (run_sb3_ppo, 200_000, False),
    "lmgym_ppo": (run_lmgym_ppo, 200_000, False),
    "sb3_ppo_bootstrap": (partial(run_sb3_ppo, side="sb3_ppo_bootstrap",
                                  bootstrap_truncated=True), 60_000, True),
    "sb3_ppo_n2048": (partial(run_sb3_ppo, side="sb3_ppo_n2048", n_steps=2048,
                              batch_size=64), 500_000, True),
}  # fmt: skip


# ---------------------------------------------------------------------- report
def noisy_above() -> float:
    """Other processes' CPU share above which fewer than ``NUM_THREADS`` cores were free."""
    cores = os.cpu_count() or 1
    return max(0.0, 1.0 - NUM_THREADS / cores)


NOTES = [
    "- Env steps are deterministic under a seed (SB3 seeds torch, numpy and the action "
    "sampler; the env has one prompt); rerunning gives the same steps. Seconds depend on "
    "the machine and its load.",
    "- 'other CPU load' is the share of all cores used by other processes during the run. "
    "Each run uses {threads} torch thread(s), so up to {free:.0%} still leaves it a core "
    "of its own; runs above that are flagged (noisy) and their seconds are inflated.",
    "- sb3_ppo_bootstrap never solves the task: lmgym reports the token budget as "
    "`truncated`, and SB3 (as its `DummyVecEnv` does for every truncation) then adds "
    "`gamma * V(terminal_observation)` to the last reward. The terminal observation (a "
    "full buffer) never occurs as a training state, so that value is an untrained "
    "extrapolation that depends on the last token written, and it outweighs the 1/6 "
    "reward of that token. `SB3VecEnv` therefore does not bootstrap the token budget by "
    "default (`bootstrap_truncated=False`).",
    "- lmgym_ppo needs about 6x fewer env steps than sb3_ppo: its policy is a transformer reading the whole prefix (SB3's MLP sees one-hot ids), it updates on every 16-row batch (96 env steps) rather than every 1,024 steps, and it uses gamma = 1 with whitened GAE advantages, so each token gets the credit of its own per-token reward undiscounted. It does not bootstrap the token budget either (done = 1 at every row's last token).",
    "- sb3_ppo_n2048 is SB3's default rollout length (2048 steps per env, 32,768 per "
    "update): about 20x the env steps of n_steps=64 on this task.",
]


def _summary(results: list[RunResult], side: str) -> str:
    runs = [r for r in results if r.side == side]
    solved = [r for r in runs if r.solved]
    if not solved:
        best = max(r.rolling_mean for r in runs)
        return f"{side} | 0/{len(runs)} | - | - | best final rolling mean {best:.3f}"
    steps = [r.env_steps for r in solved]
    secs = [r.seconds for r in solved]
    return (
        f"{side} | {len(solved)}/{len(runs)} | {statistics.median(steps):,.0f} "
        f"({min(steps):,}-{max(steps):,}) | {statistics.median(secs):.1f} "
        f"({min(secs):.1f}-{max(secs):.1f}) | "
    )


def markdown(results: list[RunResult], sides: list[str], command: str, budgets: dict) -> list[str]:
    per_run = [
        f"{r.side} | {r.seed} | {'yes' if r.solved else 'no'} | {r.env_steps:,} | {r.seconds:.1f} "
        f"| {r.rolling_mean:.3f} | {r.other_cpu:.0%}{' (noisy)' if r.other_cpu > noisy_above() else ''}"
        for r in results
    ]
    modules = ["torch", "stable_baselines3", "gymnasium", "lmgym"]
    lines = h.header("SB3 PPO vs lmgym PPO: steps and time to solve a token task",
                     f"torch threads = {NUM_THREADS}", modules, command)  # fmt: skip
    lines += [
        f"- task: `{TASK_ID}` {TASK_KWARGS}, vocabulary {CHARS!r} + 3 specials = 8 ids, "
        f"{NUM_ENVS} envs; solved = mean return of the last {WINDOW} episodes >= {THRESHOLD}",
        "- env-step budgets: " + ", ".join(f"{s} {budgets[s]:,}" for s in sides),
        "- seconds: wall time from the start of the run (env and model construction included) "
        "to the step the threshold was reached",
        "",
        "## Summary (median, min-max over solved seeds)",
        "",
        *h.table(
            "side | solved | env steps | seconds | note", [_summary(results, s) for s in sides]
        ),
        "",
        "## Runs",
        "",
        *h.table(
            "side | seed | solved | env steps | seconds | final rolling mean | other CPU load",
            per_run,
            left=3,
        ),  # fmt: skip
        "",
        "## Notes",
        "",
        *[n.format(threads=NUM_THREADS, free=noisy_above()) for n in NOTES],
        *([] if "lmgym_ppo" in sides else ["- lmgym's PPO side is not in this run."]),
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = h.parser(__doc__, "one seed, 20k env steps per side")
    parser.add_argument("--seeds", type=int, nargs="+", help="default 0 1 2 3 4 (--quick: 0)")
    parser.add_argument(
        "--sides", nargs="+", choices=sorted(SIDES), help="default: all but --reference"
    )
    parser.add_argument("--reference", action="store_true", help="also the reference SB3 variants")
    parser.add_argument("--max-steps", type=int, help="env-step budget for every side")
    args = parser.parse_args(argv)
    h.fill_defaults(args, dict(seeds=[0, 1, 2, 3, 4]), dict(seeds=[0], max_steps=20_000))
    torch.set_num_threads(NUM_THREADS)

    sides = args.sides or [s for s, (_, _, ref) in SIDES.items() if args.reference or not ref]
    budgets = {s: args.max_steps or SIDES[s][1] for s in sides}
    results: list[RunResult] = []
    for k, seed in enumerate(args.seeds):
        order = sides if k % 2 == 0 else sides[::-1]  # alternate which side goes first
        for side in order:
            results.append(SIDES[side][0](seed, budgets[side]))
            print(f"{side:>18} seed {seed}: {results[-1]}", flush=True)
    results.sort(key=lambda r: (sides.index(r.side), r.seed))
    command = h.command_line("sb3_ppo.py", argv)
    h.finish(markdown(results, sides, command, budgets), args.out)


if __name__ == "__main__":
    main()
