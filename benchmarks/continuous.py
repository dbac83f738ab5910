"""Continuous batching: next-step-autoreset rollouts against episode-synchronous ones.

Completion tokens/s of ``lmgym.rollout.ContinuousCollector`` over a
``TokenVectorEnv(..., autoreset=True)`` (a finished row is refilled with the next
prompt on the following step while the other rows go on) against
``lmgym.rollout.collect`` over the same env built with ``autoreset=False`` (every
row of a batch waits until the longest one has finished), when completion lengths
vary widely. Both sides run in one process, alternated (A, B, B, A, ...) after a
warm-up; the script reports the median of each side and the ratio of medians.

Controlled lengths. A tiny GPT-2 (``lmgym.make_tiny_model``, character tokenizer)
gets a short supervised fine-tune before anything is timed (teacher-forced
cross-entropy, AdamW, fixed seeds) on two kinds of prompt:

- *short* prompts (16 random lowercase letters) are followed by 2 random
  characters and EOS: a 3-token completion;
- *long* prompts (16 random digits / punctuation marks) are followed by 128 random
  characters and never EOS, so they run to the ``max_new_tokens=128`` budget.

The benchmark prompts (a fixed set of 32 of each kind, not seen in training) are
served in shuffled order, so half of all episodes are short and half long:
bimodal lengths, the issue's example. Sampling is at temperature 1 over the full
vocabulary, so a short row occasionally misses its EOS and a long row occasionally
samples one; the script measures and reports the length distribution each side
actually produced (mean, share under 8 tokens, share at the 128 budget, by kind).

Equal work. Same model, policy (``lmgym.CausalLMPolicy``), prompts, ``num_envs``
(64 rows; ``--group-size`` G, default 1, gives 64/G prompts x G), budget and
sampler on both sides; the envs differ only in ``autoreset``. A call makes 64
completed episodes on either side:

- synchronous: one ``collect(env, policy, seed=...)`` (a fresh seed per call): 64
  rows, stepped until every row has ended, i.e. until the longest has (128 steps
  in practice);
- continuous: one ``collector.collect(num_groups=64 / G)``, which steps the env
  until 64 / G whole groups have ended and returns them.

A timed sample is ``--calls`` (default 2) consecutive calls. Tokens/s = real
completion tokens produced during the sample / its wall seconds. "Produced" is
counted by the env on both sides (``CountingEnv``): a token counts when a row's
completion grows by one on a step, so padding and the ignored actions of finished
(synchronous) or restarting (continuous) rows never count. On the synchronous
side that equals ``batch.lengths.sum()`` of the returned batches (asserted).
``ContinuousCollector`` carries episodes still in flight over to its next call, as
it does in training: a call returns episodes partly generated in earlier calls
and leaves partly generated ones for the next. Because every long episode is
exactly 128 tokens, they end in waves, and per call the returned tokens swing
several-fold (one call returns a wave of long episodes after a few steps, the next
mostly short ones after ~110 steps), so ``batch.lengths.sum()`` per call is not a
rate; the tokens produced per second are. The report also gives the ratio
computed from the returned episodes' ``batch.lengths`` over all samples (a
cross-check that differs only by what was in flight at the ends of the timed
window), checks the collector's own ``tokens_generated`` against the env's count,
and lists the length distribution of the returned episodes of both sides. Before
the alternation the collector runs untimed (``--prime`` calls) so the timed calls
see its steady state (right after a reset the short episodes finish first, which
would flatter it). Each ``collector.collect`` call starts from a fresh KV cache
(the weights may have changed between calls in training), so it re-prefills its
in-flight rows once per call; that cost is counted.

Noise. With 2 torch threads on 2 cores any other busy process slows a side a lot,
so every row reports the share of the CPUs other processes used while it ran,
flagged above 10%; ``--wait-idle SECONDS`` waits for an idle machine before each
row and reruns a disturbed one.

Profile (``--profile-calls``, untimed, after the comparison): a few more calls of
each side under ``torch.profiler``, with the exclusive time of each of lmgym's
phase labels (``lmgym.profiling``: the prefill of all rows, one-token decode, the
prefill of restarted rows and its cache writes, each with its trunk forward
separately, LM head, sampling, ``env.step``, the reward model), plus the mean number of KV-cache columns attention reads per step, so a slow
continuous side shows where its time goes.

Run from the repository root::

    .venv/bin/python benchmarks/continuous.py --out benchmarks/results/continuous.md
    .venv/bin/python benchmarks/continuous.py --quick          # smoke run, < 1 min
    .venv/bin/python benchmarks/continuous.py --wait-idle 600 --out ...  # shared machine
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import string
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import Tensor
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
    alternate,
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
from _lm import ZeroReward  # noqa: E402

from lmgym import (  # noqa: E402
    CausalLMPolicy,
    ContinuousCollector,
    RolloutBatch,
    TokenVectorEnv,
    collect,
    make_tiny_lm,
)
from lmgym.char_tokenizer import DEFAULT_CHARS  # noqa: E402
from lmgym.policy.kv_slots import is_slot_cache, slots_filled  # noqa: E402
from lmgym.profiling import TRUNK, phase_times  # noqa: E402

NUM_THREADS = 2
NUM_ENVS = 64
PROMPT_TOKENS = 16
NEW_TOKENS = 128
SHORT_CHARS = 2  # a short completion: 2 characters, then EOS (3 tokens)
N_POSITIONS = 160  # >= PROMPT_TOKENS + NEW_TOKENS
PROMPTS_PER_KIND = 32
SHORT_ALPHABET = string.ascii_lowercase
LONG_ALPHABET = string.digits + " +-*=:.,?!"
SHORT_UNDER = 8  # the "stopped within a few tokens" bucket: length < 8
TARGET = 1.5  # continuous / synchronous, completion tokens/s

FT_BATCH = 32  # fine-tune: sequences per step, half of each kind
FT_LR = 2e-3  # peak; linear decay to 0


@dataclass(frozen=True)
class ModelSpec:
    """A GPT-2 shape and its default number of fine-tune steps."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    finetune_steps: int


