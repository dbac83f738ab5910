"""Turn credit (docs/algorithms.md#turn-credit) against closed forms: the episode
return for outcome methods by default, and per-turn discounted returns compared with
the same turn of the group's other episodes, including groups whose episodes have as
many turns as the policy chose to take."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from lmgym.agents import GRPO, GSPO, RLOO, DrGRPO, GSPOToken
from lmgym.agents.turn_credit import (
    discounted_turn_returns,
    turn_index,
    turn_returns,
    turn_rewards,
)

# "p" a policy token, "o" an observation token, "-" padding.
LAYOUT = ["pp----------", "ppoopp------", "poopooopp---", "ppp---------", "pppp--------"]


def layout(rows: list[str]) -> torch.Tensor:
    """``[B, L] bool`` policy mask of the rows above."""
    return torch.tensor([[ch == "p" for ch in row] for row in rows])


def place(policy: torch.Tensor, turn_values: list[list[float]]) -> torch.Tensor:
    """Rewards ``[B, L]``: turn ``k``'s value at turn ``k``'s last policy token."""
    turns = turn_index(policy)
    following = torch.nn.functional.pad(turns[:, 1:], (0, 1))
    last = policy & (following != turns)
    rewards = torch.zeros(policy.shape)
    for i, values in enumerate(turn_values):
        rewards[i, last[i]] = torch.tensor(values)
    return rewards


def test_turns_are_runs_of_policy_tokens():
    policy = layout(LAYOUT[:3])
    assert turn_index(policy).tolist() == [
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 2, 2, 0, 0, 0, 0, 0, 0],
        [1, 0, 0, 2, 0, 0, 0, 3, 3, 0, 0, 0],
    ]


def test_turn_rewards_sum_every_reward_of_the_turn():
    # A per-token KL penalty inside a turn joins that turn's reward.
    policy = layout(["ppoopp"])
    rewards = torch.tensor([[-0.1, 1.0, 5.0, 5.0, -0.2, 2.0]])
    per_turn, present = turn_rewards(rewards, policy)
    assert_close(per_turn, torch.tensor([[0.9, 1.8]]))
    assert present.tolist() == [[True, True]]


def test_discounted_turn_returns_closed_form():
    # G_k = sum_{j >= k} gamma^(j - k) r_j
    r = torch.tensor([[1.0, 2.0, 4.0], [3.0, 0.0, 0.0]])
    assert_close(discounted_turn_returns(r, 0.5), torch.tensor([[3.0, 4.0, 4.0], [3.0, 0.0, 0.0]]))
    assert_close(discounted_turn_returns(r, 1.0), torch.tensor([[7.0, 6.0, 4.0], [3.0, 0.0, 0.0]]))
    assert_close(discounted_turn_returns(r, 0.0), r)


def test_each_policy_token_gets_its_turns_return():
    policy = layout(["ppoopooopp"])
    rewards = place(policy, [[1.0, 2.0, 4.0]])
    expected = [[3.0, 3.0, 0, 0, 4.0, 0, 0, 0, 4.0, 4.0]]
    assert_close(turn_returns(rewards, policy, 0.5), torch.tensor(expected))


# The policy decides how many turns there are: group 7's three episodes took 1, 2 and
# 3 turns (solved at once, solved at the second try, never solved); group 9's two
# took one turn each. gamma_turn = 0.5.
GAME = ["ppp---------", "ppoopp------", "poopooopp---", "pp----------", "pppp--------"]
GAME_REWARDS = [[1.0], [0.0, 1.0], [0.0, 0.0, 0.0], [2.0], [1.0]]
GROUPS = torch.tensor([7, 7, 7, 9, 9])
# Turn returns: row 0 [1]; row 1 [0.5, 1]; row 2 [0, 0, 0]; row 3 [2]; row 4 [1].
# Cells: (7, 1) = [1, 0.5, 0]; (7, 2) = [1, 0] (rows 1, 2); (7, 3) = [0] (row 2 alone);
# (9, 1) = [2, 1].


def agent_advantages(agent_class, make_env, policy, **config) -> torch.Tensor:
    mask = layout(GAME)
    rewards = place(mask, GAME_REWARDS)
    env = make_env(num_prompts=2, group_size=2)
    agent = agent_class(policy, env, turn_credit="turn", turn_gamma=0.5, **config)
    batch = SimpleNamespace(group_ids=GROUPS, policy_mask=mask)
    advantages, _ = agent.advantages(batch, rewards, mask, None)
    return advantages


def per_turn(advantages: torch.Tensor) -> list[list[float]]:
    """Each row's advantage per turn, read at the turns' first tokens (checked equal
    over each turn)."""
    mask = layout(GAME)
    turns = turn_index(mask)
    out = []
    for i in range(len(GAME)):
        values = []
        for k in range(1, int(turns[i].max()) + 1):
            at = advantages[i][turns[i] == k]
            assert torch.all(at == at[0])
            values.append(round(float(at[0]), 5))
        out.append(values)
        assert not advantages[i][~mask[i]].any()
    return out


def test_grpo_normalises_each_turn_against_the_same_turn_of_its_group(make_env, policy):
    eps = 1e-4
    a1 = 0.5 / (0.5 + eps)  # (7, 1): mean 0.5, std 0.5
    a2 = 0.5 / (0.5**0.5 + eps)  # (7, 2): mean 0.5, std sqrt(0.5)
    a9 = 0.5 / (0.5**0.5 + eps)  # (9, 1): mean 1.5, std sqrt(0.5)
    expected = [[a1], [0.0, a2], [-a1, -a2, 0.0], [a9], [-a9]]
    got = per_turn(agent_advantages(GRPO, make_env, policy))
    assert got == [[round(x, 5) for x in row] for row in expected]


def test_dr_grpo_centres_each_turn(make_env, policy):
    got = per_turn(agent_advantages(DrGRPO, make_env, policy))
    assert got == [[0.5], [0.0, 0.5], [-0.5, -0.5, 0.0], [0.5], [-0.5]]


def test_rloo_leaves_one_out_per_turn_and_a_lone_turn_gets_zero(make_env, policy):
    # (7, 1): 3/2 * (G - 0.5); (7, 2): 2 * (G - 0.5); (7, 3): alone -> 0; (9, 1): 2 * (G - 1.5).
    got = per_turn(agent_advantages(RLOO, make_env, policy))
    assert got == [[0.75], [0.0, 1.0], [-0.75, -1.0, 0.0], [1.0], [-1.0]]


def test_gspo_token_takes_per_turn_advantages(make_env, policy):
    got = per_turn(agent_advantages(GSPOToken, make_env, policy, scale="none"))
    assert got == [[0.5], [0.0, 0.5], [-0.5, -0.5, 0.0], [0.5], [-0.5]]


def test_episode_credit_gives_every_token_the_episode_return(make_env, policy):
    # The default: R = [1, 1, 0 | 2, 1]; Dr. GRPO: R - mean over the group.
    mask = layout(GAME)
    rewards = place(mask, GAME_REWARDS)
    agent = DrGRPO(policy, make_env(num_prompts=2, group_size=2))
    batch = SimpleNamespace(group_ids=GROUPS, policy_mask=mask)
    advantages, _ = agent.advantages(batch, rewards, mask, None)
    row_values = [1 / 3, 1 / 3, -2 / 3, 0.5, -0.5]
    assert_close(advantages, torch.tensor(row_values)[:, None] * mask)


@pytest.mark.parametrize("agent_class", [GRPO, DrGRPO, RLOO])
def test_single_turn_rows_get_the_same_advantages_either_way(make_env, policy, agent_class):
    mask = layout(["ppp-", "pp--", "pppp", "p---"])
    rewards = place(mask, [[1.0], [0.0], [3.0], [0.5]])
    batch = SimpleNamespace(group_ids=torch.tensor([0, 0, 1, 1]), policy_mask=mask)
    env = make_env(num_prompts=2, group_size=2)
    episode = agent_class(policy, env).advantages(batch, rewards, mask, None)[0]
    turn = agent_class(policy, env, turn_credit="turn", turn_gamma=0.3)
    assert_close(turn.advantages(batch, rewards, mask, None)[0], episode)


def test_bad_turn_credit_settings_name_the_field_and_the_fix(make_env, policy):
    env = make_env(num_prompts=2, group_size=2)
    with pytest.raises(ValueError, match=r"turn_gamma=1.5: must be in \[0, 1\]"):
        GRPO(policy, env, turn_credit="turn", turn_gamma=1.5)
    with pytest.raises(ValueError, match="turn_credit='per_token'"):
        RLOO(policy, env, turn_credit="per_token")
    with pytest.raises(ValueError, match="GSPO's sequence ratio takes one per sequence"):
        GSPO(policy, env, turn_credit="turn")
    per_token = make_env(num_prompts=2, group_size=2, reward_mode="per_token")
    with pytest.raises(ValueError, match="advantage='process' already credits each step"):
        GRPO(policy, per_token, advantage="process", turn_credit="turn")
