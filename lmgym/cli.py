"""The ``lmgym`` command: ``train`` an agent on a task, ``tasks`` to list them.

``lmgym train`` with no arguments runs GRPO on ``lmgym/TargetString-v0`` with a
tiny GPT-2 built locally (saved and reloaded through ``save_pretrained`` /
``from_pretrained``), shows progress, and prints the reward before and after plus
a few sampled completions. Every field of the chosen algorithm's config is a flag
(``lmgym train --algo ppo --help`` lists them with their help text).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
import types
import typing
from collections.abc import Sequence
from typing import Any

import torch

DEFAULT_TASK = "lmgym/TargetString-v0"


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _flag_type(annotation: Any) -> tuple[Any, dict[str, Any]]:
    """argparse ``type`` and extra kwargs for a config field annotation."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = origin in (typing.Union, types.UnionType) and len(args) < len(
        typing.get_args(annotation)
    )
    if optional and len(args) == 1:
        inner, extra = _flag_type(args[0])

        def maybe(text: str) -> Any:
            return None if text.lower() == "none" else inner(text)

        maybe.__name__ = getattr(inner, "__name__", "value")
        return maybe, extra
    if origin is typing.Literal:
        return str, {"choices": list(typing.get_args(annotation))}
    if origin is tuple:
        return float, {"nargs": len(typing.get_args(annotation))}
    if annotation is bool:
        return _parse_bool, {"metavar": "{true,false}"}
    return annotation, {}


def add_config_flags(parser: argparse.ArgumentParser, config_class: type) -> None:
    """One ``--field-name`` flag per config field, typed, with its default and help."""
    from lmgym.agents.config import field_help

    helps = field_help(config_class)
    hints = typing.get_type_hints(config_class)
    group = parser.add_argument_group(f"{config_class.__name__} fields")
    for field in dataclasses.fields(config_class):
        kind, extra = _flag_type(hints[field.name])
        group.add_argument(
            f"--{field.name.replace('_', '-')}",
            dest=f"config.{field.name}",
            type=kind,
            default=field.default,
            help=f"{helps.get(field.name, '')} (default: {field.default})",
            **extra,
        )


def _train_parser(algo: str) -> argparse.ArgumentParser:
    from lmgym.agents import ALGORITHMS

    parser = argparse.ArgumentParser(
        prog="lmgym train", description="Train an agent on an lmgym task."
    )
    parser.add_argument("--algo", default=algo, choices=sorted(ALGORITHMS), help="algorithm")
    parser.add_argument("--task", default=DEFAULT_TASK, help="registered task id")
    parser.add_argument(
        "--model",
        default=None,
        help="hub name or local directory of a causal LM (default: a tiny GPT-2 built locally)",
    )
    parser.add_argument("--iterations", type=int, default=150, help="rollout batches to train on")
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts per batch (P)")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--samples", type=int, default=4, help="completions printed at the end")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_config_flags(parser, ALGORITHMS[algo].config_class)
    return parser


def _load_policy(model: str | None, temperature: float, device: str):
    from lmgym.policy import CausalLMPolicy, save_tiny

    if model is not None:
        return CausalLMPolicy.from_pretrained(model, device=device, temperature=temperature)
    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny(f"{tmp}/tiny-gpt2")
        return CausalLMPolicy.from_pretrained(path, device=device, temperature=temperature)


def train(argv: Sequence[str]) -> int:
    import gymnasium as gym

    import lmgym  # noqa: F401  (registers the tasks)
    from lmgym.agents import ALGORITHMS

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--algo", default="grpo")
    known, _ = pre.parse_known_args(argv)
    if known.algo not in ALGORITHMS:
        print(
            f"lmgym train: unknown --algo {known.algo!r}; valid: {sorted(ALGORITHMS)}",
            file=sys.stderr,
        )
        return 2
    args = _train_parser(known.algo).parse_args(argv)
    torch.set_num_threads(args.threads)
    config_values = {
        k.split(".", 1)[1]: v for k, v in vars(args).items() if k.startswith("config.")
    }
    if "adam_betas" in config_values:
        config_values["adam_betas"] = tuple(config_values["adam_betas"])

    policy = _load_policy(args.model, args.temperature, args.device)
    if args.task not in gym.registry:
        tasks = sorted(k for k in gym.registry if k.startswith("lmgym/"))
        print(f"lmgym train: unknown --task {args.task!r}; registered: {tasks}", file=sys.stderr)
        return 2
    env = gym.make_vec(
        args.task,
        num_envs=args.num_prompts * args.group_size,
        group_size=args.group_size,
        tokenizer=policy.tokenizer,
        device=args.device,
    )
    agent_class = ALGORITHMS[args.algo]
    ref_policy = None
    if config_values.get("beta", 0.0) > 0:
        from lmgym.policy.value import frozen_copy

        ref_policy = frozen_copy(policy)
    agent = agent_class(policy, env, ref_policy, config=agent_class.config_class(**config_values))

    print(
        f"{args.algo} on {args.task}: {env.num_envs} rows ({args.num_prompts} prompts x "
        f"{args.group_size}), {args.iterations} iterations, model "
        f"{args.model or 'tiny GPT-2 (built locally)'}"
    )
    before = agent.evaluate(num_batches=2)["reward_mean"]
    start = time.perf_counter()
    history = agent.learn(args.iterations, progress_bar=not args.no_progress)
    seconds = time.perf_counter() - start
    after = agent.evaluate(num_batches=2)["reward_mean"]
    print(
        f"reward before: {before:.3f}   after: {after:.3f}   "
        f"({len(history)} iterations in {seconds:.1f} s, "
        f"{agent.tokens_generated} tokens generated)"
    )
    batch = agent._draw()
    texts = env.decode_completions(batch.completion_ids)
    for text, score in list(zip(texts, batch.scores.tolist(), strict=True))[: args.samples]:
        print(f"  reward {score:.2f}: {text!r}")
    return 0


def tasks(argv: Sequence[str]) -> int:
    from lmgym.envs import format_task_table

    print(format_task_table())
    return 0


COMMANDS = {"train": train, "tasks": tasks}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"lmgym: unknown command {argv[0]!r}", file=sys.stderr)
        print("usage: lmgym {train,tasks} [options]   (lmgym train --help for training flags)")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