MODELS = {
    "small": ModelSpec("GPT-2 2L/128d", 2, 128, 4, 200),
    "large": ModelSpec("GPT-2 6L/256d", 6, 256, 4, 120),
}


class CountingEnv(TokenVectorEnv):
    """``TokenVectorEnv`` that counts its steps and the completion tokens it writes.

    A token is counted when a row's completion length grows by one on a step (the
    row was live and took the action); rows that had finished, or are refilled on
    that step, add nothing. Both sides use this class, so its small cost (two tensor
    ops per step) is the same on both.
    """

    steps = 0
    written: Tensor | None = None  # tokens written since construction (a 0-dim tensor)
    _last_length: Tensor | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        obs, info = super().reset(seed=seed, options=options)
        self._last_length = info["length"].clone()
        return obs, info

    def step(
        self, actions: Tensor
    ) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor, dict[str, Tensor]]:
        out = super().step(actions)
        length = out[4]["length"]
        grew = (length == self._last_length + 1).sum()
        self.written = grew if self.written is None else self.written + grew
        self._last_length = length.clone()
        self.steps += 1
        return out

    def tokens_written(self) -> int:
        """Completion tokens written since construction."""
        return 0 if self.written is None else int(self.written)


# ----------------------------------------------------------------------- setup
def char_ids(tokenizer: transformers.PreTrainedTokenizerBase, chars: str) -> Tensor:
    """The ids of ``chars`` (one per character) as an ``int64`` tensor."""
    return torch.tensor(tokenizer.convert_tokens_to_ids(list(chars)), dtype=torch.long)


def make_prompts(seed: int = 1) -> tuple[list[str], list[bool]]:
    """``PROMPTS_PER_KIND`` short-kind and long-kind prompts, interleaved.

    Returns:
        ``(prompts, is_short)``, both ``2 * PROMPTS_PER_KIND`` long.
    """
    gen = torch.Generator().manual_seed(seed)
    prompts, is_short = [], []
    for i in range(2 * PROMPTS_PER_KIND):
        short = i % 2 == 0
        alphabet = SHORT_ALPHABET if short else LONG_ALPHABET
        picks = torch.randint(len(alphabet), (PROMPT_TOKENS,), generator=gen).tolist()
        prompts.append("".join(alphabet[j] for j in picks))
        is_short.append(short)
    return prompts, is_short


