"""The rollout engine on a real pretrained chat model: SmolLM2-135M-Instruct.

Everything else in tests/policy runs on tiny models built locally. This file checks
the same invariants on the packaged real model (``lmgym.policy.packaged``): a
Llama with 30 layers, grouped-query attention (9 query heads, 3 key/value heads),
RoPE, tied embeddings, a 49,152-token BPE vocabulary, a ChatML chat template and
``<|im_end|>`` as its stop token:

- cached sampler log-probs equal teacher-forced ones (float32, < 1e-4) with a
  group's prompt prefilled once, with continuous-batching restarts packed into the
  decode step, eagerly (all 30 layers) and through the compiled step (on the
  model's first 2 layers: compiling the 30-layer step takes many minutes on a CPU);
- the env renders chat prompts exactly as ``apply_chat_template`` does;
- completions stop on ``<|im_end|>``, and greedy decoding equals ``generate``;
- the special-token mask is the real tokenizer's;
- a LoRA adapter on the attention projections trains, saves and reloads exactly.

The model loads once per session; prompts are short (about 20 to 30 tokens) and
completions a handful of tokens: about 45 s of one CPU core, plus about 50 s for the
compiled test's first compile (marked ``slow``; ``make test`` runs it). Without the
model's package (and no converted copy in the cache) every test is skipped with the
install command as the reason.
"""

from __future__ import annotations

import copy
import importlib.util
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from lmgym.envs import FunctionReward, TokenVectorEnv
from lmgym.policy import CausalLMPolicy
from lmgym.policy.packaged import (
    MARKER,
    PACKAGED_MODELS,
    PackagedModelMissingError,
    cache_root,
)
from lmgym.rollout import ContinuousCollector, collect
from lmgym.special_tokens import special_token_ids
from lmgym.types import RolloutBatch

MODEL = "smollm2-135m-instruct"
SPEC = PACKAGED_MODELS[MODEL]


def _missing_reason() -> str | None:
    """Why the model cannot load here, or ``None``. The package is located, never
    imported (it imports a runtime lmgym does not use)."""
    if (cache_root() / f"{SPEC.name}-{SPEC.version}" / MARKER).is_file():
        return None  # converted already: the package is no longer needed
    if importlib.util.find_spec(SPEC.module) is None:
        return f"the real-model tests need {SPEC.package}: {SPEC.install}"
    return None


_REASON = _missing_reason()
pytestmark = [
    pytest.mark.skipif(_REASON is not None, reason=str(_REASON)),
    pytest.mark.heavy,  # loads a 135M-parameter model: make test-fast skips it
]

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


def chat(system: str, user: str) -> list[dict[str, str]]:
    """A two-message chat (a short system message keeps the prompt near 20 tokens; the
    template's default one is about 30 tokens long)."""
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# Chats of different lengths (left padding in the env): the greedy answers to DOG and
# SUM end with <|im_end|> as their 7th token; HI's talks on past a short budget.
DOG = chat("Answer with a number.", "How many legs does a dog have?")
SUM = chat("Answer with a number.", "2+2=")
HI = chat("Be brief.", "Say hi.")


@pytest.fixture(scope="session")
def smollm2() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The real model (float32, eval mode) and its tokenizer, loaded once by name.

    Tests build their own ``CausalLMPolicy`` around them (cheap) and must not change
    the weights (the LoRA test loads its own copy).
    """
    try:
        policy = CausalLMPolicy.from_pretrained(MODEL)
    except PackagedModelMissingError as error:  # e.g. the gguf reader is missing
        pytest.skip(str(error))
    return policy.model, policy.tokenizer


def lengths_reward(prompts: Sequence[Any], completions: Sequence[str]) -> list[float]:
    """Characters in each completion: varies within a group (GRPO gets a signal)."""
    return [float(len(c)) for c in completions]


def make_env(
    tokenizer: PreTrainedTokenizerBase,
    policy: CausalLMPolicy,
    prompts: Sequence[Any],
    **kwargs: Any,
) -> TokenVectorEnv:
    """A chat env that stops where the policy does (``<|im_end|>``, ``<|endoftext|>``)."""
    kwargs.setdefault("num_prompts", len(prompts))
    kwargs.setdefault("stop_token_ids", policy.stop_token_ids)
    return TokenVectorEnv(tokenizer, list(prompts), FunctionReward(lengths_reward), **kwargs)


def teacher_forced(
    policy: CausalLMPolicy, batch: RolloutBatch, group_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """``[B, L] float32`` teacher-forced log-probs of the batch's completions, 0 past
    each row's end."""
    ids, mask = batch.input_ids()
    with torch.no_grad():
        lp, _ = policy.logprobs(
            ids, mask, batch.max_new_tokens, group_ids=group_ids, with_entropy=False
        )
    return lp * batch.completion_mask


