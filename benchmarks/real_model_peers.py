"""lmgym against its peers on a real pretrained model (SmolLM2-135M-Instruct, CPU).

Two comparisons, each with both sides in one process, alternated:

1. **Rollout**: completion tokens/s of ``lmgym.rollout.collect`` against transformers'
   ``model.generate(do_sample=True)`` (``workloads.RolloutVsGenerate``), batch 32 and
   64, each as distinct prompts and as prompts sampled 8 times (the RL workload: one
   shared prefill per group in lmgym, ``num_return_sequences=8`` in ``generate``),
   exactly 64 new tokens per row on both sides (the model's stop ids get a ``-1e9``
   output bias, so no row stops early; asserted), chat prompts of equal length
   (``chat_prompts``: "What is 47 + 38? ..." through the chat template, the system
   prompt included, 37 tokens), temperature 1, float32. Target (issue 25): >= 1.3x.
2. **GRPO iteration with LoRA**: TRL's ``GRPOTrainer`` against lmgym's ``GRPO``, the same
   prompts (the chat arithmetic task's train split), completions per prompt, token
   budget, reward function, LoRA config (r=16, alpha=32, q/k/v/o), learning rate, one
   optimizer step per iteration, beta = 0: seconds per iteration (ratio, target >= 1.5x),
   and the held-out reward of both after the same number of iterations (they must agree
   within seed noise). Needs the ``bench`` extra (TRL).

    .venv/bin/python benchmarks/real_model_peers.py rollout --out benchmarks/results/real_model_rollout.md
    .venv/bin/python benchmarks/real_model_peers.py grpo --out benchmarks/results/real_model_trl.md
    .venv/bin/python benchmarks/real_model_peers.py rollout --compile-decode --groups 1 --out benchmarks/results/real_model_rollout_compiled.md
    .venv/bin/python benchmarks/real_model_peers.py rollout --quick
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from typing import Any

import harness as h
import torch
import workloads as w

from lmgym.training.run import LORA_ALPHA, LORA_TARGETS

MODEL = "smollm2-135m-instruct"
BATCHES, NEW_TOKENS = (32, 64), 64
GROUPS = (1, 8)  # completions per prompt: distinct prompts, and GRPO's groups
TARGET_ROLLOUT = 1.3
TARGET_GRPO = 1.5
TASK = "lmgym/ChatArithmetic-v0"
PROMPTS, GROUP, MAX_NEW = 4, 8, 12
ANSWER_RULE = "last_number"  # the task's answer= option, given to both sides
# lmgym train's LoRA default (one place: lmgym.training.run), at rank 16.
LORA = {"r": 16, "lora_alpha": LORA_ALPHA, "target_modules": list(LORA_TARGETS)}
LEARNING_RATE = 1e-4
EVAL_PROMPTS, EVAL_SAMPLES, EVAL_SEED = 64, 4, 1234
QUESTION = "What is {a} + {b}? Reply with the number only."


def chat_prompts(tok: object, n: int, seed: int = 0) -> tuple[list[str], int]:
    """``n`` chat-rendered two-digit additions and their (equal) token length."""
    rng = random.Random(seed)
    texts = [
        tok.apply_chat_template(  # type: ignore[attr-defined]
            [
                {
                    "role": "user",
                    "content": QUESTION.format(a=rng.randint(10, 99), b=rng.randint(10, 99)),
                }
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        for _ in range(n)
    ]
    lengths = {len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts}  # type: ignore[operator]
    assert len(lengths) == 1, f"chat prompts of unequal token lengths {sorted(lengths)}"
    return texts, lengths.pop()


def load_model() -> tuple[torch.nn.Module, object]:
    """The packaged model (float32, eval) with every stop id unsampleable, and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmgym.policy.packaged import packaged_model_dir

    path = packaged_model_dir(MODEL)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    stop = model.generation_config.eos_token_id
    w.forbid_token(model, *(stop if isinstance(stop, list) else [stop]))
    return model, tok


