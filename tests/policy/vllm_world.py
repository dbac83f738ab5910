"""Worker launched by torchrun: vLLM as the rollout engine of a 2-process data-parallel run.

Each rank serves its policy from its own vLLM engine (its model worker a child process:
an in-process one would adopt the run's process group), collects its own groups, takes one
data-parallel GRPO update and collects again. It writes to ``OUT/rank{r}.pt``: where
the engine ran, a collective's result after vLLM started, the engine's weights
version, the largest |vLLM sampler - teacher-forced| log-prob before and after the
update, the same against the weights before the update (the update must have moved
them), a fingerprint of the updated weights (equal on both ranks), the error an
in-process engine is refused with, and then what the asynchronous actor-learner does
in the same world with vLLM as its actor (``asynchronous``).

Usage: ``vllm_world.py OUT MODEL_DIR`` (any chat model vLLM serves on this device).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from lmgym.agents import GRPO
from lmgym.asynchronous import AsyncConfig, Role, run_async
from lmgym.distributed import init_from_env, shutdown
from lmgym.envs import FunctionReward, TokenVectorEnv
from lmgym.policy import CausalLMPolicy
from lmgym.policy.engines import set_rollout_engine
from lmgym.policy.vllm_engine import VLLMEngine
from lmgym.rollout import collect

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_cases import gap, teacher_forced  # noqa: E402

QUESTIONS = ["Say hi.", "Name a color.", "2+2=", "Count to three."]


def length_reward(prompts: list, completions: list[str]) -> list[float]:
    return [float(len(c)) for c in completions]


def asynchronous(base: CausalLMPolicy, engine: VLLMEngine) -> dict:
    """Two synchronous-bound updates (``max_staleness=0``) of the async actor-learner in
    this world: rank 0 learns, rank 1 acts with vLLM (the running engine, serving the
    actor's own policy). Every token is sampled by the weights of the update that
    trains it, so the learner's ``sampler_logprob_gap_max`` is vLLM's kernels alone:
    it stays within the tolerance only if vLLM served each new version."""

    def make_agent(role: Role) -> GRPO:
        policy = copy.deepcopy(base)
        if not role.is_learner:
            set_rollout_engine(policy, "vllm", engine=engine)
        chats = [[{"role": "user", "content": q}] for q in QUESTIONS[:2]]
        env = TokenVectorEnv(
            policy.tokenizer, chats, FunctionReward(length_reward), num_prompts=2,
            group_size=4, stop_token_ids=policy.stop_token_ids, max_new_tokens=12,
            autoreset=False,
        )  # fmt: skip
        return GRPO(
            policy, env, learning_rate=1e-4, update_epochs=1, num_minibatches=1, seed=0,
            process_group=role.process_group,
        )  # fmt: skip

    run = run_async(make_agent, 2, AsyncConfig(actors=1, learners=1, max_staleness=0))
    got: dict = {"actor": not run.role.is_learner, "updates": len(run.history)}
    if not run.role.is_learner:
        got["engine_version"] = engine.version
        got["engine_serves_actor"] = engine.policy is run.agent.policy
    else:
        got["gap_max"] = [m["sampler_logprob_gap_max"] for m in run.history]
    return got


def main(out: Path, model: Path) -> None:
    torch.set_num_threads(1)
    init_from_env(timeout_s=300)
    rank = dist.get_rank()
    results: dict = {}
    base = CausalLMPolicy.from_pretrained(model)
    refused = copy.deepcopy(base)
    set_rollout_engine(refused, "vllm", kv_cache_gib=0.5, child_process=False)
    try:
        refused.engine.start()
    except ValueError as error:
        results["refused"] = str(error)
    policy = copy.deepcopy(base)
    set_rollout_engine(policy, "vllm", kv_cache_gib=0.5, max_model_len=512)
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS[2 * rank : 2 * rank + 2]]
    env = TokenVectorEnv(
        policy.tokenizer, chats, FunctionReward(length_reward), num_prompts=2, group_size=4,
        stop_token_ids=policy.stop_token_ids, max_new_tokens=12,
    )  # fmt: skip
    first = collect(env, policy, seed=rank, generator=torch.Generator().manual_seed(rank))
    results["out_of_process"] = policy.engine.out_of_process
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    results["all_reduce"] = total.item()
    results["gap_before"] = gap(policy, first)
    agent = GRPO(policy, env, learning_rate=1e-4, update_epochs=1, num_minibatches=1, seed=0)
    agent.train_on_batch(first)
    results["wrapped"] = type(agent.parallel.ddp).__name__
    after = collect(env, policy, seed=7, generator=torch.Generator().manual_seed(7 + rank))
    results["version"] = policy.engine.version
    results["gap_after"] = gap(policy, after)
    stale = (teacher_forced(base, after) - teacher_forced(policy, after)).abs()
    results["moved"] = stale[after.policy_mask].max().item()
    results["fingerprint"] = sum(p.double().sum().item() for p in policy.parameters())
    engine = policy.engine
    results["async"] = asynchronous(base, engine)
    engine.close()
    torch.save(results, out / f"rank{rank}.pt")
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
