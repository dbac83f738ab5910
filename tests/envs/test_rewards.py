"""Reward adapters: functions (batched / per-sample, sync / async, floats / tensors),
per-token scorers, combined rewards with separately logged components, bad output,
and custom envs registered with ``register_reward_env``."""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from lmgym.envs import (
    TASKS,
    CombinedReward,
    FunctionReward,
    RewardError,
    TokenEnv,
    TokenScoreReward,
    TokenVectorEnv,
    register_reward_env,
    reward_component_means,
)

EOS = 1


def t(x, dtype=torch.long):
    return torch.tensor(x, dtype=dtype)


def finish(env, ids, texts: list[str]):
    """Reset and play one completion per row (its characters then EOS); return the
    summed rewards ``[N]``."""
    env.reset(seed=0)
    seqs = [ids(text) + [EOS] for text in texts]
    total = torch.zeros(env.num_envs)
    for step in range(max(map(len, seqs))):
        _, reward, *_ = env.step(t([s[min(step, len(s) - 1)] for s in seqs]))
        total += reward
    return total


def length(prompt: str, completion: str) -> float:
    return float(len(completion))


# ------------------------------------------------------------------ functions
@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda p, c: float(len(c)), id="float"),
        pytest.param(lambda p, c: torch.tensor(float(len(c))), id="0-d tensor"),
        pytest.param(lambda p, c: np.float32(len(c)), id="numpy scalar"),
        pytest.param(lambda p, c: len(c), id="int"),
    ],
)
def test_per_sample_function_outputs(make_env, ids, fn):
    env = make_env(num_prompts=2, reward=FunctionReward(fn, batched=False))
    assert finish(env, ids, ["ab", "abc"]).tolist() == [2.0, 3.0]


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda ps, cs: [float(len(c)) for c in cs], id="list"),
        pytest.param(lambda ps, cs: torch.tensor([float(len(c)) for c in cs]), id="tensor"),
        pytest.param(lambda ps, cs: torch.tensor([[len(c)] for c in cs]), id="[N, 1] tensor"),
        pytest.param(lambda ps, cs: np.array([len(c) for c in cs]), id="numpy"),
    ],
)
def test_batched_function_outputs(make_env, ids, fn):
    env = make_env(num_prompts=2, reward=FunctionReward(fn))
    assert finish(env, ids, ["ab", "abc"]).tolist() == [2.0, 3.0]


def test_async_functions_batched_and_per_sample(make_env, ids):
    started: list[str] = []

    async def per_sample(prompt: str, completion: str) -> float:
        started.append(completion)
        await asyncio.sleep(0)
        return float(len(completion))

    async def batched(prompts: list[str], completions: list[str]) -> list[float]:
        await asyncio.sleep(0)
        return [10.0 * len(c) for c in completions]

    env = make_env(num_prompts=2, reward=FunctionReward(per_sample, batched=False))
    assert finish(env, ids, ["ab", "abc"]).tolist() == [2.0, 3.0]
    env = make_env(num_prompts=2, reward=FunctionReward(batched))
    assert finish(env, ids, ["ab", "abc"]).tolist() == [20.0, 30.0]

    # Inside a running event loop (a notebook, an async server) it still works.
    async def inside_a_loop():
        env = make_env(num_prompts=2, reward=FunctionReward(per_sample, batched=False))
        return finish(env, ids, ["a", "abcd"]).tolist()

    assert asyncio.run(inside_a_loop()) == [1.0, 4.0]


# ------------------------------------------------------------------ bad input
def boom_on_b(prompt: str, completion: str) -> float:
    if "b" in completion:
        raise KeyError("no b allowed")
    return 1.0


def assert_env_usable_after(env, error_match: str, first_actions, retry_actions):
    obs, _ = env.reset(seed=0)
    with pytest.raises(RewardError, match=error_match):
        env.step(first_actions)
    assert torch.equal(env._obs()["input_ids"], obs["input_ids"])  # state untouched
    assert torch.equal(env._info()["length"], torch.zeros(env.num_envs, dtype=torch.long))
    return env.step(retry_actions)


def test_a_per_sample_function_that_raises_names_the_reward_and_row(make_env, ids):
    reward = FunctionReward(boom_on_b, batched=False)
    env = make_env(num_prompts=2, prompt_order="sequential", reward=reward)
    a, b = ids("a")[0], ids("b")[0]
    env.reset(seed=0)
    env.step(t([a, b]))  # nothing finished yet: nothing scored
    before = env._obs()["input_ids"].clone()
    with pytest.raises(
        RewardError,
        match=r"reward 'boom_on_b' raised KeyError: 'no b allowed' on row 1 "
        r"\(prompt='xyz', completion='b'\)",
    ):
        env.step(t([EOS, EOS]))
    # The failed step changed nothing, and the env goes on.
    assert torch.equal(env._obs()["input_ids"], before)
    assert env._info()["length"].tolist() == [1, 1]
    _, reward, term, _, _ = env.step(t([EOS, a]))
    assert reward.tolist() == [1.0, 0.0] and term.tolist() == [True, False]