def rollout(args: object) -> list[str]:
    model, tok = load_model()
    rows, targets = [], []
    batches, new_tokens = ((8,), 8) if args.quick else (args.batches, NEW_TOKENS)  # type: ignore[attr-defined]
    compiles = []
    for batch in batches:
        for group in args.groups:  # type: ignore[attr-defined]
            prompts, length = chat_prompts(tok, batch // group)
            sides = w.RolloutVsGenerate(
                model, tok, batch, length, new_tokens, prompts=prompts, group_size=group,
                compile_decode=args.compile_decode,  # type: ignore[attr-defined]
            )  # fmt: skip
            if args.compile_decode:  # type: ignore[attr-defined]
                # The first call compiles (minutes for 30 layers on a CPU): not timed.
                seconds = sides.lmgym()
                compiles.append(f"batch {batch}, {batch // group} x {group}: {seconds:.0f} s")
            meter = h.CpuMeter()
            lm, gen = h.alternate(sides.lmgym, sides.generate, args.warmup, args.repeats)  # type: ignore[attr-defined]
            load = meter.other_load()
            tokens = batch * new_tokens
            ratio = statistics.median(gen) / statistics.median(lm)
            rows.append(
                f"{batch} | {batch // group} x {group} | {length} | {new_tokens} | "
                f"{h.spread(lm)} | {h.spread(gen)} | {tokens / statistics.median(lm):,.0f} "
                f"| {tokens / statistics.median(gen):,.0f} | {ratio:.2f}x | {h.load_cell(load)}"
            )
            targets.append(
                h.target_line(
                    f"batch {batch}, {batch // group} prompts x {group}",
                    ratio,
                    TARGET_ROLLOUT,
                    "collect vs generate",
                )
            )
            print(rows[-1], flush=True)
    return [
        f"- work: {MODEL} (float32, stop ids forbidden), chat prompts through the chat "
        f"template, exactly {new_tokens} new tokens per row on both sides, temperature 1, "
        "no top-k/top-p. Prompts x completions: `N x 1` is N distinct prompts; `P x 8` "
        "is the RL workload, P prompts sampled 8 times each (GRPO's groups): lmgym's env "
        "groups share one prefill per prompt, `generate` gets the P prompts with "
        "`num_return_sequences=8` (it expands them before its prefill)",
        *(
            [f"- compile: the first lmgym call of each row, untimed ({'; '.join(compiles)})"]
            if compiles
            else []
        ),
        f"- method: alternated (ABBA), {args.warmup} warm-up calls per side, then "  # type: ignore[attr-defined]
        f"{args.repeats} timed calls per side; seconds median [IQR] (min-max); ratio = "  # type: ignore[attr-defined]
        "generate median / collect median (> 1: lmgym faster)",
        "",
        *h.table(
            "batch | prompts x completions | prompt tokens | new tokens | collect s | generate s | collect tok/s "
            "| generate tok/s | ratio | other CPU load",
            rows,
        ),
        "",
        f"## Target (issue 25: >= {TARGET_ROLLOUT}x)",
        "",
        *targets,
    ]


def arithmetic_items(split: str) -> list[tuple[Any, str]]:
    """The chat arithmetic task's ``(messages, answer)`` pairs of ``split`` (defaults)."""
    from lmgym.envs.tasks._common import select_split
    from lmgym.envs.tasks.chat_arithmetic import chat_arithmetic_items

    return select_split(chat_arithmetic_items(), split, 0.25, 0)


def trl_reward(
    prompts: list[Any], completions: list[Any], answer: list[str], **_: Any
) -> list[float]:
    """The task's own reward on TRL's conversational completions (one assistant message)."""
    from lmgym.envs.tasks.chat_arithmetic import REWARDS

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return REWARDS[ANSWER_RULE](prompts, texts, answer)


def lmgym_agent(seed: int) -> Any:
    """lmgym's GRPO with LoRA on the task's train split."""
    import gymnasium as gym
    from peft import LoraConfig

    from lmgym.agents import GRPO
    from lmgym.policy import CausalLMPolicy

    torch.manual_seed(seed)
    policy = CausalLMPolicy.from_pretrained(MODEL, peft_config=LoraConfig(**LORA))
    env = gym.make_vec(TASK, num_envs=PROMPTS * GROUP, group_size=GROUP,
                       tokenizer=policy.tokenizer, stop_token_ids=policy.stop_token_ids,
                       max_new_tokens=MAX_NEW, answer=ANSWER_RULE)  # fmt: skip
    return GRPO(policy, env.unwrapped, learning_rate=LEARNING_RATE, beta=0.0, seed=seed,
                lr_scheduler_type="constant", weight_decay=0.0, **h.ONE_STEP)  # fmt: skip


def trl_trainer(steps: int, out_dir: str, callbacks: list[Any], seed: int) -> Any:
    """TRL's GRPOTrainer over the same model, prompts, reward, LoRA and update settings."""
    import datasets
    import trl
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from lmgym.policy.packaged import packaged_model_dir

    path = packaged_model_dir(MODEL)
    items = arithmetic_items("train")
    rng = random.Random(seed)
    rows = [rng.choice(items) for _ in range(PROMPTS * (steps + 1))]
    datasets.disable_progress_bars()
    config = trl.GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=PROMPTS * GROUP,
        gradient_accumulation_steps=1, steps_per_generation=1, num_generations=GROUP,
        num_iterations=1, max_completion_length=MAX_NEW, temperature=1.0, top_k=0, top_p=1.0,
        beta=0.0, learning_rate=LEARNING_RATE, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
        loss_type="grpo", scale_rewards="group", epsilon=0.2,
        mask_truncated_completions=False, max_steps=steps, use_cpu=True, bf16=False,
        fp16=False, gradient_checkpointing=False, report_to="none", logging_strategy="no",
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        shuffle_dataset=False, seed=seed,
    )  # fmt: skip
    trainer = trl.GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        reward_funcs=[trl_reward],
        args=config,
        train_dataset=datasets.Dataset.from_dict(
            {"prompt": [m for m, _ in rows], "answer": [a for _, a in rows]}
        ),
        processing_class=AutoTokenizer.from_pretrained(path),
        peft_config=LoraConfig(**LORA),
        callbacks=callbacks,
    )
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    return trainer


