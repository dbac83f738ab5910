"""Multi-turn ``TokenVectorEnv``: buffers, policy mask, turn rewards and ends, checked
step by step against closed forms; the responder under the transactional promise."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env as gymnasium_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from testkit import assert_same, snapshot
from torch.testing import assert_close

from lmgym.envs import EnvOptions, FunctionReward, TokenEnv, TokenVectorEnv
from lmgym.envs.task_factory import build_env
from lmgym.envs.turns import ResponderError

EOS, PAD = 1, 0


def region(env: TokenVectorEnv, key: str = "input_ids") -> torch.Tensor:
    """The completion region ``[N, L]`` of the current observation."""
    obs = env._obs()
    return obs[key][:, env.prompt_width :]


def padded(row: list[int], width: int, fill: int = PAD) -> list[int]:
    return row + [fill] * (width - len(row))


def test_turns_interleave_in_the_buffer_with_a_policy_mask_turn_rewards_and_ends(
    scripted, make_turn_env, ids
):
    responder = scripted()
    env = make_turn_env(num_prompts=2, prompt_order="sequential", responder=responder)
    obs, info = env.reset(seed=0)
    assert set(obs) == {"input_ids", "attention_mask", "policy_mask"}
    assert not obs["policy_mask"].any() and info["turn"].tolist() == [0, 0]
    c, d, e, a = (ids(x)[0] for x in "cdea")
    # row 0: "c" | obs "+c" | "dd" (done)   row 1: "ee" | obs "+ee" | "" (done)
    script = [[c, e], [EOS, e], [d, EOS], [d, EOS], [EOS, a]]
    rewards, terminated, truncated, turns, lengths = [], [], [], [], []
    for actions in script:
        obs, r, te, tr, info = env.step(torch.tensor(actions))
        rewards.append(r.tolist())
        terminated.append(te.tolist())
        truncated.append(tr.tolist())
        turns.append(info["turn"].tolist())
        lengths.append(info["length"].tolist())
        assert info["policy_mask"] is obs["policy_mask"]
    assert_close(
        torch.tensor(rewards),
        torch.tensor([[0, 0], [1.1, 0], [0, 2.1], [0, 0.2], [2.2, 0]]),
    )
    assert terminated == [[False, False]] * 3 + [[False, True], [True, True]]
    assert truncated == [[False, False]] * 5
    assert turns == [[0, 0], [1, 0], [1, 1], [1, 2], [2, 2]]
    assert lengths == [[1, 1], [4, 2], [5, 6], [6, 7], [7, 7]]
    plus = ids("+")[0]
    assert region(env).tolist() == [
        padded([c, EOS, plus, c, d, d, EOS], 16),
        padded([e, e, EOS, plus, e, e, EOS], 16),
    ]
    assert region(env, "attention_mask").sum(1).tolist() == [7, 7]
    assert region(env, "policy_mask").int().tolist() == [
        padded([1, 1, 0, 0, 1, 1, 1], 16, 0),
        padded([1, 1, 1, 0, 0, 0, 1], 16, 0),
    ]
    assert not obs["policy_mask"][:, : env.prompt_width].any()
    # One batched call per step that ended a turn, on exactly those rows; the responder
    # sees the turn's text without the final EOS, its ids with it.
    calls = responder.responded()
    assert [t.rows.tolist() for t in calls] == [[0], [1], [1], [0]]
    assert [t.turn_texts for t in calls] == [["c"], ["ee"], [""], ["dd"]]
    assert [[x.tolist() for x in t.turn_ids] for t in calls] == [
        [[c, EOS]], [[e, e, EOS]], [[EOS]], [[d, d, EOS]]
    ]  # fmt: skip
    assert [t.turn_index.tolist() for t in calls] == [[1], [1], [2], [2]]


def test_rows_that_end_a_turn_together_are_answered_in_one_call(scripted, make_turn_env, ids):
    responder = scripted(done_at=3)
    env = make_turn_env(num_prompts=3, prompts=["ab", "xyz", "q"], responder=responder)
    env.reset(seed=1)
    c = ids("c")[0]
    env.step(torch.tensor([c, c, c]))
    env.step(torch.tensor([EOS, c, EOS]))
    env.step(torch.tensor([EOS, EOS, c]))
    assert [t.rows.tolist() for t in responder.responded()] == [[0, 2], [0, 1]]
    first = responder.responded()[0]
    assert first.turn_texts == ["c", "c"] and first.turn_index.tolist() == [1, 1]


def test_the_observation_space_gains_a_policy_mask_only_with_a_responder(make_turn_env, make_env):
    single = make_env()
    assert set(single.single_observation_space.spaces) == {"input_ids", "attention_mask"}
    obs, info = single.reset(seed=0)
    assert set(obs) == {"input_ids", "attention_mask"} and "turn" not in info
    env = make_turn_env()
    space = env.single_observation_space["policy_mask"]
    assert isinstance(space, spaces.MultiBinary) and space.shape == (env.seq_len,)
    assert env.observation_space["policy_mask"].shape == (env.num_envs, env.seq_len)
    obs, _ = env.reset(seed=0)
    row = {k: v[0].numpy().astype(env.single_observation_space[k].dtype) for k, v in obs.items()}
    assert env.single_observation_space.contains(row)


def test_max_turns_truncates_the_episode_after_its_last_turn_is_rewarded(
    scripted, make_turn_env, ids
):
    env = make_turn_env(num_prompts=1, max_turns=2, responder=scripted(done_at=5))
    env.reset(seed=0)
    c = ids("c")[0]
    steps = [env.step(torch.tensor([a])) for a in (c, EOS, c, EOS)]
    (_, r2, te2, tr2, _), (_, r4, te4, tr4, info) = steps[1], steps[3]
    assert (r2.item(), te2.item(), tr2.item()) == (pytest.approx(1.1), False, False)
    assert (r4.item(), te4.item(), tr4.item()) == (pytest.approx(1.2), False, True)
    # Nothing appended after the last turn: "c" EOS "+c" "c" EOS.
    assert info["length"].item() == 6 and info["turn"].item() == 2
    assert region(env, "attention_mask").sum().item() == 6


def test_the_responder_ending_the_last_allowed_turn_terminates(scripted, make_turn_env, ids):
    env = make_turn_env(num_prompts=1, max_turns=2, responder=scripted(done_at=2))
    env.reset(seed=0)
    for a in (ids("c")[0], EOS, EOS):
        _, _, terminated, truncated, _ = env.step(torch.tensor([a]))
    assert (terminated.item(), truncated.item()) == (True, False)


@pytest.mark.parametrize(
    ("budget", "goes_on"),
    [(7, False), (8, True)],  # "c" EOS, then "+" x5: needs 2 + 5 + 1 policy token = 8
)
def test_an_observation_is_appended_only_if_one_more_policy_token_fits(
    scripted, make_turn_env, ids, budget, goes_on
):
    responder = scripted(done_at=5, reply=lambda text, turn: "+" * 5)
    env = make_turn_env(num_prompts=1, max_new_tokens=budget, responder=responder)
    env.reset(seed=0)
    c = ids("c")[0]
    env.step(torch.tensor([c]))
    _, reward, terminated, truncated, info = env.step(torch.tensor([EOS]))
    assert reward.item() == pytest.approx(1.1) and not terminated.item()
    assert truncated.item() == (not goes_on)
    if not goes_on:  # cleanly: nothing of the observation was written
        assert info["length"].item() == 2
        assert region(env).tolist()[0] == padded([c, EOS], budget)
        return
    assert info["length"].item() == 7
    _, _, terminated, truncated, info = env.step(torch.tensor([c]))  # the last token
    assert truncated.item() and not terminated.item() and info["length"].item() == 8
    assert region(env, "policy_mask").int().tolist()[0] == [1, 1, 0, 0, 0, 0, 0, 1]


@pytest.mark.parametrize("done", [True, False])
def test_a_turn_ending_on_the_last_budget_token_is_still_answered(
    scripted, make_turn_env, ids, done
):
    responder = scripted(done_at=1 if done else 5)
    env = make_turn_env(num_prompts=1, max_new_tokens=2, responder=responder)
    env.reset(seed=0)
    env.step(torch.tensor([ids("c")[0]]))
    _, reward, terminated, truncated, _ = env.step(torch.tensor([EOS]))
    assert len(responder.responded()) == 1 and reward.item() == pytest.approx(1.1)
    assert (terminated.item(), truncated.item()) == (done, not done)


def test_a_turn_cut_by_the_budget_is_not_answered(scripted, make_turn_env, ids):
    responder = scripted()
    env = make_turn_env(num_prompts=1, max_new_tokens=3, responder=responder)
    env.reset(seed=0)
    c = ids("c")[0]
    for _ in range(3):
        _, reward, terminated, truncated, _ = env.step(torch.tensor([c]))
    assert truncated.item() and not terminated.item() and reward.item() == 0.0
    assert responder.responded() == []


def test_token_id_observations_are_appended_as_given(scripted, make_turn_env, ids, tokenizer):
    unk = tokenizer.unk_token_id
    observation = [unk, PAD, ids("z")[0]]  # any vocabulary id, special ones included
    env = make_turn_env(num_prompts=1, responder=scripted(reply=lambda text, turn: observation))
    env.reset(seed=0)
    c = ids("c")[0]
    env.step(torch.tensor([c]))
    env.step(torch.tensor([EOS]))
    assert region(env).tolist()[0][:5] == [c, EOS, *observation]
    assert region(env, "attention_mask").int().tolist()[0][:6] == [1, 1, 1, 1, 1, 0]
    assert region(env, "policy_mask").int().tolist()[0][:5] == [1, 1, 0, 0, 0]


def test_a_reward_model_scores_the_whole_episode_once_at_its_end(make_turn_env, ids):
    seen = []

    def score(prompts, completions):
        seen.append(list(completions))
        return [10.0 * len(c) for c in completions]

    env = make_turn_env(num_prompts=1, reward=FunctionReward(score))
    env.reset(seed=0)
    c = ids("c")[0]
    rewards = [env.step(torch.tensor([a]))[1].item() for a in (c, EOS, c, EOS)]
    # The whole region, the environment's "+c" included, decoded as a reward sees it.
    assert seen == [["c<eos>+cc"]]
    assert rewards == pytest.approx([0.0, 1.1, 0.0, 1.2 + 10.0 * len("c<eos>+cc")])


def test_turn_rewards_count_in_the_unfinished_penalty(scripted, make_turn_env, ids):
    env = make_turn_env(
        num_prompts=1, max_turns=2, unfinished="penalty", responder=scripted(done_at=5)
    )
    env.reset(seed=0)
    c = ids("c")[0]
    rewards = [env.step(torch.tensor([a]))[1].item() for a in (c, EOS, c, EOS)]
    assert sum(rewards) == pytest.approx(-1.0) and rewards[1] == pytest.approx(1.1)


def test_bad_multi_turn_options_are_refused_with_the_fix(
    scripted, make_turn_env, make_env, tokenizer
):
    with pytest.raises(ValueError, match=r"max_turns=0: must be a positive integer"):
        EnvOptions(max_turns=0)
    with pytest.raises(ValueError, match=r"max_turns=2: only a multi-turn env has turns"):
        make_env(max_turns=2)
    with pytest.raises(ValueError, match=r"reward_mode='per_token': a multi-turn env"):
        make_turn_env(reward_mode="per_token")
    with pytest.raises(TypeError, match=r"reward: expected a RewardModel .* got NoneType"):
        TokenVectorEnv(tokenizer, ["ab"], None)
    with pytest.raises(TypeError, match=r"responder: expected a Responder"):
        make_turn_env(responder=object())
    with pytest.raises(ValueError, match=r"role='system'; use 'user'"):
        make_turn_env(responder=scripted(role="system"))


def test_build_env_passes_the_responder_through(scripted, tokenizer):
    responder = scripted()
    options = EnvOptions(tokenizer=tokenizer, max_turns=3)
    env = build_env(options, ["ab"], None, responder=responder, max_new_tokens=9)
    assert env.responder is responder and env.max_turns == 3 and env.max_new_tokens == 9


# ------------------------------------------------------------- transactional
def env_state(env: TokenVectorEnv) -> dict:
    state = {name: snapshot(value) for name, value in env._rows._asdict().items()}
    state["turn_states"] = list(env._turn_states)
    state["stream"] = snapshot(env.get_state())
    return state


def turn_script(ids) -> list[tuple]:
    """Resets and steps that end turns and episodes at different times and refill rows."""
    c, d = ids("c")[0], ids("d")[0]
    t = torch.tensor
    return [
        ("reset", {"seed": 3}),
        ("step", t([c, EOS, d, c])),
        ("step", t([EOS, c, EOS, c])),
        ("step", t([c, EOS, c, EOS])),
        ("reset", {"options": {"reset_mask": t([True, False, False, True])}}),
        ("step", t([EOS, d, EOS, EOS])),
        ("step", t([EOS, c, c, EOS])),
        ("step", t([c, EOS, EOS, c])),
    ]


def run(env, op):
    kind, arg = op
    return snapshot(env.reset(**arg) if kind == "reset" else env.step(arg))


@pytest.mark.parametrize("autoreset", [False, True])
@pytest.mark.parametrize("fail", ["raise", "count", "nan", "text", "none", "vocab"])
def test_a_failing_responder_leaves_the_env_as_it_was_and_names_the_row(
    scripted, make_turn_env, ids, fail, autoreset
):
    kw = dict(
        prompts=["ab", "xyz", "q"], num_prompts=2, group_size=2, max_new_tokens=9,
        autoreset=autoreset, max_turns=3,
    )  # fmt: skip
    reference = make_turn_env(responder=scripted(), **kw)
    expected = [(run(reference, op), env_state(reference)) for op in turn_script(ids)]
    total = len(reference.responder.calls)
    assert total >= 6 and sum(kind == "respond" for kind, _ in reference.responder.calls) >= 4
    respond_calls = [
        i + 1 for i, (kind, _) in enumerate(reference.responder.calls) if kind == "respond"
    ]
    fail_calls = range(1, total + 1) if fail in ("raise", "count") else respond_calls
    for fail_at in fail_calls:
        responder = scripted(fail=fail, fail_at=fail_at)
        env = make_turn_env(responder=responder, **kw)
        before = env_state(env) if env._rows is not None else None
        failed = 0
        for i, op in enumerate(turn_script(ids)):
            where = f"fail_at={fail_at}, op {i} {op[0]}"
            try:
                out = run(env, op)
            except ResponderError as err:
                failed += 1
                message = str(err)
                assert "responder 'scripted'" in message, message
                assert "env row" in message, message
                if before is not None:
                    assert_same(env_state(env), before, f"{where}: state after the failure")
                responder.fail = None  # the retry succeeds
                out = run(env, op)
            assert_same(out, expected[i][0], f"{where}: returned values")
            before = env_state(env)
            assert_same(before, expected[i][1], f"{where}: state")
        assert failed == 1, fail_at


@pytest.mark.parametrize(
    ("fail", "message"),
    [
        (
            "raise",
            r"respond\(\) raised RuntimeError: game server down \(answering env rows \[0\]\)",
        ),
        ("count", r"respond\(\) answered 0 observations for 1 rows \(env rows \[0\]\)"),
        ("nan", r"gave env row 0 the reward nan; a turn reward must be a finite number"),
        ("text", r"gave env row 0 the reward '1'; a turn reward must be a finite number"),
        ("none", r"the observation for env row 0 is None but its episode is not over"),
        ("vocab", r"env row 0 holds 1000000, not a token id in \[0, 49\)"),
    ],
)
def test_responder_errors_name_the_responder_the_row_and_the_fix(
    scripted, make_turn_env, ids, fail, message
):
    env = make_turn_env(num_prompts=1, responder=scripted(fail=fail))
    if fail in ("raise", "count"):
        with pytest.raises(ResponderError, match=r"responder 'scripted': start\(\)"):
            env.reset(seed=0)
        env.responder.fail = None
        env.reset(seed=0)
        env.responder.fail = fail
    else:
        env.reset(seed=0)
    env.step(torch.tensor([ids("c")[0]]))
    with pytest.raises(ResponderError, match=rf"responder 'scripted': .*{message}"):
        env.step(torch.tensor([EOS]))


# ---------------------------------------------------------- autoreset, groups
def test_autoreset_refills_a_finished_row_with_a_fresh_episode_next_step(
    scripted, make_turn_env, ids
):
    responder = scripted(done_at=1)
    env = make_turn_env(
        prompts=["ab", "xyz", "q"], num_prompts=2, autoreset=True, prompt_order="sequential",
        responder=responder,
    )  # fmt: skip
    env.reset(seed=0)
    assert responder.started() == [["ab", "xyz"]]
    c = ids("c")[0]
    _, _, terminated, _, info = env.step(torch.tensor([EOS, c]))
    assert terminated.tolist() == [True, False] and info["turn"].tolist() == [1, 0]
    # Next step: row 0's action is ignored, it restarts on the next prompt with no turns.
    obs, reward, terminated, truncated, info = env.step(torch.tensor([c, c]))
    assert responder.started() == [["ab", "xyz"], ["q"]]
    assert not terminated.any() and not truncated.any() and reward.tolist() == [0.0, 0.0]
    assert info["turn"].tolist() == [0, 0] and info["length"].tolist() == [0, 2]
    assert not obs["policy_mask"][0].any() and info["prompt_index"].tolist() == [2, 1]
    # Its responder state is the new episode's.
    env.step(torch.tensor([EOS, EOS]))
    assert responder.responded()[-1].states == [("q", 0), ("xyz", 0)]


def test_a_group_shares_its_game_and_sees_the_same_answers(scripted, make_turn_env, ids):
    responder = scripted(done_at=3)
    env = make_turn_env(prompts=["ab", "xyz"], num_prompts=2, group_size=2, responder=responder)
    _, info = env.reset(seed=0)
    (prompts,) = responder.started()
    assert prompts[0] == prompts[1] and prompts[2] == prompts[3] and prompts[0] != prompts[2]
    c = ids("c")[0]
    env.step(torch.tensor([c, c, c, c]))
    env.step(torch.tensor([EOS, EOS, EOS, EOS]))
    buffer = env._obs()["input_ids"]
    assert torch.equal(buffer[0], buffer[1]) and torch.equal(buffer[2], buffer[3])
    assert info["group_id"].tolist()[0] == info["group_id"].tolist()[1]


def test_sharded_multi_turn_envs_start_their_share_of_the_stream(scripted, make_turn_env, make_env):
    prompts = [f"p{i}" for i in range(6)]
    for rank in range(2):
        responder = scripted()
        env = make_turn_env(prompts=prompts, num_prompts=2, shard=(rank, 2), responder=responder)
        plain = make_env(prompts=prompts, num_prompts=2, shard=(rank, 2))
        _, info = env.reset(seed=5)
        _, plain_info = plain.reset(seed=5)
        assert torch.equal(info["prompt_index"], plain_info["prompt_index"])
        assert responder.started() == [[prompts[i] for i in info["prompt_index"].tolist()]]


def test_render_shows_the_whole_conversation(make_turn_env, ids):
    env = make_turn_env(num_prompts=1, prompts=["ab"], render_mode="ansi")
    env.reset(seed=0)
    for a in (ids("c")[0], EOS, ids("d")[0]):
        env.step(torch.tensor([a]))
    assert env.render() == ("abc<eos>+cd",)


# ------------------------------------------------------------------ checkers
def single_turn_env(tokenizer, scripted) -> TokenEnv:
    return TokenEnv(
        TokenVectorEnv(
            tokenizer, ["ab", "xyz"], None, responder=scripted(done_at=3), max_new_tokens=12,
            render_mode="ansi",
        )
    )  # fmt: skip


def test_the_single_multi_turn_env_passes_both_checkers(scripted, tokenizer):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gymnasium_check_env(single_turn_env(tokenizer, scripted), skip_render_check=True)
        sb3_check_env(single_turn_env(tokenizer, scripted), warn=True)
    assert [str(w.message) for w in caught] == []


def test_the_single_multi_turn_env_reports_policy_mask_and_turn(scripted, tokenizer, ids):
    env = single_turn_env(tokenizer, scripted)
    obs, info = env.reset(seed=0)
    for a in (ids("c")[0], EOS):
        obs, reward, terminated, truncated, info = env.step(a)
    assert env.observation_space.contains(obs)
    assert info["turn"] == 1 and isinstance(info["policy_mask"], np.ndarray)
    assert np.array_equal(info["policy_mask"], obs["policy_mask"])
    assert reward == pytest.approx(1.1) and env.decode(obs) == "abc<eos>+c"


def test_the_sb3_adapter_passes_the_policy_mask_on_and_restarts_finished_games(
    scripted, make_turn_env, ids
):
    from stable_baselines3 import PPO

    from lmgym.integrations.sb3 import SB3VecEnv

    responder = scripted(done_at=1)
    vec = SB3VecEnv(make_turn_env(num_prompts=2, max_new_tokens=6, responder=responder))
    obs = vec.reset()
    assert obs["policy_mask"].dtype == np.int8
    single = vec.observation_space
    assert all(single.contains({k: v[i] for k, v in obs.items()}) for i in range(2))
    c = int(np.flatnonzero(vec.action_ids == ids("c")[0])[0])
    eos = int(np.flatnonzero(vec.action_ids == EOS)[0])
    vec.step(np.array([c, c]))
    obs, rewards, dones, infos = vec.step(np.array([eos, c]))
    assert dones.tolist() == [True, False] and rewards[0] == pytest.approx(1.1)
    final = infos[0]["terminal_observation"]["policy_mask"]
    assert final[-6:].tolist() == [1, 1, 0, 0, 0, 0]  # "c" EOS, the game over
    assert not obs["policy_mask"][0].any() and len(responder.started()) == 2
    PPO("MultiInputPolicy", vec, n_steps=8, batch_size=8, n_epochs=1, seed=0).learn(16)


def test_the_observation_of_a_finished_episode_is_neither_checked_nor_appended(
    scripted, make_turn_env, ids
):
    # A finished row's observation is unused: even one that is no observation at all.
    responder = scripted(done_at=1, reply=lambda text, turn: [10**6])
    env = make_turn_env(num_prompts=1, responder=responder)
    env.reset(seed=0)
    env.step(torch.tensor([ids("c")[0]]))
    _, reward, terminated, _, info = env.step(torch.tensor([EOS]))
    assert terminated.item() and reward.item() == pytest.approx(1.1)
    assert info["length"].item() == 2


def test_set_state_replays_the_same_games(scripted, make_turn_env):
    prompts = [f"p{i}" for i in range(5)]
    first = make_turn_env(prompts=prompts, num_prompts=2, responder=scripted())
    first.reset(seed=4)
    saved = first.get_state()
    first.reset()
    second = make_turn_env(prompts=prompts, num_prompts=2, responder=scripted())
    second.set_state(saved)
    second.reset()
    assert first.responder.started()[-1] == second.responder.started()[-1]
