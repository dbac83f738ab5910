"""Env semantics checked as exact arrays, step by step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from lmgym.envs import FunctionReward, RewardError, TokenVectorEnv

PAD, EOS = 0, 1


def t(x, dtype=torch.long):
    return torch.tensor(x, dtype=dtype)


def test_termination_truncation_and_padding_step_by_step(make_env, ids):
    env = make_env(num_prompts=2, max_new_tokens=3, prompt_order="sequential")
    a, b = ids("a")[0], ids("b")[0]
    xyz, ab = ids("xyz"), ids("ab")
    obs, info = env.reset(seed=0)
    assert torch.equal(obs["input_ids"], t([[PAD, *ab, PAD, PAD, PAD], [*xyz, PAD, PAD, PAD]]))
    assert torch.equal(
        obs["attention_mask"], t([[0, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0]], torch.bool)
    )
    assert torch.equal(info["prompt_length"], t([2, 3]))

    obs, reward, term, trunc, info = env.step(t([a, EOS]))
    assert torch.equal(obs["input_ids"], t([[PAD, *ab, a, PAD, PAD], [*xyz, EOS, PAD, PAD]]))
    assert torch.equal(
        obs["attention_mask"], t([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]], torch.bool)
    )
    assert torch.equal(reward, t([0.0, 0.0], torch.float32))  # row 1 scored: "" has no 'a'
    assert torch.equal(term, t([False, True], torch.bool))
    assert torch.equal(trunc, t([False, False], torch.bool))

    # Row 1 is finished: its action is ignored, it stays padded, flags stay set.
    obs, reward, term, trunc, info = env.step(t([b, a]))
    assert torch.equal(obs["input_ids"], t([[PAD, *ab, a, b, PAD], [*xyz, EOS, PAD, PAD]]))
    assert torch.equal(reward, t([0.0, 0.0], torch.float32))
    assert torch.equal(term, t([False, True], torch.bool))
    assert torch.equal(info["length"], t([2, 1]))

    obs, reward, term, trunc, info = env.step(t([a, -5]))  # a dead row's action is not checked
    assert torch.equal(obs["input_ids"], t([[PAD, *ab, a, b, a], [*xyz, EOS, PAD, PAD]]))
    assert torch.equal(reward, t([2.0, 0.0], torch.float32))  # "aba" has two 'a'
    assert torch.equal(term, t([False, True], torch.bool))
    assert torch.equal(trunc, t([True, False], torch.bool))
    assert torch.equal(info["length"], t([3, 1]))


def test_any_configured_stop_id_terminates(make_env, ids):
    z = ids("z")[0]
    env = make_env(num_prompts=3, stop_token_ids=[EOS, z])
    env.reset(seed=0)
    _, _, term, trunc, _ = env.step(t([z, EOS, ids("q")[0]]))
    assert torch.equal(term, t([True, True, False], torch.bool))
    assert not trunc.any()


def test_groups_repeat_prompts_and_get_fresh_ids(make_env):
    env = make_env(prompts=["ab", "ab"], num_prompts=2, group_size=3, prompt_order="sequential")
    _, info = env.reset(seed=0)
    assert torch.equal(info["prompt_index"], t([0, 0, 0, 1, 1, 1]))
    # Identical prompt text, still two groups: groups come from a counter, not from text.
    assert torch.equal(info["group_id"], t([0, 0, 0, 1, 1, 1]))
    _, info = env.reset()
    assert torch.equal(info["group_id"], t([2, 2, 2, 3, 3, 3]))
    _, info = env.reset(seed=0)
    assert torch.equal(info["group_id"], t([0, 0, 0, 1, 1, 1]))


def test_shuffled_prompt_order_is_reproducible_and_covers_every_prompt(make_env):
    prompts = [f"p{i}" for i in range(10)]
    env = make_env(prompts=prompts, num_prompts=5)
    drawn = [env.reset(seed=3)[1]["prompt_index"], env.reset()[1]["prompt_index"]]
    assert sorted(torch.cat(drawn).tolist()) == list(range(10))  # one full pass
    again = [env.reset(seed=3)[1]["prompt_index"], env.reset()[1]["prompt_index"]]
    assert all(torch.equal(x, y) for x, y in zip(drawn, again, strict=True))


def test_reset_mask_restarts_only_masked_rows(make_env, ids):
    env = make_env(num_prompts=2, prompt_order="sequential")
    env.reset(seed=0)
    obs, *_ = env.step(t([ids("a")[0], EOS]))
    before = obs["input_ids"].clone()
    obs, info = env.reset(options={"reset_mask": t([False, True], torch.bool)})
    assert torch.equal(obs["input_ids"][0], before[0])
    assert torch.equal(info["length"], t([1, 0]))
    assert torch.equal(info["group_id"], t([0, 2]))


def test_next_step_autoreset_refills_only_finished_rows(make_env, ids):
    env = make_env(num_prompts=2, max_new_tokens=3, autoreset=True, prompt_order="sequential")
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    a, b = ids("a")[0], ids("b")[0]
    xyz, ab = ids("xyz"), ids("ab")
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step(t([a, EOS]))
    assert torch.equal(term, t([False, True], torch.bool))
    assert torch.equal(obs["input_ids"], t([[PAD, *ab, a, PAD, PAD], [*xyz, EOS, PAD, PAD]]))

    # Next step: row 1 restarts on the next prompt slot (its action is ignored); row 0 goes on.
    obs, reward, term, trunc, info = env.step(t([b, a]))
    assert torch.equal(obs["input_ids"], t([[PAD, *ab, a, b, PAD], [PAD, *ab, PAD, PAD, PAD]]))
    assert torch.equal(obs["attention_mask"][1], t([0, 1, 1, 0, 0, 0], torch.bool))
    assert torch.equal(reward, t([0.0, 0.0], torch.float32))
    assert not term.any() and not trunc.any()  # flags are per step in this mode
    assert torch.equal(info["group_id"], t([0, 2]))
    assert torch.equal(info["length"], t([2, 0]))

    obs, reward, term, trunc, info = env.step(t([a, b]))
    assert torch.equal(trunc, t([True, False], torch.bool))
    assert torch.equal(reward, t([2.0, 0.0], torch.float32))
    assert torch.equal(obs["input_ids"][1], t([PAD, *ab, b, PAD, PAD]))


def test_autoreset_hands_out_whole_groups(make_env):
    env = make_env(prompts=["ab"], num_prompts=2, group_size=2, autoreset=True)
    env.reset(seed=0)
    env.step(t([EOS, 3, 3, 3]))
    _, _, _, _, info = env.step(t([3, 3, 3, 3]))
    # Row 0 restarts with slot 4 -> group 2 (slots 4 and 5 form group 2).
    assert torch.equal(info["group_id"], t([2, 0, 1, 1]))


def test_per_token_potential_rewards_sum_to_the_bandit_score(make_env, policy):
    from lmgym.rollout import collect

    kw = dict(prompts=["ab", "xy"], num_prompts=2, group_size=4, max_new_tokens=6)
    bandit = collect(make_env(**kw), policy, seed=1)
    per_token = collect(make_env(reward_mode="per_token", **kw), policy, seed=1)
    assert torch.equal(bandit.completion_ids, per_token.completion_ids)
    torch.testing.assert_close(per_token.rewards.sum(1), bandit.scores)
    # Bandit: nonzero only at the last token.
    last = bandit.dones
    assert torch.equal(bandit.rewards * ~last, torch.zeros_like(bandit.rewards))
    # Potential of count('a'): each step's reward is 1 exactly where an 'a' was appended.
    a = 3
    expected = ((per_token.completion_ids == a) & per_token.completion_mask).float()
    assert torch.equal(per_token.rewards, expected)


def test_centred_potential_telescopes_to_score_minus_empty_score(make_env, policy):
    from lmgym.rollout import collect

    plus_one = FunctionReward(lambda p, c: [c.count("a") + 1.0 for c in c], name="plus_one")
    kw = dict(prompts=["ab"], num_prompts=1, group_size=6, max_new_tokens=5, reward=plus_one)
    bandit = collect(make_env(**kw), policy, seed=2)
    centred = collect(
        make_env(reward_mode="per_token", center_potential=True, **kw), policy, seed=2
    )
    torch.testing.assert_close(centred.rewards.sum(1), bandit.scores - 1.0)


def test_dense_per_token_form_returns_the_prefix_score(make_env, ids):
    env = make_env(num_prompts=1, reward_mode="per_token", per_token_form="dense")
    env.reset(seed=0)
    a, b = ids("a")[0], ids("b")[0]
    rewards = [env.step(t([x]))[1].item() for x in (a, b, a)]
    assert rewards == [1.0, 1.0, 2.0]


@pytest.mark.parametrize("mode", ["bandit", "per_token"])
def test_unfinished_penalty_makes_the_return_exactly_the_penalty(make_env, ids, mode):
    env = make_env(
        num_prompts=2,
        max_new_tokens=2,
        unfinished="penalty",
        unfinished_penalty=-3.0,
        reward_mode=mode,
    )
    env.reset(seed=0)
    a = ids("a")[0]
    r1 = env.step(t([a, a]))[1]
    r2, term, trunc = env.step(t([a, EOS]))[1:4]
    assert torch.equal(trunc, t([True, False], torch.bool))
    assert (r1 + r2)[0].item() == -3.0  # cut off: penalty, whatever the text
    assert (r1 + r2)[1].item() == 1.0  # finished with EOS: the real score


def test_unfinished_mask_flags_the_row_invalid(make_env, ids):
    env = make_env(num_prompts=2, max_new_tokens=1, unfinished="mask")
    env.reset(seed=0)
    *_, info = env.step(t([ids("a")[0], EOS]))
    assert torch.equal(info["valid"], t([False, True], torch.bool))


def test_registered_task_has_both_faces():
    import lmgym  # noqa: F401  (registers the tasks)

    vec = gym.make_vec("lmgym/TargetString-v0", num_envs=8, group_size=4)
    assert isinstance(vec, TokenVectorEnv) and vec.num_envs == 8 and vec.group_size == 4
    assert vec.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    single = gym.make("lmgym/TargetString-v0")
    obs, _ = single.reset(seed=0)
    assert obs["input_ids"].dtype.name == "int64" and single.observation_space.contains(obs)


def test_target_string_reward(ids):
    from lmgym.envs.tasks.target_string import make_target_string_vector

    env = make_target_string_vector(num_envs=3, target="abc", max_new_tokens=4)
    env.reset(seed=0)
    x = ids("x")[0]
    for step in ("axb", "bbc", "cxc"):
        env.step(t(ids(step)))
    # completions: "abc", "xbx", "bcc": 3/3, 1/3 (b in place), 1/3 (c in place)
    _, reward, _, trunc, _ = env.step(t([x, x, x]))
    assert torch.allclose(reward, t([1.0, 1 / 3, 1 / 3], torch.float32))
    assert trunc.all()


# ------------------------------------------------------------------ bad input
def test_out_of_range_action_names_the_row_and_changes_nothing(make_env):
    env = make_env(num_prompts=2)
    obs, _ = env.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions\[1\]=999 is outside the vocabulary"):
        env.step(t([3, 999]))
    with pytest.raises(ValueError, match=r"actions: expected shape \(2,\)"):
        env.step(t([3]))
    with pytest.raises(ValueError, match="integer token ids"):
        env.step(torch.tensor([3.0, 4.0]))
    assert torch.equal(env._obs()["input_ids"], obs["input_ids"])


@pytest.mark.parametrize(
    "actions",
    [
        pytest.param(torch.tensor([3.7, 4.0]), id="float tensor"),
        pytest.param(np.array([3.0, 4.0]), id="float array"),
        pytest.param(torch.tensor([True, False]), id="bool tensor"),
        pytest.param(np.array([True, True]), id="bool array"),
        pytest.param([3.7, 4], id="list with a float"),
        pytest.param([3, True], id="list with a bool"),
        pytest.param([np.float64(3.0), 4], id="list with a numpy float"),
    ],
)
def test_non_integer_actions_are_refused(make_env, actions):
    env = make_env(num_prompts=2)
    obs, _ = env.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions: expected integer token ids, got"):
        env.step(actions)
    assert torch.equal(env._obs()["input_ids"], obs["input_ids"])
    env.step(np.array([3, 4]))  # numpy int64, as SB3 passes, works
    env.step([3, np.int32(4)])


def test_single_env_refuses_floats_and_bools_and_takes_numpy_ints():
    import lmgym  # noqa: F401

    env = gym.make("lmgym/TargetString-v0")
    env.reset(seed=0)
    for bad in (3.7, 3.0, np.float32(3.0), True, np.bool_(False), np.array([4.0])):
        with pytest.raises(ValueError, match=r"action: expected an integer token id, got"):
            env.step(bad)
    assert env.unwrapped.vector_env._obs()["attention_mask"][0, -5:].sum() == 0  # nothing written
    for good in (3, np.int64(3), np.array(3), np.array([3], dtype=np.int32)):
        env.step(good)


def test_prompt_longer_than_max_prompt_length(make_env):
    with pytest.raises(
        ValueError, match=r"prompts\[1\] is 3 tokens, longer than max_prompt_length=2"
    ):
        make_env(prompts=["ab", "xyz"], max_prompt_length=2)


def test_empty_prompt_source_and_empty_prompt(make_env):
    with pytest.raises(ValueError, match="prompts: the prompt source is empty"):
        make_env(prompts=[])
    with pytest.raises(ValueError, match=r"prompts\[1\] \(''\) tokenises to zero tokens"):
        make_env(prompts=["a", ""])


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ([float("nan")], r"reward 'bad' returned nan for row 0 \(prompt='ab', completion=''\)"),
        ([float("inf")], r"returned inf for row 0"),
        ([1.0, 2.0], r"reward 'bad' returned 2 values for 1 completions"),
        (["high"], r"reward 'bad' returned list that is not a sequence of numbers"),
    ],
)
def test_unusable_reward_output_raises_and_leaves_env_usable(make_env, output, message):
    calls = {"n": 0}

    def bad(prompts, completions):
        calls["n"] += 1
        return output if calls["n"] == 1 else [0.5] * len(completions)

    env = make_env(prompts=["ab"], reward=FunctionReward(bad, name="bad"))
    obs, _ = env.reset(seed=0)
    with pytest.raises(RewardError, match=message):
        env.step(t([EOS]))
    assert torch.equal(env._obs()["input_ids"], obs["input_ids"])  # state untouched
    _, reward, term, _, _ = env.step(t([EOS]))  # and the env still works
    assert reward.item() == 0.5 and term.item()


def test_bad_configuration_names_the_field(make_env):
    with pytest.raises(ValueError, match="reward_mode='dense' is not one of"):
        make_env(reward_mode="dense")
    with pytest.raises(ValueError, match="unfinished='drop' is not one of"):
        make_env(unfinished="drop")
    with pytest.raises(ValueError, match="group_size=0: must be a positive integer"):
        make_env(group_size=0)
    with pytest.raises(ValueError, match=r"stop_token_ids=\[500\]"):
        make_env(stop_token_ids=[500])
    with pytest.raises(TypeError, match="wrap a plain function with FunctionReward"):
        make_env(reward=42)
    with pytest.raises(RuntimeError, match="before reset"):
        make_env().step(t([1]))


def test_make_vec_num_envs_must_be_a_multiple_of_group_size():
    import lmgym  # noqa: F401

    with pytest.raises(ValueError, match="num_envs=6 is not a multiple of group_size=4"):
        gym.make_vec("lmgym/TargetString-v0", num_envs=6, group_size=4)


# ------------------------------------------------------------------ render
def test_ansi_render_is_each_rows_current_text(make_env, ids):
    env = make_env(
        prompts=["ab", "xyz"], num_prompts=2, render_mode="ansi", prompt_order="sequential"
    )
    assert env.metadata["render_modes"] == ["ansi"] and env.render_mode == "ansi"
    with pytest.raises(RuntimeError, match=r"render\(\) called before reset\(\)"):
        env.render()
    env.reset(seed=0)
    assert env.render() == ("ab", "xyz")
    env.step(torch.tensor(ids("qa")))
    env.step(torch.tensor([ids("c")[0], 1]))  # row 1 stops: its EOS is not text
    assert env.render() == ("abqc", "xyza")


def test_render_without_a_mode_warns_and_a_bad_mode_is_refused(make_env):
    env = make_env()
    env.reset(seed=0)
    with pytest.warns(
        UserWarning,
        match=r'render\(\) called without a render mode; build the env with render_mode="ansi"',
    ):
        assert env.render() is None
    with pytest.raises(ValueError, match=r"render_mode='human' is not one of \['ansi'\]"):
        make_env(render_mode="human")


def test_make_vec_and_make_render_the_text():
    vec = gym.make_vec("lmgym/TargetString-v0", num_envs=2, render_mode="ansi")
    vec.reset(seed=0)
    assert vec.render() == ("say hello:", "say hello:")
    single = gym.make("lmgym/TargetString-v0", render_mode="ansi")
    single.reset(seed=0)
    h = single.unwrapped.vector_env.tokenizer.convert_tokens_to_ids("h")
    single.step(h)
    assert single.render() == "say hello:h"