def held_out(policy: Any, prompts: int = EVAL_PROMPTS) -> dict[str, float]:
    """Held-out reward of ``policy``: greedy and sampled at temperature 1 (fixed seed)."""
    from lmgym.training.evaluation import evaluate_policy, make_eval_env

    out = {}
    for label, temp, samples in (("greedy", 0.0, 1), ("sampled", 1.0, EVAL_SAMPLES)):
        env, _ = make_eval_env(TASK, policy.tokenizer, prompts, samples,
                               env_kwargs={"stop_token_ids": policy.stop_token_ids,
                                           "max_new_tokens": MAX_NEW,
                                           "answer": ANSWER_RULE})  # fmt: skip
        saved, policy.temperature = policy.temperature, temp
        try:
            out[label] = evaluate_policy(policy, env, prompts, seed=EVAL_SEED).reward_mean
        finally:
            policy.temperature = saved
    return out


def alternated(args: Any) -> dict[str, Any]:
    """TRL's trainer, and after each of its steps one lmgym ``agent.step()``; then both
    policies evaluated on the held-out split."""
    from transformers import TrainerCallback

    from lmgym.policy import CausalLMPolicy

    agent = lmgym_agent(args.seed)
    lm_s: list[float] = []
    trl_s: list[float] = []
    lm_reward: list[float] = []
    state: dict[str, Any] = {}

    class Alternate(TrainerCallback):
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            state["mark"] = time.perf_counter()

        def on_step_end(self, _: Any, st: Any, *__: Any, **___: Any) -> None:
            trl_s.append(time.perf_counter() - state["mark"])
            start = time.perf_counter()
            metrics = agent.step()
            lm_s.append(time.perf_counter() - start)
            lm_reward.append(metrics["reward_mean"])
            if st.global_step % 10 == 0:
                print(f"step {st.global_step}: lmgym {lm_s[-1]:.1f} s, TRL {trl_s[-1]:.1f} s",
                      flush=True)  # fmt: skip
            state["mark"] = time.perf_counter()

    evals = 8 if args.quick else EVAL_PROMPTS
    base = held_out(agent.policy, evals)
    print(f"base model held-out: {base}", flush=True)
    meter = h.CpuMeter()
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = trl_trainer(args.iters, out_dir, [Alternate()], args.seed)
        trainer.train()
        logged = trainer._metrics["train"]
        trl_rewards = logged.get("reward") or next(
            (v for k, v in logged.items() if k.startswith("rewards/") and k.endswith("/mean")), []
        )
        trl_policy = CausalLMPolicy(trainer.model.eval(), trainer.processing_class)
    load = meter.other_load()
    return {
        "lm": lm_s[args.warmup :], "trl": trl_s[args.warmup :], "other_load": load,
        "base": base, "lm_after": held_out(agent.policy, evals),
        "trl_after": held_out(trl_policy, evals),
        "lm_train_reward": lm_reward, "trl_train_reward": list(trl_rewards),
    }  # fmt: skip


def peak_rss_mib(side: str, iters: int, seed: int) -> float:
    """Peak RSS (MiB) of a fresh process that runs ``iters`` iterations of one side."""
    if side == "lmgym":
        agent = lmgym_agent(seed)
        for _ in range(iters):
            agent.step()
    else:
        with tempfile.TemporaryDirectory() as out_dir:
            trl_trainer(iters, out_dir, [], seed).train()
    return h.status_kib("VmHWM") / 1024


