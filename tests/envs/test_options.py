"""One set of env options for every task: built-in and custom tasks take every
``EnvOptions`` field in ``gymnasium.make_vec`` and ``gymnasium.make`` alike."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers import Autoreset
from testkit import CHEAP_TASKS

from lmgym.char_tokenizer import make_char_tokenizer
from lmgym.envs import (
    ENV_OPTION_NAMES,
    TASKS,
    EnvOptions,
    FunctionReward,
    TaskParams,
    TokenEnv,
    TokenVectorEnv,
    build_env,
    env_option_names,
    factory_arguments,
    register_reward_env,
    reward_env_factory,
    single_env_factory,
    task_factory,
    vector_entry_point,
)
from lmgym.envs.registration import batch_arguments
from lmgym.envs.tasks._common import PositionMatchReward


def count_a(prompts, completions):
    return [float(c.count("a")) for c in completions]


def test_every_builtin_task_lists_every_option():
    builtin = [task for task in TASKS if task.startswith("lmgym/")]
    assert set(CHEAP_TASKS) < set(builtin)
    for task in builtin:  # signatures only: nothing is built
        names = env_option_names(task)
        assert set(ENV_OPTION_NAMES) <= set(names), task
        assert names[:3] == ("num_envs", "group_size", "num_prompts"), task


def test_option_names_are_the_signature_in_order():
    names = env_option_names("lmgym/TargetString-v0")
    assert names == (
        "num_envs",
        "group_size",
        "num_prompts",
        "target",
        "prompt",
        *ENV_OPTION_NAMES[2:],
    )
    params = factory_arguments(vector_entry_point("lmgym/TargetString-v0"))[0]
    assert params["reward_mode"].default == "bandit"
    # A task's own default shows in its arguments.
    from lmgym.envs.tasks.arithmetic import make_arithmetic_process_vector
    from lmgym.envs.tasks.length_control import make_length_control_vector

    assert make_arithmetic_process_vector.arguments()["reward_mode"].default == "per_token"
    params = make_length_control_vector.arguments()
    assert (params["unfinished"].default, params["unfinished_penalty"].default) == ("penalty", 0.0)


# The per-token reward options the make_vec tests set, and read back from the env.
DENSE_CENTERED = {"reward_mode": "per_token", "per_token_form": "dense", "center_potential": True}


def reward_options(env) -> dict[str, object]:
    """The env's values of the options ``DENSE_CENTERED`` names."""
    return {name: getattr(env, name) for name in DENSE_CENTERED}


@pytest.mark.parametrize("task", CHEAP_TASKS)
def test_per_token_form_and_center_potential_reach_every_task(task):
    tokenizer = make_char_tokenizer()
    env = gym.make_vec(
        task,
        num_envs=4,
        group_size=2,
        **DENSE_CENTERED,
        prompt_order="sequential",
        tokenizer=tokenizer,
        device="cpu",
    )
    assert reward_options(env) == DENSE_CENTERED
    assert env.prompt_order == "sequential" and env.tokenizer is tokenizer
    single = gym.make(task, per_token_form="dense", center_potential=True, device="cpu")
    assert single.unwrapped.vector_env.per_token_form == "dense"


def test_dense_and_potential_forms_give_the_hand_computed_rewards():
    # Target "hi": R(prefix) = fraction of target positions right so far.
    for form, expected in (("potential", [0.5, 0.5]), ("dense", [0.5, 1.0])):
        env = gym.make(
            "lmgym/TargetString-v0",
            target="hi",
            prompt="say hi:",
            reward_mode="per_token",
            per_token_form=form,
        )
        env.reset(seed=0)
        tok = env.unwrapped.vector_env.tokenizer
        rewards = [env.step(tok.convert_tokens_to_ids(c))[1] for c in "hi"]
        assert rewards == expected, form