def fine_tune(
    model: transformers.PreTrainedModel,
    tokenizer: transformers.PreTrainedTokenizerBase,
    steps: int,
    seed: int = 0,
) -> dict[str, float]:
    """Teach ``model`` the two completion kinds (untimed setup; see the module doc).

    Each step draws fresh random prompts: half short-kind, each followed by
    ``SHORT_CHARS`` random characters and EOS, half long-kind, each followed by
    ``NEW_TOKENS`` random characters. The loss is the mean token cross-entropy of
    the short rows' completions plus that of the long rows' completions plus that
    of the column where a short completion ends (the one decision that matters,
    for both kinds). AdamW, peak lr ``FT_LR`` decaying linearly to 0.

    Returns:
        Final losses, the stop probabilities at the end, and the seconds it took.
    """
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    every = char_ids(tokenizer, DEFAULT_CHARS)
    short_set, long_set = char_ids(tokenizer, SHORT_ALPHABET), char_ids(tokenizer, LONG_ALPHABET)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    b, half, p, n = FT_BATCH, FT_BATCH // 2, PROMPT_TOKENS, NEW_TOKENS
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=FT_LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - i / steps)
    for _ in range(steps):
        ids = every[torch.randint(len(every), (b, p + n), generator=gen)]
        ids[:half, :p] = short_set[torch.randint(len(short_set), (half, p), generator=gen)]
        ids[half:, :p] = long_set[torch.randint(len(long_set), (half, p), generator=gen)]
        ids[:half, p + SHORT_CHARS] = eos
        mask = torch.ones_like(ids, dtype=torch.bool)
        mask[:half, p + SHORT_CHARS + 1 :] = False
        ids = ids.masked_fill(~mask, pad)
        logits = model(input_ids=ids, attention_mask=mask.long()).logits[:, p - 1 : -1]
        nll = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), ids[:, p:].reshape(-1), reduction="none"
        ).view(b, n)
        target_mask = mask[:, p:]
        short_loss = (nll[:half] * target_mask[:half]).sum() / target_mask[:half].sum()
        long_loss = nll[half:].mean()
        decision = nll[:, SHORT_CHARS].mean()
        loss = short_loss + long_loss + decision
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    with torch.no_grad():  # the last batch's stop probabilities (before the last update)
        probs = logits.detach().float().softmax(-1)[:, :, eos]
    return {
        "steps": float(steps),
        "short loss": float(short_loss.detach()),
        "long loss": float(long_loss.detach()),
        "short: P(EOS) at its end": float(probs[:half, SHORT_CHARS].mean()),
        "long: P(EOS) per step": float(probs[half:].mean()),
        "seconds": time.perf_counter() - start,
    }


def build_policy(spec: ModelSpec, steps: int) -> tuple[CausalLMPolicy, dict[str, float]]:
    """A fine-tuned tiny GPT-2 as a ``CausalLMPolicy`` (temperature 1, no filtering)."""
    model, tok = make_tiny_lm(
        n_layer=spec.n_layer, n_embd=spec.n_embd, n_head=spec.n_head, n_positions=N_POSITIONS
    )
    stats = fine_tune(model, tok, steps)
    return CausalLMPolicy(model, tok, temperature=1.0, top_k=None, top_p=None), stats


def make_env(
    policy: CausalLMPolicy, prompts: list[str], group_size: int, autoreset: bool
) -> CountingEnv:
    """The benchmark env: 64 rows, shuffled prompts, 128-token budget, EOS stops."""
    return CountingEnv(
        policy.tokenizer,
        prompts,
        ZeroReward(),
        num_prompts=NUM_ENVS // group_size,
        group_size=group_size,
        max_new_tokens=NEW_TOKENS,
        autoreset=autoreset,
        prompt_order="shuffle",
    )


# ----------------------------------------------------------------- measurement
@dataclass
class Sample:
    """One timed sample of one side: ``--calls`` consecutive calls of ``NUM_ENVS`` episodes."""

    seconds: float
    produced: int  # completion tokens written into rows during the sample
    returned: int  # completion tokens of the episodes the calls returned
    counter: int  # the collector's own ``tokens_generated`` over the sample (= produced)
    steps: int  # env steps during the sample
    lengths: Tensor  # [episodes] completion lengths of the returned episodes
    short: Tensor  # [episodes] bool: the episode's prompt is of the short kind

    @property
    def tokens_per_s(self) -> float:
        return self.produced / self.seconds


@dataclass
class Side:
    """All timed samples of one side."""

    name: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def median(self) -> float:
        """Median over samples of completion tokens produced per second."""
        return statistics.median(s.tokens_per_s for s in self.samples)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.samples)

    @property
    def returned_rate(self) -> float:
        """Completion tokens of all returned episodes / all seconds."""
        return sum(s.returned for s in self.samples) / self.seconds

    @property
    def ms_per_step(self) -> float:
        return 1000 * self.seconds / sum(s.steps for s in self.samples)

    @property
    def steps_per_batch(self) -> float:
        """Env steps per ``NUM_ENVS`` completed episodes."""
        return NUM_ENVS * sum(s.steps for s in self.samples) / self.lengths.numel()

    @property
    def lengths(self) -> Tensor:
        return torch.cat([s.lengths for s in self.samples])

    @property
    def short(self) -> Tensor:
        return torch.cat([s.short for s in self.samples])


@dataclass
class Result:
    """One results row: a model, both sides, the load and the setup figures."""

    spec: ModelSpec
    group_size: int
    sync: Side
    cont: Side
    other_load: float
    finetune: dict[str, float]
    seconds: float = 0.0
    profile: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    notes: dict[str, dict[str, float]] = field(default_factory=dict)
    # Continuous / synchronous median of each fresh process, when the row used several.
    process_ratios: tuple[float, ...] = ()

    @property
    def ratio(self) -> float:
        """Continuous / synchronous median tokens/s: the headline figure (with several
        processes, the median of their ratios)."""
        if self.process_ratios:
            return statistics.median(self.process_ratios)
        return self.cont.median / self.sync.median

    @property
    def returned_ratio(self) -> float:
        """The same from the tokens of the returned episodes, over all samples."""
        return self.cont.returned_rate / self.sync.returned_rate