def grpo(args: Any) -> list[str]:
    import functools

    run = alternated(args)
    mem = {
        side: h.in_fresh_process(functools.partial(peak_rss_mib, side, 3, args.seed), args.threads)
        for side in ("lmgym", "trl")
    }
    lm, trl = run["lm"], run["trl"]
    ratio = statistics.median(trl) / statistics.median(lm)
    b, la, ta = run["base"], run["lm_after"], run["trl_after"]
    return [
        f"- work per iteration: {PROMPTS} prompts x {GROUP} completions of `{TASK}` (train "
        f"split, chat template), at most {MAX_NEW} new tokens (both stop on `<|im_end|>`), "
        f"temperature 1, reward = the task's `answer={ANSWER_RULE!r}` rule (the same function), "
        f"LoRA {LORA}, beta = 0, one AdamW step per iteration (lr {LEARNING_RATE:g}, "
        "constant, clip 1.0), GRPO loss with group-std scaling and token clip 0.2 "
        "(TRL `loss_type='grpo'`, lmgym `GRPO`), float32, seed "
        f"{args.seed}",
        f"- method: TRL's `trainer.train()` for {args.iters} steps, one lmgym `agent.step()` "
        f"after each (alternated in one process); the first {args.warmup} pairs are not "
        "timed. TRL: end of the previous step's callbacks -> `on_step_end`. Peak RSS: a "
        "fresh process per side running 3 iterations. Held-out reward: "
        f"{EVAL_PROMPTS} prompts of the eval split, greedy (1 completion) and sampled "
        f"(T=1, {EVAL_SAMPLES} completions), the same seed for every model.",
        "",
        *h.table(
            "side | s/it median [IQR] (min-max) | peak RSS (MiB) | held-out greedy | "
            "held-out sampled | train reward, last 10 it",
            [
                f"base model | - | - | {b['greedy']:.3f} | {b['sampled']:.3f} | -",
                f"lmgym GRPO | {h.spread(lm)} | {mem['lmgym']:.0f} | {la['greedy']:.3f} "
                f"| {la['sampled']:.3f} | {statistics.mean(run['lm_train_reward'][-10:]):.3f}",
                f"TRL GRPOTrainer | {h.spread(trl)} | {mem['trl']:.0f} | {ta['greedy']:.3f} "
                f"| {ta['sampled']:.3f} | "
                + (
                    f"{statistics.mean(run['trl_train_reward'][-10:]):.3f}"
                    if run["trl_train_reward"]
                    else "-"
                ),
            ],
        ),  # fmt: skip
        "",
        f"Other CPU load during the run: {h.load_cell(run['other_load'])}.",
        "",
        f"## Target (issue 25: >= {TARGET_GRPO}x)",
        "",
        h.target_line("GRPO + LoRA iteration", ratio, TARGET_GRPO, "lmgym vs TRL"),
    ]


def main(argv: list[str] | None = None) -> None:
    p = h.parser(__doc__, "smoke run")
    p.add_argument("what", choices=["rollout", "grpo"], help="which comparison")
    p.add_argument("--iters", type=int, help="grpo: iterations per side (default 60)")
    p.add_argument("--seed", type=int, default=0, help="grpo: seed of both sides")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--warmup", type=int, help="untimed calls per side (default 2)")
    p.add_argument("--repeats", type=int, help="timed calls per side (default 8)")
    p.add_argument(
        "--compile-decode", action="store_true", help="rollout: lmgym's compiled decode step"
    )
    p.add_argument(
        "--batches", type=int, nargs="+", default=list(BATCHES),
        help=f"rollout: batch sizes (default {' '.join(map(str, BATCHES))})",
    )  # fmt: skip
    p.add_argument(
        "--groups", type=int, nargs="+", default=list(GROUPS),
        help=f"rollout: completions per prompt (default {' '.join(map(str, GROUPS))})",
    )  # fmt: skip
    args = p.parse_args(argv)
    h.fill_defaults(args, dict(warmup=2, repeats=8, iters=60), dict(warmup=1, repeats=2, iters=3))
    torch.set_num_threads(args.threads)
    command = h.command_line("real_model_peers.py", argv)
    start = time.perf_counter()
    body = rollout(args) if args.what == "rollout" else grpo(args)
    title = {
        "rollout": "Rollout on a real model: lmgym collect vs transformers generate",
        "grpo": "GRPO + LoRA on a real model: lmgym vs TRL GRPOTrainer",
    }[args.what]
    head = h.header(
        title,
        f"torch threads = {args.threads}",
        ["torch", "transformers", "trl", "peft", "lmgym"],
        command,
        note=f" (total {time.perf_counter() - start:.0f} s)",
        compile_decode=args.compile_decode,
    )
    h.finish([*head, *body], args.out)


if __name__ == "__main__":
    main()