def test_a_custom_env_takes_every_option_in_make_vec():
    tokenizer = make_char_tokenizer()
    env_id = register_reward_env("CountA", FunctionReward(count_a), ["ab", "xyz"])
    dot = tokenizer.convert_tokens_to_ids(".")
    env = gym.make_vec(
        env_id,
        num_envs=4,
        group_size=2,
        max_new_tokens=5,
        max_prompt_length=6,
        **DENSE_CENTERED,
        unfinished="mask",
        unfinished_penalty=-2.0,
        stop_token_ids=[tokenizer.eos_token_id, dot],
        allowed_special_tokens=["<pad>"],
        autoreset=True,
        prompt_order="sequential",
        shard=(1, 2),
        render_mode="ansi",
        tokenizer=tokenizer,
        device="cpu",
    )
    assert isinstance(env, TokenVectorEnv) and env.tokenizer is tokenizer
    assert (env.num_envs, env.group_size, env.max_new_tokens, env.prompt_width) == (4, 2, 5, 6)
    assert reward_options(env) == DENSE_CENTERED
    assert (env.unfinished, env.unfinished_penalty, env.autoreset) == ("mask", -2.0, True)
    assert env.stop_token_ids.tolist() == [tokenizer.eos_token_id, dot]
    assert tokenizer.pad_token_id in env.legal_token_ids.tolist()
    assert (env.prompt_order, env.shard, env.render_mode) == ("sequential", (1, 2), "ansi")


def test_a_custom_single_env_takes_device_autoreset_and_render_mode():
    env_id = register_reward_env("CountA", FunctionReward(count_a), ["ab"], max_new_tokens=2)
    env = gym.make(env_id, device="cpu", autoreset=True, render_mode="ansi")
    assert isinstance(env.unwrapped, TokenEnv)
    assert any(isinstance(w, Autoreset) for w in _wrappers(env))
    tok = env.unwrapped.vector_env.tokenizer
    a = tok.convert_tokens_to_ids("a")
    env.reset(seed=0)
    env.step(a)
    _, reward, terminated, truncated, _ = env.step(a)
    assert (reward, terminated, truncated) == (2.0, False, True)
    assert env.render() == "abaa"
    # Next-step autoreset: the step after the end starts a new episode, reward 0.
    obs, reward, terminated, truncated, _ = env.step(a)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert env.render() == "ab" and obs["attention_mask"].sum() == 2


def _wrappers(env: gym.Env) -> list[gym.Env]:
    out = []
    while isinstance(env, gym.Wrapper):
        out.append(env)
        env = env.env
    return out


def test_a_custom_env_has_defaults_that_calls_override():
    env_id = register_reward_env(
        "CountA", FunctionReward(count_a), ["ab"], max_new_tokens=3, reward_mode="per_token"
    )
    assert TASKS[env_id].modes == ("per_token",)
    env = gym.make_vec(env_id, num_envs=2)
    assert (env.max_new_tokens, env.reward_mode) == (3, "per_token")
    env = gym.make_vec(env_id, num_envs=2, max_new_tokens=4, reward_mode="bandit")
    assert (env.max_new_tokens, env.reward_mode) == (4, "bandit")
    assert (
        gym.make_vec(register_reward_env("Plain", FunctionReward(count_a), ["ab"])).max_new_tokens
        == 16
    )


def test_unknown_options_are_refused_with_the_valid_ones():
    with pytest.raises(
        TypeError, match=r"unknown env option\(s\) \['colour'\]; .*EnvOptions: num_envs"
    ):
        register_reward_env("CountA", FunctionReward(count_a), ["ab"], colour="red")
    env_id = register_reward_env("CountA", FunctionReward(count_a), ["ab"])
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument 'colour'; valid: "):
        gym.make_vec(env_id, num_envs=1, colour="red")
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['colour'\]"):
        gym.make(env_id, colour="red")


def test_a_user_registers_a_reward_env_factory_with_gymnasium():
    factory = reward_env_factory(FunctionReward(count_a), ["ab"], max_new_tokens=2)
    gym.register(
        "mine/CountA-v1", entry_point=single_env_factory(factory), vector_entry_point=factory
    )
    tokenizer = make_char_tokenizer()
    env = gym.make_vec("mine/CountA-v1", num_envs=2, tokenizer=tokenizer, autoreset=True)
    assert env.tokenizer is tokenizer and env.autoreset and env.max_new_tokens == 2
    assert "per_token_form" in env_option_names("mine/CountA-v1")
    single = gym.make("mine/CountA-v1", device="cpu")
    single.reset(seed=0)
    assert single.step(np.int64(tokenizer.convert_tokens_to_ids("a")))[1] == 0.0