def timed_sample(
    name: str,
    env: CountingEnv,
    call: Callable[[], RolloutBatch],
    calls: int,
    counter: Callable[[], int],
    is_short: Tensor,
) -> Sample:
    """Time ``calls`` consecutive ``call()``s; count what they did (after the timing)."""
    written, steps, count = env.tokens_written(), env.steps, counter()
    start = time.perf_counter()
    batches = [call() for _ in range(calls)]
    seconds = time.perf_counter() - start
    lengths = torch.cat([b.lengths for b in batches])
    prompt_index = torch.cat([b.prompt_index for b in batches])
    assert lengths.numel() == calls * NUM_ENVS, f"{name}: {lengths.numel()} episodes"
    assert bool((lengths >= 1).all()) and bool((lengths <= NEW_TOKENS).all())
    return Sample(
        seconds=seconds,
        produced=env.tokens_written() - written,
        returned=int(lengths.sum()),
        counter=counter() - count,
        steps=env.steps - steps,
        lengths=lengths,
        short=is_short[prompt_index],
    )


def bench(
    spec: ModelSpec,
    policy: CausalLMPolicy,
    finetune: dict[str, float],
    args: argparse.Namespace,
) -> Result:
    """Build both envs over ``policy``, prime the collector, alternate both sides."""
    start = time.perf_counter()
    prompts, kinds = make_prompts()
    is_short = torch.tensor(kinds)
    g = args.group_size
    sync_env = make_env(policy, prompts, g, autoreset=False)
    cont_env = make_env(policy, prompts, g, autoreset=True)
    collector = ContinuousCollector(cont_env, policy, seed=0)
    for _ in range(args.prime):
        collector.collect(NUM_ENVS // g)
    seeds = iter(range(1, 1_000_000))
    sync, cont = Side("synchronous"), Side("continuous")
    keep = {"on": False}

    def run_sync() -> float:
        sample = timed_sample(
            "synchronous",
            sync_env,
            lambda: collect(sync_env, policy, seed=next(seeds)),
            args.calls,
            sync_env.tokens_written,
            is_short,
        )
        # Every row of a synchronous batch is returned: nothing is carried over.
        assert sample.produced == sample.returned, (sample.produced, sample.returned)
        if keep["on"]:
            sync.samples.append(sample)
        return sample.seconds

    def run_cont() -> float:
        sample = timed_sample(
            "continuous",
            cont_env,
            lambda: collector.collect(NUM_ENVS // g),
            args.calls,
            lambda: collector.tokens_generated,
            is_short,
        )
        if keep["on"]:
            cont.samples.append(sample)
        return sample.seconds

    for _ in range(args.warmup):
        run_cont()
        run_sync()
    keep["on"] = True
    meter = CpuMeter()
    alternate(run_cont, run_sync, 0, args.repeats)
    load = meter.other_load()
    result = Result(spec, g, sync, cont, load, finetune)
    if args.profile_calls > 0:
        result.profile, result.notes = profile(policy, sync_env, collector, args.profile_calls, g)
    result.seconds = time.perf_counter() - start
    return result


def bench_saved(
    spec: ModelSpec, path: Path, finetune: dict[str, float], args: argparse.Namespace
) -> Result:
    """``bench`` on the fine-tuned policy saved at ``path`` (in a fresh process)."""
    policy = CausalLMPolicy.from_pretrained(path, temperature=1.0, top_k=None, top_p=None)
    return bench(spec, policy, finetune, args)


def combine(runs: list[Result]) -> Result:
    """One row from the same benchmark in several processes: samples pooled, the
    profile of the first, the median of the per-process ratios."""
    first = runs[0]
    sync, cont = Side("synchronous"), Side("continuous")
    for r in runs:
        sync.samples += r.sync.samples
        cont.samples += r.cont.samples
    return Result(
        first.spec,
        first.group_size,
        sync,
        cont,
        max(r.other_load for r in runs),
        first.finetune,
        seconds=sum(r.seconds for r in runs),
        profile=first.profile,
        notes=first.notes,
        process_ratios=tuple(r.ratio for r in runs),
    )


# --------------------------------------------------------------------- profile
# Display names of lmgym's profiler labels (lmgym.profiling); a trunk forward is
# named after the phase that ran it.
PHASE_NAMES = {
    "lmgym.collect": "collect: loop rest (buffers, batch assembly)",
    "lmgym.act": "act: rest (masks, positions, cache bookkeeping)",
    "lmgym.prefill": "prefill all rows",
    "lmgym.decode": "decode",
    "lmgym.restart": "restart rows (cache writes, masks)",
    "lmgym.lm_head": "LM head",
    "lmgym.sample": "sampling",
    "lmgym.env_step": "env.step",
    "lmgym.env_reset": "env.reset",
    "lmgym.reward": "reward model",
}
PHASES = (
    "collect: loop rest (buffers, batch assembly)",
    "act: rest (masks, positions, cache bookkeeping)",
    "prefill all rows: trunk forward",
    "prefill all rows",
    "decode: trunk forward",
    "decode",
    "restart rows: trunk forward",
    "restart rows (cache writes, masks)",
    "LM head",
    "sampling",
    "env.step",
    "reward model",
    "env.reset",
)


def phase_name(path: str) -> str:
    """``"lmgym.collect/lmgym.act/lmgym.decode/lmgym.trunk"`` -> ``"decode: trunk forward"``."""
    labels = path.split("/")
    if labels[-1] == TRUNK and len(labels) > 1:
        return f"{PHASE_NAMES.get(labels[-2], labels[-2]).split(' (')[0]}: trunk forward"
    return PHASE_NAMES.get(labels[-1], labels[-1])


@contextlib.contextmanager
def noting(policy: CausalLMPolicy, notes: dict[str, list[float]]) -> Iterator[None]:
    """Wrap ``policy.act`` (an instance attribute; restored) to note, per step, the
    cache columns attention reads and the rows and width of a restart."""
    act = policy.act

    def act_noted(obs, state=None, episode_starts=None, *a, **k):
        if state is not None and episode_starts is not None and bool(episode_starts.any()):
            mask = obs["attention_mask"][episode_starts.to(obs["attention_mask"].device)]
            notes["restarted rows"].append(int(mask.shape[0]))
            last_col = (mask * torch.arange(mask.shape[1], device=mask.device)).argmax(dim=1)
            notes["restart width"].append(int(last_col.max()) + 1)
        out = act(obs, state, episode_starts, *a, **k)
        cache = getattr(out[2], "cache", None)
        if cache is not None:
            read = slots_filled(cache) if is_slot_cache(cache) else out[2].cache_mask.shape[1]
            notes["cache columns read"].append(read)
        return out

    policy.act = act_noted
    try:
        yield
    finally:
        del policy.act


def profile(
    policy: CausalLMPolicy,
    sync_env: CountingEnv,
    collector: ContinuousCollector,
    calls: int,
    group_size: int,
) -> tuple[dict[str, dict[str, tuple[float, float]]], dict[str, dict[str, float]]]:
    """Exclusive seconds per phase, per call of each side, from a ``torch.profiler``
    run keyed on lmgym's phase labels (untimed: the profiler adds its own cost).

    Returns:
        ``({side: {phase: (seconds per call, calls per call)}}, {side: {note: mean}})``.
    """
    out: dict[str, dict[str, tuple[float, float]]] = {}
    notes_out: dict[str, dict[str, float]] = {}
    sides: dict[str, tuple[CountingEnv, Callable[[], RolloutBatch]]] = {
        "synchronous": (sync_env, lambda: collect(sync_env, policy, seed=None)),
        "continuous": (collector.env, lambda: collector.collect(NUM_ENVS // group_size)),
    }
    for side, (env, call) in sides.items():
        notes: dict[str, list[float]] = defaultdict(list)
        steps = env.steps
        with noting(policy, notes), torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(calls):
                call()
            wall = time.perf_counter() - start
        total: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        for path, t in phase_times(prof.events()).items():
            total[phase_name(path)] += t.seconds
            count[phase_name(path)] += t.calls
        phases = {"call (profiled wall)": (wall / calls, 1.0)}
        for name in (*PHASES, *sorted(set(total) - set(PHASES))):
            if name in total:
                phases[name] = (total[name] / calls, count[name] / calls)
        out[side] = phases
        notes_out[side] = {k: statistics.mean(v) for k, v in notes.items() if v}
        trunk = "decode: trunk forward"
        if count.get(trunk):
            notes_out[side]["ms per decode trunk forward"] = 1000 * total[trunk] / count[trunk]
        notes_out[side]["env steps per call"] = (env.steps - steps) / calls
        notes_out[side]["restarts per call"] = len(notes.get("restarted rows", [])) / calls
    return out, notes_out


# ---------------------------------------------------------------------- report
def length_stats(side: Side) -> dict[str, float]:
    """Mean length, shares under ``SHORT_UNDER`` and at the budget, by kind."""
    lengths, short = side.lengths.float(), side.short
    return {
        "episodes": float(lengths.numel()),
        "mean": float(lengths.mean()),
        "under": float((lengths < SHORT_UNDER).float().mean()),
        "budget": float((lengths == NEW_TOKENS).float().mean()),
        "short share": float(short.float().mean()),
        "short mean": float(lengths[short].mean()) if bool(short.any()) else float("nan"),
        "long mean": float(lengths[~short].mean()) if bool((~short).any()) else float("nan"),
        "short under": float((lengths[short] < SHORT_UNDER).float().mean()),
        "long budget": float((lengths[~short] == NEW_TOKENS).float().mean()),
    }


def main_table(results: list[Result]) -> str:
    lines = [
        "| model | rows (prompts x G) | synchronous tok/s (median) | continuous tok/s (median) "
        "| ratio | ratio from returned episodes | env steps per 64 episodes (sync / cont) "
        "| ms per env step (sync / cont) | samples | other CPU load |",
        "|---|---|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in results:
        flag = " (noisy)" if r.other_load > NOISY else ""
        lines.append(
            f"| {r.spec.name} | {NUM_ENVS} ({NUM_ENVS // r.group_size} x {r.group_size}) "
            f"| {r.sync.median:,.0f} | {r.cont.median:,.0f} | {r.ratio:.2f}x "
            f"| {r.returned_ratio:.2f}x "
            f"| {r.sync.steps_per_batch:.1f} / {r.cont.steps_per_batch:.1f} "
            f"| {r.sync.ms_per_step:.2f} / {r.cont.ms_per_step:.2f} "
            f"| {len(r.sync.samples)} | {r.other_load:.0%}{flag} |"
        )
    return "\n".join(lines)


def lengths_table(results: list[Result]) -> str:
    lines = [
        "| model | side | episodes | mean length | share < 8 tokens | share at 128 "
        "| short-kind share | short kind: mean, share < 8 | long kind: mean, share at 128 "
        "| tokens produced / returned |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in results:
        for side in (r.sync, r.cont):
            s = length_stats(side)
            returned = sum(x.returned for x in side.samples)
            produced = sum(x.produced for x in side.samples)
            lines.append(
                f"| {r.spec.name} | {side.name} | {s['episodes']:.0f} | {s['mean']:.1f} "
                f"| {s['under']:.1%} | {s['budget']:.1%} | {s['short share']:.1%} "
                f"| {s['short mean']:.2f}, {s['short under']:.1%} "
                f"| {s['long mean']:.1f}, {s['long budget']:.1%} | {produced / returned:.3f} |"
            )
    return "\n".join(lines)


def profile_table(results: list[Result]) -> list[str]:
    profiled = [r for r in results if r.profile]
    if not profiled:
        return []
    cols = [(r, side) for r in profiled for side in ("synchronous", "continuous")]
    lines = [
        "| phase (exclusive time) | "
        + " | ".join(f"{r.spec.name}, {side}" for r, side in cols)
        + " |",
        "|---|" + "---:|" * len(cols),
    ]
    names: list[str] = []
    for r, side in cols:
        names += [n for n in r.profile[side] if n not in names]
    for name in names:
        cells = []
        for r, side in cols:
            sec, calls = r.profile[side].get(name, (0.0, 0.0))
            wall = r.profile[side]["call (profiled wall)"][0]
            share = f" ({sec / wall:.0%})" if name != "call (profiled wall)" else ""
            count = f" [{calls:.0f}]" if calls > 1.5 else ""
            cells.append(f"{sec:.3f}{share}{count}" if sec or calls else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    note_names: list[str] = []
    for r, side in cols:
        note_names += [n for n in r.notes.get(side, {}) if n not in note_names]
    for name in note_names:
        cells = [f"{r.notes.get(side, {}).get(name, 0.0):.2f}" for r, side in cols]
        lines.append(f"| *{name}* (mean) | " + " | ".join(cells) + " |")
    return lines


def source_line() -> str:
    """The git commit measured, and whether ``lmgym/`` had uncommitted changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "lmgym"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "- source: unknown (no git)"
    state = "with uncommitted changes under lmgym/" if dirty else "lmgym/ clean"
    return f"- source: commit {head or '?'}, {state} (at the start of the run)"


def verdicts(results: list[Result]) -> list[str]:
    out = []
    for r in results:
        met = r.ratio >= TARGET
        out.append(
            f"- continuous >= {TARGET:g}x synchronous, {r.spec.name}, G={r.group_size}: "
            f"{r.ratio:.2f}x (from the returned episodes' tokens: {r.returned_ratio:.2f}x) "
            f"-> {'MET' if met else 'NOT MET'}"
        )
    if any(r.other_load > NOISY for r in results):
        out.append(
            f"- WARNING: other processes used more than {NOISY:.0%} of the CPUs during a "
            "row (column 'other CPU load'); those figures are unreliable, rerun on an idle "
            "machine"
        )
    return out


def report(
    results: list[Result], args: argparse.Namespace, command: str, wall: float, source: str
) -> str:
    """The Markdown results file (``source``: ``source_line()`` taken at the start)."""
    ft = "; ".join(
        f"{r.spec.name}: {r.finetune['steps']:.0f} steps, {r.finetune['seconds']:.0f} s, short "
        f"rows' P(EOS) where they should stop {r.finetune['short: P(EOS) at its end']:.3f}, "
        f"long rows' P(EOS) per step {r.finetune['long: P(EOS) per step']:.1e} (last "
        "training batch)"
        for r in results
    )
    n_groups = NUM_ENVS // args.group_size
    lines = [
        "# Continuous batching: next-step autoreset vs episode-synchronous rollouts",
        "",
        f"- date: {utc_now()}",
        machine_line(f"torch threads = {torch.get_num_threads()}"),
        versions_line(["torch", "transformers", "gymnasium", "lmgym"]),
        source,
        f"- command: `{command}` (total {wall:.0f} s, incl. fine-tunes, priming, profiling "
        "and any waiting for idle CPUs / reruns of disturbed rows)",
        f"- work: {NUM_ENVS} rows, {PROMPT_TOKENS}-token prompts, max_new_tokens = "
        f"{NEW_TOKENS}, temperature 1, full vocabulary, EOS stops, same policy and prompts on "
        "both sides. A timed sample is "
        f"{args.calls} consecutive calls of {NUM_ENVS} completed episodes each. Synchronous: "
        "`collect(env, policy, seed=...)` over `TokenVectorEnv(..., autoreset=False)`. "
        f"Continuous: `ContinuousCollector.collect(num_groups={n_groups})` over the same env "
        "with `autoreset=True`; episodes in flight carry over from call to call, as in "
        f"training (the collector ran {args.prime} untimed calls first to reach its steady "
        "state), and every call starts from a fresh KV cache (re-prefills its rows once).",
        "- lengths: a tiny GPT-2 fine-tuned (untimed, fixed seeds) so that short-kind prompts "
        f"(lowercase letters) get {SHORT_CHARS} characters + EOS ({SHORT_CHARS + 1} tokens) "
        f"and long-kind prompts (digits / punctuation) never stop before {NEW_TOKENS}; "
        f"{PROMPTS_PER_KIND} prompts of each kind, shuffled. Fine-tune: {ft}.",
        f"- method: both sides in one process, alternated (ABBA) after {args.warmup} warm-up "
        f"pair(s); {args.repeats} timed samples per side. tok/s = real completion tokens "
        "produced during the sample (tokens written into live rows, counted by the env: "
        "padding and the ignored actions of finished or restarting rows do not count) / wall "
        "seconds of the sample; median over samples; ratio = continuous median / synchronous "
        "median (> 1: continuous faster). 'ratio from returned episodes' = (sum of "
        "`batch.lengths` / seconds over all samples) continuous / synchronous. 'other CPU "
        "load' = share of the machine's CPUs used by other processes while that row ran. "
        f"Each row runs in {args.processes} fresh process(es) (the fine-tuned model saved "
        "once and loaded in each; absolute speed moves by up to 30% between processes): "
        "the tok/s, steps and lengths columns pool the samples of all of them, the ratio is "
        "the median of the per-process ratios (listed below the table), and the profile "
        "comes from the first.",
        "- why produced rather than returned tokens per sample: the synchronous side returns "
        "exactly what it produced. The continuous side returns whole episodes, some partly "
        "made in earlier calls, and its long episodes (all exactly 128 tokens) finish in "
        "waves, so one call returns mostly long episodes after few steps and the next mostly "
        "short ones after many: per call, returned tokens/s swings several-fold around the "
        "true rate. Tokens produced per second is that rate; the returned-episode ratio over "
        "all samples is given as a cross-check (it differs only by what was in flight at "
        "the ends of the timed window).",
        "",
        main_table(results),
        "",
        *[
            f"- {r.spec.name}: per-process ratios "
            + ", ".join(f"{x:.2f}x" for x in r.process_ratios)
            for r in results
            if r.process_ratios
        ],
        "",
        "Completion lengths of the episodes returned in the timed samples (both sides "
        "sample the same policy on the same prompt mix):",
        "",
        lengths_table(results),
        "",
        f"## Target (continuous >= {TARGET:g}x synchronous tokens/s)",
        "",
        *verdicts(results),
        "",
    ]
    counters = [
        f"{r.spec.name}: {sum(s.counter for s in r.cont.samples):,} vs "
        f"{sum(s.produced for s in r.cont.samples):,}"
        for r in results
    ]
    lines += [
        "Check: `ContinuousCollector.tokens_generated` over the timed samples against the "
        f"env's count of tokens written: {'; '.join(counters)}.",
        "",
    ]
    prof = profile_table(results)
    if prof:
        lines += [
            "## Where the time goes",
            "",
            f"Untimed, after the comparison: {args.profile_calls} more calls of each side "
            "under `torch.profiler`, read by lmgym's phase labels (`lmgym.profiling`; the "
            "profiler's own cost per op inflates every phase a little). Exclusive "
            "time: a phase excludes the labelled phases it calls ('X: trunk forward' is the "
            "model's forward pass called from X; a restart's one-token step counts as "
            "decode), so the phases add up to the call. "
            "Seconds per call (share of the call) [calls per call]. In italics: cache "
            "columns attention reads after an act step, rows and width (columns fed) of a restart, ms per "
            "one-token decode forward; means.",
            "",
            *prof,
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (< 1 min)")
    parser.add_argument("--out", type=Path, help="write a Markdown results file here")
    parser.add_argument(
        "--threads", type=int, default=NUM_THREADS, help=f"torch threads (default {NUM_THREADS})"
    )
    parser.add_argument("--models", default=None, help="comma list of: small, large (default both)")
    parser.add_argument(
        "--group-size", type=int, default=1, help=f"completions per prompt, divides {NUM_ENVS}"
    )
    parser.add_argument("--warmup", type=int, default=None, help="warm-up pairs (default 1)")
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per side (9)")
    parser.add_argument(
        "--calls", type=int, default=2, help=f"calls of {NUM_ENVS} episodes per sample (2)"
    )
    parser.add_argument(
        "--prime", type=int, default=None, help="untimed collector calls first (default 4)"
    )
    parser.add_argument(
        "--finetune-steps", type=int, default=None, help="override the per-model default"
    )
    parser.add_argument(
        "--profile-calls", type=int, default=None, help="profiled calls per side (default 4)"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=None,
        help="fresh processes per row (the fine-tuned model is saved once and loaded in "
        "each); the row reports the median ratio (default 3, --quick 1)",
    )
    add_wait_idle_argument(parser)
    args = parser.parse_args(argv)
    if NUM_ENVS % args.group_size:
        parser.error(f"--group-size must divide {NUM_ENVS}")
    quick = args.quick
    defaults = {
        "models": "small" if quick else "small,large",
        "warmup": 1,
        "repeats": 2 if quick else 9,
        "prime": 2 if quick else 4,
        "profile_calls": 2 if quick else 4,
        "finetune_steps": 60 if quick else None,
        "processes": 1 if quick else 3,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            parser.error(f"--models: unknown {m!r}; choose from {list(MODELS)}")
    if args.processes < 1:
        parser.error(f"--processes {args.processes}: must be >= 1")

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    t0 = time.perf_counter()
    deadline = deadline_from(args.wait_idle, t0)
    command = command_line("continuous.py", sys.argv[1:] if argv is None else argv)
    source = source_line()  # what is measured: the tree as it stands now
    results = []
    for m in models:
        spec = MODELS[m]
        steps = args.finetune_steps if args.finetune_steps is not None else spec.finetune_steps
        print(f"{spec.name}: fine-tune ({steps} steps)", flush=True)
        policy, finetune = build_policy(spec, steps)
        print(
            f"  {finetune['seconds']:.0f} s; {args.prime} priming calls, then "
            f"{args.warmup}+{args.repeats} pairs of samples",
            flush=True,
        )
        if args.processes == 1:
            run = functools.partial(bench, spec, policy, finetune, args)
            result = run_undisturbed(run, lambda r: r.other_load, deadline, label=spec.name)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                policy.save_pretrained(tmp)
                runs = []
                for i in range(args.processes):
                    # Profile once: in the first process.
                    child_args = argparse.Namespace(**vars(args))
                    child_args.profile_calls = args.profile_calls if i == 0 else 0
                    work = functools.partial(bench_saved, spec, Path(tmp), finetune, child_args)
                    init = functools.partial(quiet_worker, args.threads)
                    run = functools.partial(in_fresh_process, work, init)
                    label = f"{spec.name}, process {i + 1}"
                    runs.append(run_undisturbed(run, lambda r: r.other_load, deadline, label=label))
                    print(f"  process {i + 1}: ratio {runs[-1].ratio:.2f}x", flush=True)
            result = combine(runs)
        results.append(result)
        print(
            f"  synchronous {result.sync.median:,.0f} tok/s, continuous "
            f"{result.cont.median:,.0f} tok/s, ratio {result.ratio:.2f}x (returned "
            f"{result.returned_ratio:.2f}x), other CPU load {result.other_load:.0%} "
            f"({result.seconds:.0f} s)",
            flush=True,
        )
    text = report(results, args, command, time.perf_counter() - t0, source)
    print()
    print(text)
    write_report(text, args.out)


if __name__ == "__main__":
    main()