def test_a_raising_reward_leaves_the_env_usable(make_env, ids):
    calls = {"n": 0}

    def flaky(prompts, completions):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("service down")
        return [1.0] * len(completions)

    env = make_env(num_prompts=2, reward=FunctionReward(flaky, name="remote_judge"))
    _, reward, term, _, _ = assert_env_usable_after(
        env,
        r"reward 'remote_judge' raised RuntimeError: service down on a batch of 2 completions",
        t([EOS, EOS]),
        t([EOS, EOS]),
    )
    assert reward.tolist() == [1.0, 1.0] and term.all()


def test_an_async_per_sample_function_that_raises_names_the_row(make_env, ids):
    async def judge(prompt: str, completion: str) -> float:
        if prompt == "xyz":
            raise ValueError("judge refused")
        return 0.0

    env = make_env(
        num_prompts=2, prompt_order="sequential", reward=FunctionReward(judge, batched=False)
    )
    env.reset(seed=0)
    with pytest.raises(
        RewardError, match=r"'judge' raised ValueError: judge refused on row 1 \(prompt='xyz'"
    ):
        env.step(t([EOS, EOS]))


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (
            lambda p, c: "high",
            r"reward 'bad' returned 'high' for row 0 \(prompt='ab', completion=''\), which is not a real number",
        ),
        (lambda p, c: None, r"returned None for row 0"),
        (lambda p, c: float("nan"), r"reward 'bad' returned nan for row 0"),
        (lambda p, c: [1.0, 2.0], r"returned \[1.0, 2.0\] for row 0"),
    ],
)
def test_per_sample_non_numbers_name_the_row(make_env, fn, message):
    env = make_env(prompts=["ab"], reward=FunctionReward(fn, batched=False, name="bad"))
    env.reset(seed=0)
    with pytest.raises(RewardError, match=message):
        env.step(t([EOS]))


def test_batched_non_number_names_the_row(make_env):
    env = make_env(num_prompts=2, reward=FunctionReward(lambda ps, cs: [1.0, "x"], name="bad"))
    env.reset(seed=0)
    with pytest.raises(
        RewardError,
        match=r"reward 'bad' returned list that is not a sequence of numbers .*row 1 is 'x'",
    ):
        env.step(t([EOS, EOS]))


# ------------------------------------------------------------ per-token scorer
def a_scores(batch):
    """1 per 'a' token, 0.5 per 'b'; a causal per-token scorer."""
    a, b = 3, 4
    ids = batch.completion_ids
    return (ids == a).float() + 0.5 * (ids == b).float()


def test_token_scorer_in_per_token_and_bandit_modes(make_env, ids):
    a, b, c = (ids(x)[0] for x in "abc")
    reward = TokenScoreReward(a_scores)
    env = make_env(num_prompts=1, max_new_tokens=4, reward=reward, reward_mode="per_token")
    env.reset(seed=0)
    steps = [env.step(t([x]))[1].item() for x in (a, c, b, EOS)]
    assert steps == [1.0, 0.0, 0.5, 0.0]  # exactly each token's score
    bandit = make_env(num_prompts=1, max_new_tokens=4, reward=reward)
    bandit.reset(seed=0)
    steps = [bandit.step(t([x]))[1].item() for x in (a, c, b, EOS)]
    assert steps == [0.0, 0.0, 0.0, 1.5]  # the sum, once, at the end


def test_token_scorer_with_the_wrong_shape(make_env):
    reward = TokenScoreReward(lambda batch: batch.completion_ids.sum(1).float(), name="flat")
    env = make_env(num_prompts=1, max_new_tokens=4, reward=reward)
    env.reset(seed=0)
    with pytest.raises(
        RewardError,
        match=r"reward 'flat' returned \(1,\); a per-token scorer must return a tensor of shape \(1, 4\)",
    ):
        env.step(t([EOS]))