def test_task_factory_builds_a_task_from_a_body():
    @dataclass(frozen=True, kw_only=True)
    class EchoParams(TaskParams):
        word: str = "hi"

    @task_factory(EchoParams, max_new_tokens=2, reward_mode="per_token")
    def make_echo_vector(options: EnvOptions, params: EchoParams) -> TokenVectorEnv:
        """Echo ``word``."""
        word = params.word
        ids = torch.tensor([options.tokenizer.convert_tokens_to_ids(c) for c in word])
        reward = PositionMatchReward(ids[None], torch.tensor([len(word)]), "echo")
        return build_env(options, [f"say {word}:"], reward, max_new_tokens=99)

    assert list(make_echo_vector.arguments())[:4] == [
        "num_envs",
        "group_size",
        "num_prompts",
        "word",
    ]
    assert "Echo ``word``." in make_echo_vector.__doc__
    env = make_echo_vector(2, 2, word="ok")  # num_envs and group_size may be positional
    assert (env.num_envs, env.max_new_tokens, env.reward_mode) == (2, 2, "per_token")
    assert env.prompt_table.texts == ["say ok:"]
    assert make_echo_vector(max_new_tokens=None).max_new_tokens == 99  # the body's default
    with pytest.raises(TypeError, match=r"unknown env option\(s\) \['colour'\]"):
        task_factory(colour="red")
    assert make_echo_vector(params=EchoParams(word="no")).prompt_table.texts == ["say no:"]
    with pytest.raises(TypeError, match=r"parameters \['device'\] are EnvOptions fields"):

        @dataclass(frozen=True, kw_only=True)
        class BadParams(TaskParams):
            device: str = "cpu"

        @task_factory(BadParams)
        def make_bad_vector(options: EnvOptions, params: BadParams) -> TokenVectorEnv:
            raise AssertionError


def test_env_options_check_the_batch_split():
    assert EnvOptions(num_envs=8, group_size=4).num_prompts == 2
    with pytest.raises(ValueError, match="num_envs=6 is not a multiple of group_size=4"):
        EnvOptions(num_envs=6, group_size=4).num_prompts  # noqa: B018


@pytest.mark.parametrize("task", ["lmgym/Arithmetic-v0", "custom"])
def test_the_run_s_pair_reaches_the_env_as_given(task):
    if task == "custom":
        task = register_reward_env("PairCount", FunctionReward(count_a), ["ab", "ba", "aa"])
    env = gym.make_vec(task, num_prompts=3, group_size=4)
    assert (env.num_prompts, env.group_size, env.num_envs) == (3, 4, 12)
    assert gym.make_vec(task, num_envs=12, num_prompts=3, group_size=4).num_envs == 12
    with pytest.raises(TypeError, match=r"num_envs=8 but num_prompts=3 x group_size=4 = 12; "):
        gym.make_vec(task, num_envs=8, num_prompts=3, group_size=4)
    with pytest.raises(ValueError, match=r"num_prompts=0: must be a positive integer"):
        gym.make_vec(task, num_prompts=0, group_size=4)
    with pytest.raises(TypeError, match=r"got \['num_prompts'\]: a single env"):
        gym.make(task, num_prompts=2)
    assert batch_arguments(task, 3, 4) == {"num_prompts": 3, "group_size": 4}


def test_a_user_factory_without_num_prompts_gets_num_envs():
    def make(num_envs: int = 1, group_size: int = 1, tokenizer=None, device="cpu"):
        raise AssertionError("not built")

    gym.register("pairtest/Plain-v0", vector_entry_point=make)
    try:
        assert batch_arguments("pairtest/Plain-v0", 3, 4) == {"num_envs": 12, "group_size": 4}
    finally:
        del gym.registry["pairtest/Plain-v0"]


