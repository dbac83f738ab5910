"""Special tokens cannot game a string reward: the env refuses them by default, and
when allowed they are part of the text the reward sees."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector.utils import batch_space

from lmgym.envs import FunctionReward
from lmgym.envs.action_space import TokenActionSpace, TokenActionsSpace
from lmgym.policy import make_char_tokenizer

PAD, EOS, UNK = 0, 1, 2


def palindrome(prompts: list[str], completions: list[str]) -> list[float]:
    return [float(len(c) >= 4 and c == c[::-1]) for c in completions]


def play(env, ids, text_ids: list[int]) -> float:
    """Reset, play ``text_ids`` then EOS on the single row, return the episode return."""
    env.reset(seed=0)
    total = 0.0
    for token in [*text_ids, EOS]:
        _, reward, terminated, truncated, _ = env.step(torch.tensor([token]))
        total += float(reward[0])
    assert bool(terminated[0] | truncated[0])
    return total


def hack(ids) -> list[int]:
    """'<pad>cc<unk>cccc': its specials dropped, 'cccccc' is a palindrome."""
    c = ids("c")[0]
    return [PAD, c, c, UNK, c, c, c, c]


def test_the_special_token_palindrome_hack_is_refused_by_default(make_env, ids):
    env = make_env(prompts=["p:"], reward=FunctionReward(palindrome), max_new_tokens=10)
    obs, _ = env.reset(seed=0)
    with pytest.raises(
        ValueError,
        match=r"actions\[0\]=0 is the special token '<pad>' \(id 0\), which this env refuses.*"
        r"allowed_special_tokens",
    ):
        env.step(torch.tensor([PAD]))
    assert torch.equal(env._obs()["input_ids"], obs["input_ids"])  # nothing written
    c = ids("c")[0]
    env.step(torch.tensor([c]))
    with pytest.raises(ValueError, match=r"'<unk>' \(id 2\)"):
        env.step(torch.tensor([UNK]))
    assert play(env, ids, ids("cccccc")) == 1.0  # the honest palindrome still scores


@pytest.mark.parametrize("allowed", ["all", ["<pad>", "<unk>"], [PAD, UNK]])
def test_allowed_special_tokens_are_text_the_reward_sees(make_env, ids, allowed):
    seen = []

    def record(prompts, completions):
        seen.extend(completions)
        return palindrome(prompts, completions)

    env = make_env(
        prompts=["p:"],
        reward=FunctionReward(record),
        max_new_tokens=10,
        allowed_special_tokens=allowed,
    )
    assert play(env, ids, hack(ids)) == 0.0
    assert seen == ["<pad>cc<unk>cccc"]  # the final <eos> ends the text
    assert env.decode_completions(env._obs()["input_ids"][:, env.prompt_width :]) == seen


def test_the_reward_text_is_exactly_the_actions_when_pad_is_eos(make_env, ids):
    tokenizer = make_char_tokenizer(pad_equals_eos=True)  # <eos> = <pad> = 0, <unk> = 1
    seen = []

    def record(prompts, completions):
        seen.extend(completions)
        return [0.0] * len(completions)

    env = make_env(
        prompts=["p:"], reward=FunctionReward(record), tokenizer=tokenizer, num_prompts=2
    )
    a = tokenizer.convert_tokens_to_ids("a")
    unk = tokenizer.unk_token_id
    env.reset(seed=0)
    with pytest.raises(ValueError, match="'<unk>'"):
        env.step(torch.tensor([a, unk]))
    env.step(torch.tensor([a, tokenizer.eos_token_id]))  # row 1 ends at once: ''
    for _ in range(3):
        env.step(torch.tensor([a, a]))  # row 0 is cut at the budget: 'aaaa'
    assert seen == ["", "aaaa"]


def test_a_stop_id_with_text_stays_in_the_text(make_env, ids):
    seen = []

    def record(prompts, completions):
        seen.extend(completions)
        return [0.0] * len(completions)

    z = ids("z")[0]
    env = make_env(prompts=["p:"], reward=FunctionReward(record), stop_token_ids=[EOS, z])
    env.reset(seed=0)
    env.step(torch.tensor([ids("a")[0]]))
    env.step(torch.tensor([z]))
    assert seen == ["az"]


def test_per_token_prefixes_decode_without_padding(make_env, ids):
    seen = []

    def record(prompts, completions):
        seen.extend(completions)
        return [0.0] * len(completions)

    env = make_env(prompts=["p:"], reward=FunctionReward(record), reward_mode="per_token")
    play(env, ids, ids("ab"))
    assert seen == ["a", "ab", "ab"]  # the last prefix ends with <eos>, left out


def test_decode_completions_infers_the_end_without_a_mask(make_env, ids):
    env = make_env()
    a, b = ids("a")[0], ids("b")[0]
    completions = torch.tensor([[a, b, EOS, PAD], [a, PAD, PAD, PAD], [a, a, b, b]])
    assert env.decode_completions(completions) == ["ab", "a", "aabb"]


def test_allowed_special_tokens_are_checked(make_env):
    with pytest.raises(ValueError, match=r"allowed_special_tokens: 'a' is not a special token"):
        make_env(allowed_special_tokens=["a"])
    with pytest.raises(ValueError, match=r"'<mask>' is not a token of this tokenizer"):
        make_env(allowed_special_tokens=["<mask>"])
    with pytest.raises(TypeError, match=r"allowed_special_tokens='<pad>': pass a list"):
        make_env(allowed_special_tokens="<pad>")
    with pytest.raises(TypeError, match="neither a token id"):
        make_env(allowed_special_tokens=[0.0])


# ----------------------------------------------------------------- action spaces
def test_action_spaces_hold_only_legal_ids(make_env):
    env = make_env(num_prompts=3)
    assert env.refused_token_ids == [PAD, UNK]
    assert env.legal_token_ids.tolist() == [EOS, *range(3, env.vocab_size)]
    space = env.single_action_space
    assert isinstance(space, gym.spaces.Discrete) and space.n == env.vocab_size
    assert not space.contains(PAD) and not space.contains(UNK) and space.contains(EOS)
    space.seed(0)
    drawn = {int(space.sample()) for _ in range(2000)}
    assert drawn == set(env.legal_token_ids.tolist())
    only_eos_or_a = np.zeros(env.vocab_size, dtype=np.int8)
    only_eos_or_a[[PAD, EOS, 3]] = 1
    assert {int(space.sample(mask=only_eos_or_a)) for _ in range(200)} == {EOS, 3}
    uniform = np.full(env.vocab_size, 1 / env.vocab_size)
    assert not {int(space.sample(probability=uniform)) for _ in range(500)} & {PAD, UNK}
    with pytest.raises(ValueError, match="no mass on a legal token id"):
        space.sample(probability=np.eye(env.vocab_size)[PAD])

    batched = env.action_space
    assert isinstance(batched, TokenActionsSpace) and batched.shape == (3,)
    batched.seed(1)
    samples = np.stack([batched.sample() for _ in range(500)])
    assert not np.isin(samples, [PAD, UNK]).any()
    assert batched.contains(np.array([EOS, 3, 4])) and not batched.contains(np.array([3, 0, 4]))
    assert batch_space(space, 3) == batched
    rows = (uniform,) * 3
    assert not np.isin(
        np.stack([batched.sample(probability=rows) for _ in range(200)]), [0, 2]
    ).any()


def test_allowing_all_special_tokens_gives_the_whole_vocabulary(make_env):
    env = make_env(allowed_special_tokens="all")
    assert env.refused_token_ids == [] and len(env.legal_token_ids) == env.vocab_size
    assert env.single_action_space == TokenActionSpace(env.vocab_size)
    assert env.single_action_space.contains(PAD)


def test_single_env_refuses_a_special_token_and_samples_legal_ones():
    import lmgym  # noqa: F401

    env = gym.make("lmgym/TargetString-v0")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="'<unk>' \\(id 2\\), which this env refuses"):
        env.step(UNK)
    env.action_space.seed(0)
    assert all(env.action_space.sample() not in (PAD, UNK) for _ in range(500))


def test_registered_and_builtin_envs_take_allowed_special_tokens(ids):
    import lmgym  # noqa: F401
    from lmgym.envs import register_reward_env

    def text(prompts, completions):
        return [float(len(c)) for c in completions]

    env_id = register_reward_env("SpecialText", FunctionReward(text), ["p:"], max_new_tokens=3)
    assert gym.make_vec(env_id, num_envs=2).refused_token_ids == [PAD, UNK]
    allowed = gym.make_vec(env_id, num_envs=1, allowed_special_tokens=["<pad>"])
    assert allowed.refused_token_ids == [UNK]
    single = gym.make(env_id, allowed_special_tokens="all")
    single.reset(seed=0)
    rewards = [single.step(x)[1] for x in (PAD, UNK, ids("a")[0])]
    assert rewards == [0.0, 0.0, float(len("<pad><unk>a"))]
    for task in ("lmgym/TargetString-v0", "lmgym/Arithmetic-v0", "lmgym/Reverse-v0"):
        assert gym.make_vec(task, num_envs=1, allowed_special_tokens="all").refused_token_ids == []
