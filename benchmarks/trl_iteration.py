"""GRPO / RLOO iteration time: lmgym against TRL's ``GRPOTrainer`` / ``RLOOTrainer``.

One iteration = generate a batch of completions, score them, one optimizer step on
them. lmgym times ``agent.step()`` (collect + update); TRL times one trainer step
(generation, rewards, advantages, loss, backward, clip, optimizer step and the
Trainer loop's own overhead around it). Both sides run in one process, alternated.

Equal work (issue 7):

- Models: GPT-2 built from a config (2 layers x 128 wide, 4 heads; 6 layers x 384
  wide, 6 heads), a character tokenizer of 99 ids (``string.printable`` minus
  ``\\n\\r\\x0b\\x0c``), saved once with ``save_pretrained`` to a temporary directory
  and loaded from it by both sides, so the weights are identical. float32, CPU,
  ``torch.set_num_threads`` for each of ``--threads`` (default ``2,1``: the issue's
  2 threads, and 1 thread for information), gradient checkpointing off, no dropout.
- Batch: the same 8 prompts of exactly 16 characters (no padding on either side),
  8 completions each (64 rows), exactly 32 new tokens per row, temperature 1, no
  top-k / top-p (TRL: ``top_k=0, top_p=1.0``; lmgym: ``top_k=None, top_p=None``).
- Exactly 32 tokens on both sides: both stop a row at EOS (TRL's generate stops at
  the tokenizer's EOS; the env's default ``stop_token_ids`` is the same id), so the
  saved model is edited to give EOS (and the pad id) probability exactly 0: the
  final layer norm's channel 0 is made constant 1 (weight 0, bias 1) and the tied
  embedding rows of EOS and pad get -1e4 in that channel, so their logits sit
  ~1e4 below every other (``exp`` underflows to 0 in float32). Nothing is patched
  at run time; it is a plain GPT-2 checkpoint. The script asserts that every row
  on both sides has 32 tokens (mean completion length is reported).
- Same reward function object on both sides (fraction of ``e`` characters in the
  completion text), as lmgym's ``FunctionReward`` and as a TRL reward function.
- Update: beta = 0 (no reference model on either side), one optimizer step per
  batch, the same learning rate (constant: TRL gets ``lr_scheduler_type="constant"``),
  AdamW (0.9, 0.999), weight decay 0, gradient clipping at 1.0 on both sides.
  GRPO: group-std-scaled advantages, token clip 0.2, per-sequence mean of token
  means (lmgym ``seq-mean-token-mean`` = TRL ``loss_type="grpo"``), one epoch, one
  minibatch (TRL: ``num_iterations=1, steps_per_generation=1``), so neither side
  runs a separate no-grad pass for the old log-probs. RLOO: TRL's ``RLOOTrainer``
  always runs an extra no-grad forward pass for the old log-probs and uses a
  sequence-level clipped loss; lmgym's ``RLOO`` (defaults: token-mean REINFORCE
  loss with the leave-one-out baseline) reuses the update's own forward pass.
  That difference is each library's implementation of the algorithm and is kept.
- lmgym's policy runs GPT-2's tanh-GELU as torch's fused kernel
  (``CausalLMPolicy(fused_activations=True)``, the default: the same function up
  to float rounding); TRL runs transformers' composed ``NewGELUActivation``. That
  is an lmgym optimisation and is kept too.

Processes. Absolute CPU speed moves by up to 30% between processes, and not always
for both sides alike, so each row runs in ``--processes`` fresh processes (default
3) and reports the median of their ratios; the seconds and tok/s columns pool the
iterations of all of them.

Alternation. TRL's ``trainer.train()`` owns its loop, so lmgym runs inside it: a
``TrainerCallback`` records the wall time of each TRL step (from the end of the
previous callback to ``on_step_end``: the full cycle including the Trainer's loop
overhead; ``on_step_begin`` -> ``on_step_end`` is reported too) and then, still in
``on_step_end``, runs and times one lmgym ``agent.step()``. The sequence is
T L T L ... ; the first ``--warmup`` pairs are discarded.

Profile (``--profile-iters``, untimed, after the comparison): extra lmgym iterations
under ``torch.profiler``, read by lmgym's phase labels (``lmgym.profiling``: policy
trunk forward in the rollout, LM head, sampling, ``env.step``, reward, update
forward), with timers wrapped around the agent's phases (update forward/backward/step),
printed and written to the results file, so a change in lmgym shows where it went.

Run from the repository root (needs the ``bench`` extra: ``pip install -e '.[bench]'``)::

    .venv/bin/python benchmarks/trl_iteration.py --out benchmarks/results/trl_iteration.md
    .venv/bin/python benchmarks/trl_iteration.py --quick       # smoke run, < 60 s
    .venv/bin/python benchmarks/trl_iteration.py --threads 2 --models small --algos grpo
    .venv/bin/python benchmarks/trl_iteration.py --wait-idle 1800 --out ...  # on a shared box
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import logging
import statistics
import string
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

# Make ``import lmgym`` (the repository root) and ``import _common`` (this directory)
# work when the package is not installed (run from a checkout).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    NOISY,
    CpuMeter,
    add_wait_idle_argument,
    command_line,
    deadline_from,
    in_fresh_process,
    machine_line,
    quiet_worker,
    run_undisturbed,
    utc_now,
    versions_line,
    write_report,
)

from lmgym.agents import GRPO, RLOO  # noqa: E402
from lmgym.envs import FunctionReward, TokenVectorEnv  # noqa: E402
from lmgym.policy import CausalLMPolicy, make_tiny_lm  # noqa: E402
from lmgym.profiling import (  # noqa: E402
    ACT,
    ENV_RESET,
    ENV_STEP,
    LM_HEAD,
    LOGPROBS,
    REWARD,
    SAMPLE,
    TRUNK,
    PhaseTime,
    phase_times,
)

CHARS = "".join(c for c in string.printable if c not in "\n\r\x0b\x0c")
PROMPTS = [
    "Once upon a time",
    "The quick brown ",
    "def reward(x): r",
    "In the beginning",
    "Q: what is 2+2? ",
    "Dear diary, tod ",
    "SELECT * FROM t ",
    "It was a dark an",
]
PROMPT_TOKENS = 16
NUM_PROMPTS = 8
GROUP_SIZE = 8
NEW_TOKENS = 32
LEARNING_RATE = 1e-3
N_POSITIONS = 64
BLOCKED_LOGIT = -1e4


@dataclass(frozen=True)
class ModelSpec:
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    target: float  # required TRL / lmgym ratio of median seconds per iteration


MODELS = {
    "small": ModelSpec("GPT-2 2L/128d", 2, 128, 4, 3.0),
    "large": ModelSpec("GPT-2 6L/384d", 6, 384, 6, 1.5),
}
ALGOS = ("grpo", "rloo")
TARGET_THREADS = 2  # the issue's setting; other thread counts are reported for information
ISSUE_TRL_SECONDS = {"small": 0.40, "large": 3.7}  # "for scale" figures quoted in issue 7


def reward_e(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
    """Fraction of 'e' characters in each completion (same function on both sides)."""
    return [c.count("e") / NEW_TOKENS for c in completions]


# ----------------------------------------------------------------------------- helpers
def quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def build_checkpoint(path: Path, spec: ModelSpec) -> Path:
    """Save a GPT-2 + char tokenizer whose EOS and pad ids have probability exactly 0."""
    model, tok = make_tiny_lm(
        CHARS, n_layer=spec.n_layer, n_embd=spec.n_embd, n_head=spec.n_head, n_positions=N_POSITIONS
    )
    with torch.no_grad():
        # h[..., 0] == 1 after the final layer norm, so logit_v = wte[v, 0] + (the rest).
        model.transformer.ln_f.weight[0] = 0.0
        model.transformer.ln_f.bias[0] = 1.0
        for token_id in (tok.eos_token_id, tok.pad_token_id):
            model.transformer.wte.weight[token_id, 0] = BLOCKED_LOGIT  # tied with lm_head
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


# ------------------------------------------------------------------------------ lmgym
def make_lmgym_agent(path: Path, algo: str) -> tuple[object, TokenVectorEnv]:
    policy = CausalLMPolicy.from_pretrained(path, temperature=1.0, top_k=None, top_p=None)
    for prompt in PROMPTS:
        assert len(policy.tokenizer(prompt, add_special_tokens=False)["input_ids"]) == 16
    env = TokenVectorEnv(
        policy.tokenizer,
        PROMPTS,
        FunctionReward(reward_e),
        num_prompts=NUM_PROMPTS,
        group_size=GROUP_SIZE,
        max_new_tokens=NEW_TOKENS,
    )
    assert env.prompt_width == PROMPT_TOKENS
    cls = GRPO if algo == "grpo" else RLOO
    agent = cls(policy, env, learning_rate=LEARNING_RATE, beta=0.0)
    return agent, env


@dataclass
class Sample:
    seconds: float
    tokens: int
    mean_length: float


def lmgym_step(agent: object) -> Sample:
    before = agent.tokens_generated
    start = time.perf_counter()
    metrics = agent.step()
    elapsed = time.perf_counter() - start
    tokens = agent.tokens_generated - before
    assert tokens == NUM_PROMPTS * GROUP_SIZE * NEW_TOKENS, f"lmgym generated {tokens} tokens"
    return Sample(elapsed, tokens, metrics["completion_length"])


# -------------------------------------------------------------------------------- TRL
def make_trl_trainer(path: Path, algo: str, steps: int, out_dir: str, callback: object):
    """A TRL trainer over the same checkpoint, prompts, reward and update settings."""
    import datasets
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    if algo == "grpo":
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer

        algo_args = dict(loss_type="grpo", scale_rewards="group", epsilon=0.2)
    else:
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Trainer

        algo_args = dict(normalize_advantages=False)

    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    config = Config(
        output_dir=out_dir,
        per_device_train_batch_size=NUM_PROMPTS * GROUP_SIZE,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=GROUP_SIZE,
        num_iterations=1,
        max_completion_length=NEW_TOKENS,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        mask_truncated_completions=False,
        max_steps=steps,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        shuffle_dataset=False,  # every batch = the 8 prompts, in order, like lmgym's
        seed=0,
        **algo_args,
    )
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    dataset = datasets.Dataset.from_dict({"prompt": PROMPTS * (steps + 1)})
    trainer = Trainer(
        model=model,
        reward_funcs=[reward_e],
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[callback],
    )
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    return trainer


# ---------------------------------------------------------------------- alternation
def alternated_run(
    path: Path, algo: str, warmup: int, iters: int
) -> tuple[list[Sample], list[Sample], list[float], float]:
    """Run TRL's trainer and, after each of its steps, one lmgym step.

    Returns:
        ``(lmgym samples, TRL samples (full cycle), TRL on_step_begin->end seconds,
        other CPU load)``, warm-up excluded.
    """
    from transformers import TrainerCallback

    agent, _ = make_lmgym_agent(path, algo)
    steps = warmup + iters
    lm: list[Sample] = []
    trl_cycle: list[Sample] = []
    trl_core: list[float] = []
    state = {"mark": None, "begin": None, "meter": None, "trainer": None}

    class Alternate(TrainerCallback):
        def on_train_begin(self, args, st, control, **kwargs):
            state["mark"] = time.perf_counter()

        def on_step_begin(self, args, st, control, **kwargs):
            state["begin"] = time.perf_counter()

        def on_step_end(self, args, st, control, **kwargs):
            end = time.perf_counter()
            metrics = state["trainer"]._metrics["train"]
            mean_len = metrics["completions/mean_length"][-1]
            min_len = metrics["completions/min_length"][-1]
            assert min_len == NEW_TOKENS, f"TRL: a completion has {min_len} < {NEW_TOKENS} tokens"
            timed = st.global_step > warmup
            if timed:
                if state["meter"] is None:
                    state["meter"] = CpuMeter()
                tokens = NUM_PROMPTS * GROUP_SIZE * int(round(mean_len))
                trl_cycle.append(Sample(end - state["mark"], tokens, mean_len))
                trl_core.append(end - state["begin"])
            sample = lmgym_step(agent)
            assert sample.mean_length == NEW_TOKENS
            if timed:
                lm.append(sample)
            state["mark"] = time.perf_counter()

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = make_trl_trainer(path, algo, steps, out_dir, Alternate())
        state["trainer"] = trainer
        trainer.train()
    assert len(lm) == iters and len(trl_cycle) == iters
    return lm, trl_cycle, trl_core, state["meter"].other_load()


# --------------------------------------------------------------------------- profile
class PhaseTimer:
    """Wall time per named phase, accumulated over calls (CPU: no device sync needed)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[name] += time.perf_counter() - start
                self.calls[name] += 1

        return timed