def logprob_gap(policy: CausalLMPolicy, batch: RolloutBatch, **kwargs: Any) -> float:
    """Largest |teacher-forced - sampler| log-prob over the batch's real tokens."""
    return (teacher_forced(policy, batch, **kwargs) - batch.sampler_logprobs).abs().max().item()


def first_layers(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """The model with only its first ``num_layers`` decoder layers: the same
    architecture and weights, a shorter stack (compiling all 30 layers' decode step
    takes many minutes on a 2-core CPU)."""
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    small = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    keep = {
        name: value
        for name, value in model.state_dict().items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers
    }
    small.load_state_dict(keep, strict=True)
    small.generation_config = copy.deepcopy(model.generation_config)
    return small.eval()


# Decode modes as in tests/policy/conftest.py's ``decode`` fixture: "eager" on all 30
# layers; "compiled" compiles the step on the model's first 2 layers (first_layers).
# (Its "fixed_shape" mode, the compiled step's code run uncompiled, adds nothing here
# that these two do not cover, and would cost as much as the eager run.)
ENGINES = ["eager", pytest.param("compiled", marks=pytest.mark.slow)]


@dataclass
class Engine:
    """Policies and envs on the real model for one decode mode (``engine`` fixture).

    Attributes:
        mode: ``"eager"`` or ``"compiled"``.
        model: the model the policies wrap.
        tokenizer: its tokenizer.
        extra_stop_ids: ids the env stops on besides the policy's stop ids. The
            2-layer model of the compiled mode never ends a reply, so there the env
            also stops on ``","``, a token it samples often: rows then stop, and
            restart, at varied steps as the full model's rows do at ``<|im_end|>``.
    """

    mode: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    extra_stop_ids: list[int] = field(default_factory=list)

    def policy(self, **settings: Any) -> CausalLMPolicy:
        """A policy decoding in this mode (checked not to have fallen back to eager)."""
        compiled = self.mode != "eager"
        policy = CausalLMPolicy(self.model, self.tokenizer, compile_decode=compiled, **settings)
        assert policy.compile_decode == compiled
        return policy

    def env(self, policy: CausalLMPolicy, prompts: Sequence[Any], **kwargs: Any) -> TokenVectorEnv:
        """``make_env`` stopping on the policy's stop ids and ``extra_stop_ids``."""
        stops = [*policy.stop_token_ids, *self.extra_stop_ids]
        return make_env(self.tokenizer, policy, prompts, stop_token_ids=stops, **kwargs)


@pytest.fixture(params=ENGINES)
def engine(request, smollm2) -> Iterator[Engine]:
    """The real model in one decode mode; in the compiled mode a fallback to eager
    decoding fails the test instead of passing as eager."""
    model, tokenizer = smollm2
    mode = request.param
    extra: list[int] = []
    if mode == "compiled":
        model = first_layers(model, 2)
        extra = [tokenizer.convert_tokens_to_ids(",")]
    with torch._dynamo.config.patch(recompile_limit=64), warnings.catch_warnings():
        if mode != "eager":
            warnings.filterwarnings("error", "compile_decode: torch.compile of the decode step")
        yield Engine(mode, model, tokenizer, extra)


def trunk_rows(policy: CausalLMPolicy, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of rows of every eager trunk pass ``policy`` makes from now on."""
    rows: list[int] = []
    forward = policy.trunk.hidden_states

    def spy(input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        rows.append(input_ids.shape[0])
        return forward(input_ids, *args, **kwargs)

    monkeypatch.setattr(policy.trunk, "hidden_states", spy)
    return rows


# ------------------------------------------------------------ 1. log-probs
def answer_begun(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], start: str
) -> str:
    """A plain-text prompt: the chat as the template renders it, the assistant's reply
    begun with ``start`` (so the model ends it, with ``<|im_end|>``, within a few tokens)."""
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return rendered + start


def test_rollout_logprobs_equal_teacher_forcing_with_group_prefill_and_restarts(
    engine, monkeypatch
):
    # One test for both rollout modes: in the compiled mode the continuous rollout then
    # reuses the synchronous one's compiled step (same rows, same slot capacity) and
    # compiles only the packed step.
    policy = engine.policy(temperature=0.7)
    # Replies that end after about 1 and 4 tokens, and one that runs to the budget, in
    # prompts of three lengths: rows are left-padded, and stop at different steps.
    prompts = [
        answer_begun(engine.tokenizer, DOG, "A dog has four legs."),
        answer_begun(engine.tokenizer, DOG, "A dog has"),
        HI,
    ]
    settings = {"num_prompts": 2, "group_size": 3, "max_new_tokens": 6}

    # (a) Episode-synchronous: each group's prompt is prefilled once for its 3 rows.
    env = engine.env(policy, prompts, **settings)
    rows = trunk_rows(policy, monkeypatch)
    batch = collect(env, policy, seed=0)
    assert rows[0] == 2  # the prefill: 2 groups' prompts, not 6 rows
    assert batch.prompt_mask.sum(1).unique().numel() == 2  # two prompts: left padding
    assert batch.lengths.min() < batch.lengths.max()  # ragged: rows stopped at varied steps
    assert batch.terminated.any() and batch.truncated.any()
    assert logprob_gap(policy, batch) < 1e-4
    # The learner's group-shared prompt pass gives the same log-probs.
    assert logprob_gap(policy, batch, group_ids=batch.group_ids) < 1e-4

    # (b) Continuous batching: finished rows restart at once, their new prompt packed
    # into the decode step of the rows still running.
    env = engine.env(policy, prompts, autoreset=True, **settings)
    restarts: list[int] = []
    restart = policy.engine._restart

    def counting(ids, mask, last_col, restarting, state):
        restarts.append(int(restarting.sum()))
        return restart(ids, mask, last_col, restarting, state)

    monkeypatch.setattr(policy.engine, "_restart", counting)
    collector = ContinuousCollector(env, policy, seed=0)
    spread = []  # whether the rows were at different cache columns after a collect
    for _ in range(3):
        batch = collector.collect(num_groups=2)
        assert batch.batch_size == 6
        assert logprob_gap(policy, batch) < 1e-4
        spread.append(len(set(collector._state.cols.tolist())) > 1)
    assert len(restarts) >= 3  # new episodes' prompts packed into decode steps...
    assert min(restarts) < env.num_envs  # ...while other rows went on decoding
    assert any(spread)  # so rows wrote different columns
    assert policy.compile_decode == (engine.mode != "eager")  # no fallback to eager


# ------------------------------------------------------------ 2. chat template
def test_the_env_renders_chat_prompts_exactly_as_apply_chat_template(smollm2):
    model, tokenizer = smollm2
    policy = CausalLMPolicy(model, tokenizer)
    multi_turn = [
        *chat("Be brief.", "Hi"),
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    no_system = [{"role": "user", "content": "Hi"}]  # the template adds its own system turn
    prompts = [SUM, multi_turn, no_system, "Plain text, no template."]
    env = make_env(tokenizer, policy, prompts, prompt_order="sequential")
    obs, info = env.reset(seed=0)
    for row in range(env.num_envs):
        prompt = prompts[int(info["prompt_index"][row])]
        real = obs["input_ids"][row][obs["attention_mask"][row].bool()].tolist()
        if isinstance(prompt, str):
            expected = tokenizer(prompt)["input_ids"]
        else:
            expected = tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, return_dict=False
            )
            assert tokenizer.decode(expected[-4:]) == f"{IM_START}assistant\n"
        assert real == list(expected), prompt
    assert sorted(info["prompt_index"].tolist()) == [0, 1, 2, 3]


# ------------------------------------------------------------ 3. stopping, greedy
def test_greedy_decoding_equals_generate_and_stops_on_im_end(smollm2):
    budget = 8  # DOG and SUM end their answer with <|im_end|> at the 7th token
    model, tokenizer = smollm2
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    endoftext = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    policy = CausalLMPolicy(model, tokenizer, temperature=0.0)
    assert policy.stop_token_ids == [im_end, endoftext]
    prompts = [DOG, SUM, HI]
    env = make_env(tokenizer, policy, prompts, max_new_tokens=budget, prompt_order="sequential")
    assert env.stop_token_ids.tolist() == [im_end, endoftext]
    batch = collect(env, policy, seed=0)
    for row in range(batch.batch_size):
        messages = prompts[int(batch.prompt_index[row])]
        inputs = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=budget, do_sample=False)
        expected = out[0, inputs["input_ids"].shape[1] :].tolist()
        ours = batch.completion_ids[row][batch.completion_mask[row]].tolist()
        assert ours == expected, (tokenizer.decode(ours), tokenizer.decode(expected))
        # An episode that emits <|im_end|> is terminated there, the stop token its last.
        stopped = expected[-1] == im_end
        assert bool(batch.terminated[row]) == stopped
        assert bool(batch.truncated[row]) == (not stopped and len(expected) == budget)
    assert batch.terminated.sum() >= 2  # DOG and SUM answer and stop
    assert not batch.terminated.all()  # HI talks on: truncated at the budget
    # <|endoftext|> ends an episode as well; an ordinary token does not.
    env.reset(seed=0)
    ordinary = tokenizer.convert_tokens_to_ids("Hello")
    _, _, terminated, truncated, _ = env.step(torch.tensor([im_end, endoftext, ordinary]))
    assert terminated.tolist() == [True, True, False] and not truncated.any()


# ------------------------------------------------------------ 4. special tokens
def test_the_special_token_mask_is_the_real_tokenizers(smollm2):
    model, tokenizer = smollm2
    im_start = tokenizer.convert_tokens_to_ids(IM_START)
    stops = [tokenizer.convert_tokens_to_ids(t) for t in (IM_END, ENDOFTEXT)]
    policy = CausalLMPolicy(model, tokenizer)
    special = special_token_ids(tokenizer)
    assert {im_start, *stops} <= set(special)
    assert policy.masked_token_ids == sorted(set(special) - set(stops))
    assert im_start in policy.masked_token_ids
    # After a finished turn the model's next token is most likely <|im_start|>: the
    # mask removes it, and the batch records how much probability that was.
    after_turn = f"{IM_START}user\nHi{IM_END}\n"
    env = make_env(tokenizer, policy, [after_turn], group_size=16, max_new_tokens=1)
    batch = collect(env, policy, seed=0)
    assert not (batch.completion_ids[:, 0] == im_start).any()
    assert batch.special_mass.min() > 0.5
    assert logprob_gap(policy, batch) < 1e-4  # teacher forcing masks the same ids
    # Without the mask the model does sample it.
    free = CausalLMPolicy(model, tokenizer, allowed_special_tokens="all")
    env = make_env(
        tokenizer, free, [after_turn], group_size=16, max_new_tokens=1,
        allowed_special_tokens="all",
    )  # fmt: skip
    assert (collect(env, free, seed=0).completion_ids[:, 0] == im_start).sum() >= 8


# ------------------------------------------------------------ 5. LoRA
def base_weights(policy: CausalLMPolicy) -> dict[str, torch.Tensor]:
    """The non-adapter weights of a peft policy under the plain model's names."""
    return {
        name.removeprefix("base_model.model.").replace(".base_layer", ""): param
        for name, param in policy.model.named_parameters()
        if "lora_" not in name
    }


def test_lora_on_attention_trains_saves_and_reloads_exactly(smollm2, tmp_path):
    peft = pytest.importorskip("peft")
    from lmgym.agents import GRPO

    model, tokenizer = smollm2
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    policy = CausalLMPolicy.from_pretrained(MODEL, peft_config=config)  # as a user would
    adapter = {n: p for n, p in policy.model.named_parameters() if "lora_" in n}
    assert len(adapter) == 30 * 4 * 2  # A and B on every attention projection
    assert {n for n, p in policy.model.named_parameters() if p.requires_grad} == set(adapter)
    before = {n: p.detach().clone() for n, p in adapter.items()}

    env = make_env(tokenizer, policy, [DOG, HI], group_size=2, max_new_tokens=4)
    agent = GRPO(policy, env, learning_rate=1e-3, seed=0, update_epochs=1, num_minibatches=1)
    agent.learn(1)
    # LoRA starts with B = 0, so the first (here the only) step moves every B (A's
    # gradient is 0).
    moved = [n for n, p in adapter.items() if not torch.equal(p, before[n])]
    assert moved and all("lora_B" in n for n in moved)
    assert len(moved) == len(adapter) // 2
    original = dict(model.named_parameters())
    trained_base = base_weights(policy)
    assert trained_base.keys() == original.keys()
    for name, param in trained_base.items():
        assert torch.equal(param, original[name]), name  # the base did not train

    batch = collect(env, policy, seed=1)
    assert logprob_gap(policy, batch) < 1e-4  # the adapter is in the sampler's path too
    trained = teacher_forced(policy, batch)
    base_lp = teacher_forced(CausalLMPolicy(model, tokenizer), batch)
    assert (trained - base_lp).abs().max() > 1e-4  # the adapter changed the policy

    policy.save_pretrained(tmp_path / "lora")
    again = CausalLMPolicy.from_pretrained(tmp_path / "lora")
    assert again.is_peft
    assert torch.equal(teacher_forced(again, batch), trained)
    for name, param in base_weights(again).items():
        assert torch.equal(param, original[name]), name