# ------------------------------------------------------------ the env's record
def test_the_env_takes_its_options_record_or_its_fields_as_keywords():
    tokenizer = make_char_tokenizer()
    reward = FunctionReward(count_a)
    record = EnvOptions(num_envs=8, group_size=4, max_new_tokens=3, reward_mode="per_token")
    env = TokenVectorEnv(tokenizer, ["ab", "c"], reward, record)
    keywords = TokenVectorEnv(
        tokenizer, ["ab", "c"], reward, num_prompts=2, group_size=4, max_new_tokens=3,
        reward_mode="per_token",
    )  # fmt: skip
    assert env.options == keywords.options
    assert (env.num_envs, env.num_prompts, env.group_size, env.reward_mode) == (
        8, 2, 4, "per_token",
    )  # fmt: skip
    # The env's record is complete: its tokenizer, budget and stop ids resolved.
    assert env.options.tokenizer is tokenizer and env.options.stop_token_ids == (1,)
    assert TokenVectorEnv(tokenizer, ["ab"], reward).max_new_tokens == 32
    # Keywords override the record; num_prompts stays when only group_size changes.
    assert TokenVectorEnv(tokenizer, ["ab"], reward, record, group_size=2).num_envs == 4


def test_the_env_refuses_options_it_cannot_use():
    tokenizer = make_char_tokenizer()
    reward = FunctionReward(count_a)
    with pytest.raises(TypeError, match=r"got unknown option\(s\) \['colour'\]"):
        TokenVectorEnv(tokenizer, ["ab"], reward, colour="red")
    with pytest.raises(TypeError, match="pass num_prompts or num_envs, not both"):
        TokenVectorEnv(tokenizer, ["ab"], reward, num_prompts=2, num_envs=2)
    with pytest.raises(ValueError, match="num_prompts=0: must be a positive integer"):
        TokenVectorEnv(tokenizer, ["ab"], reward, num_prompts=0)
    with pytest.raises(ValueError, match="tokenizer: the options carry a different tokenizer"):
        TokenVectorEnv(tokenizer, ["ab"], reward, EnvOptions(tokenizer=make_char_tokenizer()))


def test_env_options_check_every_value_when_made():
    for bad, message in (
        ({"reward_mode": "dense"}, r"reward_mode='dense' is not one of \['bandit', 'per_token'\]"),
        ({"render_mode": "human"}, r"render_mode='human' is not one of \['ansi'\]"),
        ({"prompt_order": "random"}, r"prompt_order='random' is not one of"),
        ({"group_size": 0}, "group_size=0: must be a positive integer"),
        ({"max_new_tokens": 0}, "max_new_tokens=0: must be a positive integer"),
        ({"shard": (2, 2)}, r"shard=\(2, 2\): expected \(rank, world_size\)"),
    ):
        with pytest.raises(ValueError, match=message):
            EnvOptions(**bad)
    record = EnvOptions(shard=[1, 2], device="cpu", unfinished_penalty=0)
    assert (record.shard, record.device, record.unfinished_penalty) == (
        (1, 2), torch.device("cpu"), 0.0,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"stop_token_ids=\[99\]: need at least one id"):
        EnvOptions(stop_token_ids=[99]).stop_ids()


def test_a_live_option_may_be_set_and_is_checked_a_built_one_may_not():
    env = TokenVectorEnv(make_char_tokenizer(), ["ab"], FunctionReward(count_a))
    env.unfinished_penalty = -2
    assert env.unfinished_penalty == -2.0 and env.options.unfinished_penalty == -2.0
    with pytest.raises(ValueError, match="unfinished='drop' is not one of"):
        env.unfinished = "drop"
    with pytest.raises(AttributeError, match="group_size: the env was built with it"):
        env.group_size = 2


def test_build_env_takes_the_tasks_budget_unless_the_options_set_one():
    tokenizer = make_char_tokenizer()
    reward = FunctionReward(count_a)
    options = EnvOptions(tokenizer=tokenizer)
    assert build_env(options, ["ab"], reward, max_new_tokens=5).max_new_tokens == 5
    assert (
        build_env(EnvOptions(max_new_tokens=7), ["ab"], reward, max_new_tokens=5).max_new_tokens
        == 7
    )
    assert build_env(options, ["ab"], reward).max_new_tokens == 32