@contextlib.contextmanager
def instrumented(agent, timer: PhaseTimer) -> Iterator[None]:
    """Wrap the agent's phases of ``agent.step()`` with timers (instance attributes;
    restored). The policy's and env's phases come from lmgym's profiler labels instead.

    A phase whose method does not exist (lmgym's internals moved) is skipped; its
    row then reads 0.
    """
    patched: list[tuple[object, str, object]] = []
    missing = object()

    def wrap(obj: object, attr: str, name: str) -> None:
        if callable(getattr(obj, attr, None)):
            patched.append((obj, attr, obj.__dict__.get(attr, missing)))
            setattr(obj, attr, timer.wrap(name, getattr(obj, attr)))

    wrap(agent, "collect", "collect (total)")
    wrap(agent, "train_on_batch", "train_on_batch (total)")
    wrap(agent, "_prepare", "update: _prepare (advantages)")
    wrap(agent, "micro_batch_loss", "update: loss forward")
    wrap(agent, "_clip_and_step", "update: clip + AdamW step")
    wrap(agent, "_metrics", "update: metrics")
    try:
        yield
    finally:
        for obj, attr, old in reversed(patched):
            if old is missing:
                delattr(obj, attr)
            else:
                setattr(obj, attr, old)


def label_totals(times: dict[str, PhaseTime]) -> dict[str, tuple[float, int]]:
    """Inclusive seconds and calls of lmgym's labelled phases, named as in the table.

    ``phase_times`` gives exclusive time per label path; a phase's inclusive time is
    the sum over the paths through it.
    """

    def total(label: str, inside: str | None = None, outside: str | None = None):
        seconds, calls = 0.0, 0
        for path, t in times.items():
            labels = path.split("/")
            if label not in labels:
                continue
            context = labels[: labels.index(label)]
            if (inside is not None and inside not in context) or outside in context:
                continue
            seconds += t.seconds
            calls += t.calls if labels[-1] == label else 0
        return seconds, calls

    return {
        "rollout: policy.act (total)": total(ACT),
        "rollout: trunk forward (KV cache)": total(TRUNK, inside=ACT),
        "rollout: LM head": total(LM_HEAD, inside=ACT),
        "rollout: sampling": total(SAMPLE),
        "rollout: env.step (total)": total(ENV_STEP),
        "rollout: reward model": total(REWARD),
        "rollout: env.reset": total(ENV_RESET),
        "update: trunk forward": total(TRUNK, outside=ACT),
        "update: LM head + log-probs (fwd)": total(LOGPROBS),
    }


