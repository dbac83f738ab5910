"""``lmgym bench``: train agents x tasks x seeds with equal budgets (``lmgym.bench.run``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from lmgym.cli.common import add_rollout_engine_flags, error, quiet_transformers
from lmgym.cli.flags import FlagType, add_typed_flag


def _csv_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _bench_parser() -> argparse.ArgumentParser:
    from lmgym.bench.run import DEFAULT_AGENTS, DEFAULT_OUT, DEFAULT_SEEDS, DEFAULT_TASKS
    from lmgym.bench.spec import (
        DEFAULT_EVAL_PROMPTS,
        DEFAULT_EVAL_SAMPLES,
        DEFAULT_GROUP_SIZE,
        DEFAULT_NUM_PROMPTS,
    )
    from lmgym.training.pretrained import PRETRAINED_DEFAULTS
    from lmgym.training.run import LORA_ALPHA, LORA_TARGETS

    parser = argparse.ArgumentParser(
        prog="lmgym bench",
        description="Train agents x tasks x seeds with equal budgets; write a Markdown table "
        "and PNG learning curves.",
    )
    parser.add_argument(
        "--agents",
        type=_csv_list,
        default=None,
        help=f"comma list, or all (default: {','.join(DEFAULT_AGENTS)})",
    )
    parser.add_argument(
        "--tasks",
        type=_csv_list,
        default=None,
        help="comma list of task ids, your own as module:TaskId-v0 "
        f"(default: {','.join(DEFAULT_TASKS)})",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="local directory or hub name of your causal LM, loaded afresh for every run, "
        "trained with the pretrained defaults and evaluated on held-out prompts before and "
        "after (default: a tiny GPT-2 initialised with the run's seed)",
    )
    add_typed_flag(
        parser,
        "--lora-r",
        kind=int,
        default=0,
        help=f"with --model: train a fresh LoRA adapter of this rank (alpha {LORA_ALPHA:g}, on "
        f"{' '.join(LORA_TARGETS)}, as lmgym train); 0 trains every weight (default: 0)",
    )
    add_typed_flag(
        parser,
        "--learning-rate",
        kind=float,
        default=None,
        help="every agent's learning rate (default: each agent's own for the tiny GPT-2; with "
        f"--model the pretrained defaults': {PRETRAINED_DEFAULTS.learning_rate_lora:g} with "
        f"--lora-r, {PRETRAINED_DEFAULTS.learning_rate_full:g} without)",
    )
    parser.add_argument(
        "--seeds",
        type=lambda t: [FlagType("seeds", int)(s) for s in _csv_list(t)],
        default=None,
        help=f"comma list (default: {','.join(map(str, DEFAULT_SEEDS))})",
    )
    add_typed_flag(
        parser,
        "--iterations",
        kind=int,
        default=None,
        help="iterations for every task (default: per task; none with --max-time alone)",
    )
    parser.add_argument(
        "--max-time",
        default=None,
        help="wall time of every run's training: seconds (600) or with a unit (90s, 8m, 1h); "
        "each run stops before an iteration that would end past it (default: none)",
    )
    parser.add_argument(
        "--prompts",
        default=None,
        help="a task of your own: JSON Lines prompt file, with --reward module:function (as "
        "lmgym train), benchmarked as the task prompts/<file stem>-v0 (alone, or beside the "
        "--tasks you name), a tenth of its rows held out for evaluation",
    )
    parser.add_argument("--reward", default=None, help="the reward of --prompts, module:function")
    parser.add_argument(
        "--prompt-field", default="prompt", help="field of --prompts holding the prompt"
    )
    parser.add_argument(
        "--eval",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="evaluate the base model and every trained model on the held-out prompts, "
        "greedy and sampled (default: with --model)",
    )
    add_typed_flag(
        parser,
        "--eval-prompts",
        kind=int,
        default=DEFAULT_EVAL_PROMPTS,
        help=f"prompts per held-out evaluation (default: {DEFAULT_EVAL_PROMPTS})",
    )
    add_typed_flag(
        parser,
        "--eval-samples",
        kind=int,
        default=DEFAULT_EVAL_SAMPLES,
        help="sampled completions per held-out prompt, the k of pass@k (default: "
        f"{DEFAULT_EVAL_SAMPLES})",
    )
    add_typed_flag(
        parser,
        "--num-prompts",
        kind=int,
        default=DEFAULT_NUM_PROMPTS,
        help=f"prompts per batch (default: {DEFAULT_NUM_PROMPTS}, as lmgym train)",
    )
    add_typed_flag(
        parser,
        "--group-size",
        kind=int,
        default=None,
        help=f"completions per prompt (default: {DEFAULT_GROUP_SIZE}, as lmgym train; with "
        f"--model {PRETRAINED_DEFAULTS.group_size}, the pretrained default)",
    )
    add_typed_flag(
        parser,
        "--workers",
        kind=int,
        default=None,
        help="runs at once, each in its own process with one torch thread; 0 runs them in "
        "this process (default: 1; 0 with --quick)",
    )
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace results already in --out (without it, a rerun of the same command "
        "continues an unfinished bench there)",
    )
    add_rollout_engine_flags(parser)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: TargetString, grpo and rloo, one seed, 6 iterations, in this process",
    )
    return parser


def bench(argv: Sequence[str]) -> int:
    """``lmgym bench``: the agent benchmark."""
    from lmgym.agents import ALGORITHMS
    from lmgym.bench.run import BenchOutputExistsError, BenchSpec, run_bench
    from lmgym.training.pretrained import PRETRAINED_DEFAULTS

    args = _bench_parser().parse_args(list(argv))
    quiet_transformers()
    agents = sorted(ALGORITHMS) if args.agents == ["all"] else args.agents
    group_size = args.group_size
    if group_size is None and args.model is not None:
        group_size = PRETRAINED_DEFAULTS.group_size
    try:
        tasks = args.tasks
        prompts = args.prompts
        if prompts is not None or args.reward is not None:
            from lmgym.bench.spec import register_user_task

            if prompts is not None:
                prompts = str(Path(prompts).expanduser().resolve())
            task = register_user_task(prompts, args.reward, args.prompt_field)
            tasks = [*(tasks or []), task]
        spec = BenchSpec.quick() if args.quick else BenchSpec()
        spec = spec.replace(
            agents=agents,
            model=args.model,
            lora_r=args.lora_r,
            learning_rate=args.learning_rate,
            tasks=tasks,
            seeds=args.seeds,
            iterations=args.iterations,
            max_time=args.max_time,
            num_prompts=args.num_prompts,
            group_size=group_size,
            workers=args.workers,
            rollout_engine=args.rollout_engine,
            vllm_kv_cache_gib=args.vllm_kv_cache_gib,
            prompts=prompts,
            reward=args.reward,
            prompt_field=args.prompt_field,
            evaluate=args.model is not None if args.eval is None else args.eval,
            eval_prompts=args.eval_prompts,
            eval_samples=args.eval_samples,
        )
        summary = run_bench(spec, args.out, overwrite=args.overwrite)
    except (BenchOutputExistsError, FileNotFoundError, ValueError) as exc:
        return error("bench", str(exc))
    print(summary)
    return 0
