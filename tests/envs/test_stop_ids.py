"""Stop ids from the model: generation stops at every id of the model's
``generation_config.eos_token_id`` as well as the tokenizer's EOS, with a Llama model
and a BPE tokenizer (BOS, chat template) built here."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch

import lmgym  # noqa: F401
from lmgym.envs import FunctionReward, TokenVectorEnv, stop_ids_for
from lmgym.policy import CausalLMPolicy
from lmgym.rollout import collect


def model_stopping_on(eos):
    return SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=eos))


def test_stop_ids_for_reads_an_int_or_a_list(bpe_tokenizer):
    tok = bpe_tokenizer
    eos, im_end = tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")
    assert stop_ids_for(None, tok) == [eos]
    assert stop_ids_for(model_stopping_on(None), tok) == [eos]
    assert stop_ids_for(model_stopping_on(im_end), tok) == [eos, im_end]
    # Duplicates once; ids outside the tokenizer (never sampled) left out.
    assert stop_ids_for(model_stopping_on([im_end, eos, 10**6]), tok) == [eos, im_end]


def test_the_policy_keeps_the_models_stop_ids_samplable(bpe_tokenizer, tiny_llama):
    tok = bpe_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    policy = CausalLMPolicy(tiny_llama, tok)
    assert policy.stop_token_ids == [tok.eos_token_id, im_end]
    assert im_end not in policy.masked_token_ids
    assert tok.convert_tokens_to_ids("<|im_start|>") in policy.masked_token_ids


def chat_env(tok, **kwargs) -> TokenVectorEnv:
    prompts = [[{"role": "user", "content": "the cat"}], "how many apples?"]
    reward = FunctionReward(lambda p, c: [float(len(x)) for x in c], name="length")
    return TokenVectorEnv(
        tok, prompts, reward, num_prompts=2, group_size=4, max_new_tokens=6, **kwargs
    )


def test_an_env_with_the_models_stop_ids_ends_on_each(bpe_tokenizer, tiny_llama):
    tok = bpe_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    policy = CausalLMPolicy(tiny_llama, tok)
    env = chat_env(tok, stop_token_ids=policy.stop_token_ids)
    policy.check_env(env)
    env.reset(seed=0)
    word = tok.convert_tokens_to_ids("cat")
    actions = torch.tensor([im_end, tok.eos_token_id, word, word] * 2)
    _, _, terminated, _, _ = env.step(actions)
    assert terminated.tolist() == [True, True, False, False] * 2
    # A special stop id ends the text rather than being in it.
    _, reward, *_ = env.step(torch.tensor([word, word, im_end, word] * 2))
    assert reward.tolist() == [0.0, 0.0, 3.0, 0.0] * 2


def test_an_env_without_the_models_stop_ids_is_refused_with_the_fix(bpe_tokenizer, tiny_llama):
    tok = bpe_tokenizer
    policy = CausalLMPolicy(tiny_llama, tok)
    with pytest.raises(
        ValueError,
        match=r"the model stops on '<\|im_end\|>' \(id \d+\) \(its generation_config.eos_token_id\), "
        r"which the env refuses as an action; build the env with stop_token_ids=policy.stop_token_ids",
    ):
        policy.check_env(chat_env(tok))


def test_a_llama_policy_rolls_out_chat_prompts_to_its_stop_ids(bpe_tokenizer, tiny_llama):
    tok = bpe_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():  # make <|im_end|> likely, so some rows stop on it
        tiny_llama.lm_head.weight[im_end] = tiny_llama.model.norm.weight * 4.0
    policy = CausalLMPolicy(tiny_llama, tok)
    env = chat_env(tok, stop_token_ids=policy.stop_token_ids)
    batch = collect(env, policy, seed=0)
    last = batch.completion_ids.gather(1, (batch.lengths - 1)[:, None])[:, 0]
    assert bool(batch.terminated.any())
    assert set(last[batch.terminated].tolist()) <= {tok.eos_token_id, im_end}
    assert im_end in last[batch.terminated].tolist()
    # The prompts carry one BOS each: the template's, or the tokenizer's for plain text.
    assert (batch.prompt_ids == tok.bos_token_id).sum(1).tolist() == [1] * 8


def test_a_builtin_task_takes_the_models_stop_ids(bpe_tokenizer, tiny_llama):
    tok = bpe_tokenizer
    stop = stop_ids_for(tiny_llama, tok)
    env = gym.make_vec("lmgym/WordProblem-v0", num_envs=2, tokenizer=tok, stop_token_ids=stop)
    assert env.stop_token_ids.tolist() == stop
    CausalLMPolicy(tiny_llama, tok).check_env(env)
    # Plain-text prompts of a built-in task get the tokenizer's BOS too.
    assert bool(
        (env.prompt_table.ids[env.prompt_table.mask.cumsum(1) == 1] == tok.bos_token_id).all()
    )