# -------------------------------------------------------------------- combined
def test_combined_reward_sums_weights_and_logs_components(make_env, ids):
    count_a = FunctionReward(lambda p, c: float(c.count("a")), batched=False, name="count_a")
    short = FunctionReward(lambda ps, cs: [-float(len(c)) for c in cs], name="brevity")
    combined = CombinedReward([(count_a, 2.0), (short, 0.5)])
    env = make_env(num_prompts=2, max_new_tokens=4, reward=combined)
    returns = finish(env, ids, ["aa", "abc"])
    # "aa": 2*2 + 0.5*(-2) = 3; "abc": 2*1 + 0.5*(-3) = 0.5
    assert returns.tolist() == [3.0, 0.5]
    assert reward_component_means(env) == {"reward/count_a": 1.5, "reward/brevity": -2.5}
    assert reward_component_means(env) == {}  # popped
    assert combined.last_components["count_a"].shape == (1,)  # the last call's rows
    assert reward_component_means(make_env()) == {}  # not a combined reward


def test_combined_reward_counts_only_final_scores_in_per_token_mode(make_env, ids):
    count_a = FunctionReward(lambda p, c: float(c.count("a")), batched=False, name="count_a")
    combined = CombinedReward([(count_a, 1.0)])
    env = make_env(num_prompts=2, max_new_tokens=4, reward=combined, reward_mode="per_token")
    returns = finish(env, ids, ["aaa", "ba"])
    assert returns.tolist() == [3.0, 1.0]
    assert combined.pop_component_means() == {"count_a": 2.0}  # not the prefixes' scores


def test_combined_reward_errors_name_the_component_and_keep_the_stats(make_env, ids):
    good = FunctionReward(lambda ps, cs: [1.0] * len(cs), name="good")
    calls = {"n": 0}

    def sometimes_nan(prompts, completions):
        calls["n"] += 1
        return [float("nan") if calls["n"] == 1 else 0.0] * len(completions)

    combined = CombinedReward([(good, 1.0), (FunctionReward(sometimes_nan), 1.0)])
    env = make_env(num_prompts=1, reward=combined)
    obs, _ = env.reset(seed=0)
    with pytest.raises(RewardError, match=r"reward 'sometimes_nan' returned nan for row 0"):
        env.step(t([EOS]))
    assert combined.pop_component_means() == {}  # the failed call recorded nothing
    assert torch.equal(env._obs()["input_ids"], obs["input_ids"])
    _, reward, *_ = env.step(t([EOS]))
    assert reward.tolist() == [1.0]
    assert combined.pop_component_means() == {"good": 1.0, "sometimes_nan": 0.0}

    def raises(batch):
        raise ZeroDivisionError("oops")

    raises.name = "divider"
    env = make_env(num_prompts=1, reward=CombinedReward([(good, 1.0), (raises, 1.0)]))
    env.reset(seed=0)
    with pytest.raises(RewardError, match=r"reward 'divider' raised ZeroDivisionError: oops"):
        env.step(t([EOS]))


def test_combined_reward_configuration_errors():
    f = FunctionReward(length, batched=False)
    with pytest.raises(ValueError, match="two components are named 'length'"):
        CombinedReward([(f, 1.0), (FunctionReward(length, batched=False), 2.0)])
    with pytest.raises(ValueError, match=r"terms\[0\]: weight=nan must be a finite number"):
        CombinedReward([(f, float("nan"))])
    with pytest.raises(TypeError, match=r"terms\[0\]: expected a \(reward, weight\) pair"):
        CombinedReward([f])
    with pytest.raises(ValueError, match="at least one"):
        CombinedReward([])


# ----------------------------------------------------------------- custom envs
def test_register_reward_env_gives_both_faces_with_overridable_defaults(ids):
    env_id = register_reward_env(
        "CustomLength",
        FunctionReward(length, batched=False),
        ["ab", "xyz"],
        max_new_tokens=3,
        solved_threshold=2.5,
        reward_range=(0.0, 3.0),
    )
    assert env_id == "lmgym/CustomLength-v0"
    assert TASKS[env_id].solved_threshold == 2.5
    vec = gym.make_vec(env_id, num_envs=4, group_size=2)
    assert isinstance(vec, TokenVectorEnv) and (vec.num_envs, vec.group_size) == (4, 2)
    assert vec.max_new_tokens == 3
    assert gym.make_vec(env_id, num_envs=2, max_new_tokens=5).max_new_tokens == 5
    single = gym.make(env_id)
    assert isinstance(single.unwrapped, TokenEnv)
    single.reset(seed=0)
    a = ids("a")[0]
    rewards = [single.step(x)[1] for x in (a, a, a)]
    assert rewards == [0.0, 0.0, 3.0]
    # Registering the same custom name again replaces it.
    register_reward_env(
        "CustomLength", FunctionReward(length, batched=False), ["ab"], max_new_tokens=2
    )
    assert gym.make_vec("lmgym/CustomLength-v0", num_envs=1).max_new_tokens == 2
    assert (
        register_reward_env("custom/Len-v3", FunctionReward(length, batched=False), ["ab"])
        == "custom/Len-v3"
    )