def profile_lmgym(path: Path, algo: str, warmup: int, iters: int) -> list[tuple[str, float, int]]:
    """Per-phase seconds per iteration of lmgym's ``agent.step()`` (profiled, untimed)."""
    agent, env = make_lmgym_agent(path, algo)
    for _ in range(warmup):
        agent.step()
    timer = PhaseTimer()
    with instrumented(agent, timer), torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(iters):
            agent.step()
        wall = time.perf_counter() - start
    labels = label_totals(phase_times(prof.events()))
    t = {k: v / iters for k, v in timer.total.items()}
    c = {k: v // iters for k, v in timer.calls.items()}
    t.update({k: sec / iters for k, (sec, _) in labels.items() if sec})
    c.update({k: calls // iters for k, (sec, calls) in labels.items() if sec})
    rows: list[tuple[str, float, int]] = [("agent.step() (profiled wall)", wall / iters, 1)]

    def row(name: str) -> None:
        if name in t:
            rows.append((name, t[name], c[name]))

    def derived(name: str, value: float, calls: int = 0) -> None:
        rows.append((name, value, calls))

    def get(name: str) -> float:
        return t.get(name, 0.0)

    row("collect (total)")
    row("rollout: policy.act (total)")
    row("rollout: trunk forward (KV cache)")
    row("rollout: LM head")
    row("rollout: sampling")
    derived(
        "rollout: act bookkeeping (rest of act)",
        get("rollout: policy.act (total)")
        - get("rollout: trunk forward (KV cache)")
        - get("rollout: LM head")
        - get("rollout: sampling"),
    )
    row("rollout: env.step (total)")
    row("rollout: reward model")
    row("rollout: env.reset")
    derived(
        "rollout: collect loop rest (batch assembly, syncs)",
        get("collect (total)")
        - get("rollout: policy.act (total)")
        - get("rollout: env.step (total)")
        - get("rollout: env.reset"),
    )
    row("train_on_batch (total)")
    row("update: _prepare (advantages)")
    row("update: loss forward")
    row("update: trunk forward")
    row("update: LM head + log-probs (fwd)")
    derived(
        "update: backward (rest of train_on_batch)",
        get("train_on_batch (total)")
        - get("update: _prepare (advantages)")
        - get("update: loss forward")
        - get("update: clip + AdamW step")
        - get("update: metrics"),
    )
    row("update: clip + AdamW step")
    row("update: metrics")
    return rows


# ---------------------------------------------------------------------------- report
@dataclass
class Result:
    algo: str
    model: str
    threads: int
    spec: ModelSpec
    lm: list[Sample]
    trl: list[Sample]
    trl_core: list[float]
    other_load: float
    profile: list[tuple[str, float, int]] = field(default_factory=list)
    # TRL median / lmgym median of each fresh process, when the row used several.
    process_ratios: tuple[float, ...] = ()

    @property
    def lm_median(self) -> float:
        return statistics.median(s.seconds for s in self.lm)

    @property
    def trl_median(self) -> float:
        return statistics.median(s.seconds for s in self.trl)

    @property
    def ratio(self) -> float:
        if self.process_ratios:
            return statistics.median(self.process_ratios)
        return self.trl_median / self.lm_median


def tokens_per_s(samples: list[Sample]) -> float:
    return sum(s.tokens for s in samples) / sum(s.seconds for s in samples)


def fmt_spread(xs: list[float]) -> str:
    q1, q2, q3 = quartiles(xs)
    return f"{q2:.3f} [{q1:.3f}, {q3:.3f}] ({min(xs):.3f}-{max(xs):.3f})"


def _quiet() -> None:
    import transformers

    warnings.filterwarnings("ignore")
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _child_init(threads: int) -> None:
    """Set up a fresh measuring process like the parent."""
    quiet_worker(threads)
    _quiet()


def report(results: list[Result], args: argparse.Namespace, wall: float, command: str) -> str:
    trl_name = {"grpo": "GRPOTrainer", "rloo": "RLOOTrainer"}
    lines = [
        "# GRPO / RLOO iteration time: lmgym vs TRL",
        "",
        f"- date: {utc_now()}",
        machine_line("torch threads per row in the 'threads' column"),
        versions_line(["torch", "transformers", "trl", "accelerate", "datasets", "lmgym"]),
        f"- command: `{command}` (total {wall:.0f} s)",
        f"- work per iteration: {NUM_PROMPTS} prompts x {GROUP_SIZE} completions, "
        f"{PROMPT_TOKENS}-token prompts, exactly {NEW_TOKENS} new tokens per row "
        f"({NUM_PROMPTS * GROUP_SIZE * NEW_TOKENS} completion tokens), temperature 1, no "
        "top-k/top-p, beta = 0, one AdamW step (lr "
        f"{LEARNING_RATE:g}, constant), float32, gradient checkpointing off",
        f"- method: both sides in one process, alternated (TRL step, lmgym step, ...), "
        f"{args.warmup} warm-up pairs discarded, then {args.iters} timed pairs. lmgym: wall "
        "time of `agent.step()`. TRL: wall time of one trainer step, end of the previous "
        "step's callbacks -> `on_step_end` (includes the Trainer loop's overhead); "
        "`on_step_begin` -> `on_step_end` in its own column. Seconds: median [IQR] (min-max). "
        "tok/s = completion tokens / seconds over all timed iterations. ratio = TRL median / "
        "lmgym median (> 1: lmgym faster); a row run in several fresh processes "
        f"({args.processes} here) pools their iterations in the seconds and tok/s columns "
        "and reports the median of the per-process ratios (listed below the table). "
        "Equal-work details are in the script's docstring.",
        "",
        "| algorithm | model | threads | lmgym s/it | TRL s/it | TRL s/it (step_begin->end) "
        "| lmgym tok/s | TRL tok/s | mean completion len (lmgym / TRL) | ratio | target "
        "| other CPU load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in results:
        noisy = " (noisy)" if r.other_load > NOISY else ""
        lm_len = statistics.mean(s.mean_length for s in r.lm)
        trl_len = statistics.mean(s.mean_length for s in r.trl)
        lines.append(
            f"| {r.algo.upper()} vs {trl_name[r.algo]} | {r.spec.name} | {r.threads} "
            f"| {fmt_spread([s.seconds for s in r.lm])} "
            f"| {fmt_spread([s.seconds for s in r.trl])} "
            f"| {statistics.median(r.trl_core):.3f} "
            f"| {tokens_per_s(r.lm):,.0f} | {tokens_per_s(r.trl):,.0f} "
            f"| {lm_len:.1f} / {trl_len:.1f} | {r.ratio:.2f}x | >= {r.spec.target:g}x "
            f"| {r.other_load:.0%}{noisy} |"
        )
    spreads = [
        f"- {r.algo.upper()}, {r.spec.name}, {r.threads} thread(s): per-process ratios "
        + ", ".join(f"{x:.2f}x" for x in r.process_ratios)
        for r in results
        if r.process_ratios
    ]
    if spreads:
        lines += ["", *spreads]
    lines += ["", f"## Targets (issue 7 setting: {TARGET_THREADS} torch threads)", ""]
    measured = {
        r.model: r.trl_median for r in results if r.algo == "grpo" and r.threads == TARGET_THREADS
    }
    if measured:
        quoted = ", ".join(
            f"{MODELS[m].name}: quoted {ISSUE_TRL_SECONDS[m]:.2f} s, measured {sec:.3f} s"
            for m, sec in measured.items()
        )
        lines += [
            f"- TRL GRPOTrainer reference: issue 7 quoted seconds per iteration for TRL on "
            f"this machine; this run ({TARGET_THREADS} threads, settings above): {quoted}",
        ]
    for r in results:
        met = r.ratio >= r.spec.target
        verdict = "MET" if met else "NOT MET"
        if r.threads != TARGET_THREADS:
            verdict += f" (for information: {r.threads} thread(s), not the issue's setting)"
        lines.append(
            f"- {r.algo.upper()}, {r.spec.name}, {r.threads} thread(s): lmgym {r.ratio:.2f}x "
            f"as fast as TRL (target >= {r.spec.target:g}x) -> {verdict}"
        )
    if any(r.other_load > NOISY for r in results):
        lines.append(
            f"- WARNING: other processes used more than {NOISY:.0%} of the CPUs during a "
            "row (column 'other CPU load'); those figures are unreliable, rerun on an idle "
            "machine"
        )
    if any(r.profile for r in results):
        lines += [
            "",
            "## Where lmgym's iteration goes",
            "",
            f"Untimed, after the comparison: {args.profile_iters} extra lmgym iterations "
            "under `torch.profiler`: the rollout and forward phases from lmgym's phase labels "
            "(`lmgym.profiling`), the agent's phases from wall-clock timers around its "
            "methods ('rest' rows are differences; the profiler's own cost per op inflates "
            "every phase a little). Seconds per iteration; calls per iteration in brackets.",
            "",
        ]
        profiled = [r for r in results if r.profile]
        header = "| phase | " + " | ".join(
            f"{r.algo.upper()} {r.spec.name}, {r.threads}T" for r in profiled
        )
        lines += [header + " |", "|---|" + "---:|" * len(profiled)]
        names = [name for name, _, _ in profiled[0].profile]
        for i, name in enumerate(names):
            cells = []
            for r in profiled:
                _, sec, calls = r.profile[i]
                wall = r.profile[0][1]
                share = f" ({sec / wall:.0%})" if i > 0 else ""
                cells.append(f"{sec:.3f}{share}" + (f" [{calls}]" if calls > 1 else ""))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (< 60 s)")
    parser.add_argument("--out", type=Path, help="write the results table (markdown) here")
    parser.add_argument(
        "--threads", default="2,1", help="comma list of torch thread counts (default 2,1)"
    )
    parser.add_argument("--models", default="small,large", help="comma list of: small, large")
    parser.add_argument("--algos", default="grpo,rloo", help="comma list of: grpo, rloo")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up pairs (default 3)")
    parser.add_argument("--iters", type=int, default=None, help="timed pairs (default 15)")
    parser.add_argument(
        "--processes",
        type=int,
        default=None,
        help="fresh processes per row; the row reports the median ratio (default 3, --quick 1)",
    )
    add_wait_idle_argument(parser)
    parser.add_argument(
        "--profile-iters", type=int, default=None, help="profiled lmgym iterations (default 5)"
    )
    args = parser.parse_args()
    if args.quick:
        args.models = "small" if args.models == "small,large" else args.models
        args.warmup = 1 if args.warmup is None else args.warmup
        args.iters = 3 if args.iters is None else args.iters
        args.profile_iters = 2 if args.profile_iters is None else args.profile_iters
        args.threads = "2" if args.threads == "2,1" else args.threads
        args.processes = 1 if args.processes is None else args.processes
    args.processes = 3 if args.processes is None else args.processes
    if args.processes < 1:
        parser.error(f"--processes {args.processes}: must be >= 1")
    args.warmup = 3 if args.warmup is None else args.warmup
    args.iters = 15 if args.iters is None else args.iters
    args.profile_iters = 5 if args.profile_iters is None else args.profile_iters
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    thread_counts = [int(t) for t in args.threads.split(",") if t.strip()]
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    for m in models:
        if m not in MODELS:
            parser.error(f"--models: unknown {m!r}; choose from {list(MODELS)}")
    for a in algos:
        if a not in ALGOS:
            parser.error(f"--algos: unknown {a!r}; choose from {list(ALGOS)}")

    _quiet()
    command = command_line("trl_iteration.py", sys.argv[1:])
    start = time.perf_counter()
    deadline = deadline_from(args.wait_idle, start)
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {m: build_checkpoint(Path(tmp) / m, MODELS[m]) for m in models}
        for threads, m, algo in itertools.product(thread_counts, models, algos):
            spec, path = MODELS[m], paths[m]
            torch.set_num_threads(threads)
            print(
                f"{algo.upper()} {spec.name}, {threads} thread(s): "
                f"{args.warmup}+{args.iters} pairs",
                flush=True,
            )
            run = functools.partial(alternated_run, path, algo, args.warmup, args.iters)
            if args.processes > 1:
                init = functools.partial(_child_init, threads)
                run = functools.partial(in_fresh_process, run, init)
            runs = [run_undisturbed(run, lambda r: r[3], deadline) for _ in range(args.processes)]
            assert torch.get_num_threads() == threads, "someone changed torch threads"
            result = Result(
                algo,
                m,
                threads,
                spec,
                lm=[s for r in runs for s in r[0]],
                trl=[s for r in runs for s in r[1]],
                trl_core=[x for r in runs for x in r[2]],
                other_load=max(r[3] for r in runs),
            )
            if len(runs) > 1:
                result.process_ratios = tuple(
                    statistics.median(s.seconds for s in r[1])
                    / statistics.median(s.seconds for s in r[0])
                    for r in runs
                )
            if args.profile_iters > 0:
                result.profile = profile_lmgym(path, algo, 1, args.profile_iters)
            results.append(result)
            if args.out is not None:  # keep what is done if the run is cut short
                partial = report(results, args, time.perf_counter() - start, command)
                total = len(thread_counts) * len(models) * len(algos)
                note = f"\n**Partial run: {len(results)} of {total} rows so far.**\n"
                if len(results) < total:
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(partial.replace("\n\n", note + "\n", 1))
            print(
                f"  lmgym {result.lm_median:.3f} s/it, TRL {result.trl_median:.3f} s/it, "
                f"ratio {result.ratio:.2f}x (target {spec.target:g}x), other CPU load "
                f"{result.other_load:.0%}",
                flush=True,
            )
    text = report(results, args, time.perf_counter() - start, command)
    print()
    print(text)
    write_report(text, args.out)


if __name__ == "__main__":
    main()