def test_register_reward_env_rejects_plain_functions_and_builtin_names():
    with pytest.raises(TypeError, match=r"wrap it: FunctionReward\(fn, batched=False\)"):
        register_reward_env("Plain", length, ["ab"])
    with pytest.raises(TypeError, match="prompts: got a single string"):
        register_reward_env("OneString", FunctionReward(length, batched=False), "ab")
    with pytest.raises(ValueError, match="lmgym/TargetString-v0 is a built-in task"):
        register_reward_env("TargetString", FunctionReward(length, batched=False), ["ab"])


# ------------------------------------------------------------------ columns
def env_over(source, reward, tokenizer, **kwargs) -> TokenVectorEnv:
    """An env over ``source`` itself (the ``make_env`` fixture makes a list of it)."""
    kwargs.setdefault("max_new_tokens", 4)
    return TokenVectorEnv(tokenizer, source, reward, **kwargs)


def exact_answer(prompts, completions, answer):
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


def test_exact_match_math_reads_the_reference_answer_from_the_data(tmp_path, tokenizer, ids):
    from lmgym.envs import JsonlPrompts

    path = tmp_path / "math.jsonl"
    lines = [{"prompt": "2+3=", "answer": "5"}, {"prompt": "4+4=", "answer": "8"}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    env = env_over(
        JsonlPrompts(path),
        FunctionReward(exact_answer),
        tokenizer,
        num_prompts=2,
        group_size=2,
        max_new_tokens=2,
        prompt_order="sequential",
    )
    # Rows 0-1 answer "2+3=", rows 2-3 "4+4=": right, wrong, right, run-on.
    assert finish(env, ids, ["5", "6", "8", "88"]).tolist() == [1.0, 0.0, 1.0, 0.0]


def test_per_sample_functions_get_the_rows_values(tokenizer, ids):
    from lmgym.envs import RecordPrompts

    seen = []

    def check(prompt, completion, answer, weight=1.0):
        seen.append((prompt, answer, weight))
        return weight * float(completion == answer)

    source = RecordPrompts(
        [
            {"prompt": "ab", "answer": "a", "weight": 2.0},
            {"prompt": "xyz", "answer": "b", "weight": 3.0},
        ]
    )
    env = env_over(
        source,
        FunctionReward(check, batched=False),
        tokenizer,
        num_prompts=2,
        prompt_order="sequential",
    )
    assert finish(env, ids, ["a", "a"]).tolist() == [2.0, 0.0]
    assert seen == [("ab", "a", 2.0), ("xyz", "b", 3.0)]


def test_kwargs_gets_every_column_and_defaults_stand_in_for_missing_ones(tokenizer, ids):
    from lmgym.envs import RecordPrompts

    calls = []

    def everything(prompts, completions, unknown="-", **columns):
        calls.append((unknown, columns))
        return [0.0] * len(prompts)

    source = RecordPrompts([{"prompt": "ab", "answer": "1", "id": 5}])
    finish(env_over(source, FunctionReward(everything), tokenizer), ids, [""])
    assert calls == [("-", {"answer": ["1"], "id": [5]})]
    # A source without columns: nothing extra is passed.
    calls.clear()
    finish(env_over(["ab"], FunctionReward(everything), tokenizer), ids, [""])
    assert calls == [("-", {})]


def test_a_missing_required_column_fails_when_the_env_is_built(make_env):
    reward = FunctionReward(exact_answer)
    assert reward.required_columns == ("answer",)
    with pytest.raises(
        ValueError,
        match=r"reward: 'exact_answer' needs the column\(s\) \['answer'\], which the prompt "
        r"source does not have \(its columns: \[\]\)",
    ):
        make_env(prompts=["ab"], reward=reward)
    with pytest.raises(ValueError, match=r"needs the column\(s\) \['answer'\]"):
        make_env(prompts=["ab"], reward=CombinedReward([(reward, 1.0)]))


def test_a_missing_column_at_call_time_is_a_reward_error():
    from lmgym.types import RewardInput

    batch = RewardInput(
        t([[3]]), t([[True]], torch.bool), t([[4]]), t([[True]], torch.bool), ["ab"], t([0]),
        t([True], torch.bool), decode=lambda ids: ["b"],
    )  # fmt: skip
    with pytest.raises(
        RewardError, match=r"reward 'exact_answer' takes 'answer', which is not a column"
    ):
        FunctionReward(exact_answer)(batch)
    batch = RewardInput(
        t([[3]]), t([[True]], torch.bool), t([[4]]), t([[True]], torch.bool), ["ab"], t([0]),
        t([True], torch.bool), decode=lambda ids: ["b"], columns={"answer": ["b"]},
    )  # fmt: skip
    assert FunctionReward(exact_answer)(batch) == [1.0]
