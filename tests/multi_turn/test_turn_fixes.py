"""Issue 39, item 4: an observation is tokenized no further than the budget allows,
the bridge keeps a Gymnasium truncation a truncation, a bridged game plays on one
live env (and refuses to replay a game that is not deterministic), the documented
``game_records`` path works, and ``max_turn_tokens`` caps a policy turn."""

from __future__ import annotations

import gc
import random
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from lmgym.envs import EnvOptions, RecordPrompts, register_responder_env
from lmgym.envs.tasks.multi_turn.games import GAMES
from lmgym.envs.tasks.multi_turn.gym_bridge import (
    GameState,
    GymResponder,
    TextGame,
    game_records,
)
from lmgym.envs.turns import EpisodeStart, TurnInput

EOS = 1
LAKE = GAMES["FrozenLake"]


def turn_input(texts, states) -> TurnInput:
    k = len(texts)
    return TurnInput(
        rows=torch.arange(k),
        prompts=["p"] * k,
        prompt_index=torch.zeros(k, dtype=torch.long),
        columns={},
        turn_texts=list(texts),
        turn_ids=[torch.tensor([EOS])] * k,
        turn_index=torch.ones(k, dtype=torch.long),
        states=list(states),
    )


# ------------------------------------------------ observations bounded by the budget
def spy_encode(env, monkeypatch) -> list[int]:
    """Record the length of every text the env's observation renderer tokenizes."""
    renderer = env._turns.renderer
    seen: list[int] = []
    encode = renderer._encode

    def recording(texts):
        seen.extend(len(t) for t in texts)
        return encode(texts)

    monkeypatch.setattr(renderer, "_encode", recording)
    return seen


def test_a_huge_observation_is_tokenized_only_as_far_as_the_budget_reaches(
    scripted, make_turn_env, ids, monkeypatch
):
    huge = "y" * 16_000_000
    responder = scripted(done_at=5, reply=lambda text, turn: huge if text == "c" else "+ok")
    env = make_turn_env(
        num_prompts=2, prompt_order="sequential", max_new_tokens=24, responder=responder
    )
    seen = spy_encode(env, monkeypatch)
    env.reset(seed=0)
    c, d = ids("c")[0], ids("d")[0]
    env.step(torch.tensor([c, d]))
    _, _, terminated, truncated, info = env.step(torch.tensor([EOS, EOS]))
    # Row 0's 16 MB answer cannot fit in the 22 tokens left: cut, nothing written.
    assert truncated.tolist() == [True, False] and not terminated.any()
    assert info["length"].tolist() == [2, 2 + len(ids("+ok"))]
    longest = env._turns.renderer.longest_token
    cap = 24 - 2 - 1  # the budget left after the turn, less one policy token
    assert max(seen) <= (cap + 1) * longest < 1000


def test_a_text_that_fits_is_rendered_whole_and_one_a_token_over_is_cut(
    scripted, make_turn_env, ids
):
    # After "c<eos>" 14 of 16 tokens are left: an observation of 13 fits, of 14 does not.
    for size, fits in ((13, True), (14, False)):
        responder = scripted(done_at=5, reply=lambda text, turn, n=size: "z" * n)
        env = make_turn_env(num_prompts=1, max_new_tokens=16, responder=responder)
        env.reset(seed=0)
        env.step(torch.tensor([ids("c")[0]]))
        _, _, _, truncated, info = env.step(torch.tensor([EOS]))
        assert bool(truncated[0]) is not fits
        assert int(info["length"][0]) == (2 + size if fits else 2)


def test_long_token_ids_are_cut_without_being_read(scripted, make_turn_env, ids):
    # Out-of-vocabulary ids a row cannot take anyway are not checked one by one.
    responder = scripted(done_at=5, reply=lambda text, turn: torch.full((10**6,), 10**9))
    env = make_turn_env(num_prompts=1, max_new_tokens=16, responder=responder)
    env.reset(seed=0)
    env.step(torch.tensor([ids("c")[0]]))
    _, _, terminated, truncated, _ = env.step(torch.tensor([EOS]))
    assert truncated.tolist() == [True] and not terminated.any()


def test_a_normalizer_that_deletes_characters_falls_back_to_the_whole_text(
    scripted, make_turn_env, ids, monkeypatch
):
    """If the characters cut off could have vanished in tokenizing (here: spaces
    dropped), the whole text decides."""
    text = "q" + " " * 5000 + "r"
    responder = scripted(done_at=5, reply=lambda t, turn: text)
    env = make_turn_env(num_prompts=1, max_new_tokens=16, responder=responder)
    renderer = env._turns.renderer
    encode = renderer._encode
    monkeypatch.setattr(
        renderer, "_encode", lambda texts: encode([t.replace(" ", "") for t in texts])
    )
    env.reset(seed=0)
    env.step(torch.tensor([ids("c")[0]]))
    _, _, _, truncated, info = env.step(torch.tensor([EOS]))
    assert not truncated.any() and int(info["length"][0]) == 4  # c <eos> q r


# --------------------------------------------- Gymnasium truncation stays truncation
def short_lake(steps: int) -> TextGame:
    return replace(LAKE, kwargs={**LAKE.kwargs, "max_episode_steps": steps})


def test_the_bridge_reports_a_time_limit_as_truncated_not_done():
    responder = GymResponder(short_lake(2))
    first = responder.respond(turn_input(["left"], [GameState(0, digest="")]))
    assert first.truncated is None and list(first.done) == [False]
    second = responder.respond(turn_input(["left"], first.states))
    assert list(second.done) == [False] and list(second.truncated) == [True]
    assert list(second.observations) == [None]


def test_through_the_env_a_time_limit_is_truncated_and_the_goal_terminated(tokenizer):
    from lmgym.envs.task_factory import build_env

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    responder = GymResponder(short_lake(2))
    records = game_records(responder, 2)
    env = build_env(
        EnvOptions(num_envs=1, tokenizer=tokenizer, max_new_tokens=64, prompt_order="sequential"),
        RecordPrompts(records),
        None,
        responder=responder,
    )
    env.reset(seed=0)
    stream = encode("left") + encode("left")
    for action in stream:
        _, _, terminated, truncated, _ = env.step(torch.tensor([action]))
    assert truncated.tolist() == [True] and terminated.tolist() == [False]


# ---------------------------------------------------- a live game, not silent replays
class Unseeded(gym.Env):
    """A game whose secret comes from Python's ``random``, not ``reset(seed)``: every
    observation shows the secret, so a replay would show another one."""

    observation_space = gym.spaces.Discrete(10**9)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret, self.moves = random.randrange(10**9), 0
        return self.secret, {}

    def step(self, action):
        self.moves += 1
        return self.secret, 0.0, self.moves >= 5, False, {}


gym.register("lmgymtest/Unseeded-v0", entry_point=Unseeded, disable_env_checker=True)
UNSEEDED = TextGame(
    "lmgymtest/Unseeded-v0", (("a",), ("b",)), "pick a or b.", lambda env, obs: f"secret {obs}"
)


def test_a_game_plays_on_one_live_env_so_an_unseeded_one_stays_one_game():
    responder = GymResponder(UNSEEDED)
    (state,) = responder.start(EpisodeStart(["p"], torch.zeros(1, dtype=torch.long), {"seed": [0]}))
    seen = []
    for _ in range(4):
        out = responder.respond(turn_input(["a"], [state]))
        seen.append(out.observations[0])
        state = out.states[0]
    assert len(set(seen)) == 1, seen  # one secret all along: one game, never replayed


def test_replaying_a_state_of_a_game_that_is_not_deterministic_is_refused():
    """A failed step is retried from the old state, whose live game moved on: the
    replay from reset(seed) shows another secret, and is refused, not shown."""
    responder = GymResponder(UNSEEDED)
    state = GameState(0, digest="")
    state = responder.respond(turn_input(["a"], [state])).states[0]
    retry = turn_input(["b"], [state])
    responder.respond(retry)  # takes the live game
    with pytest.raises(ValueError, match="not deterministic given its seed"):
        responder.respond(retry)


def test_a_deterministic_game_replays_a_retried_state_exactly():
    responder = GymResponder(GAMES["Taxi"])
    state = GameState(3, digest="")
    for move in ("south", "north", "east"):
        state = responder.respond(turn_input([move], [state])).states[0]
    turns = turn_input(["west"], [state])
    live, replayed = responder.respond(turns), responder.respond(turns)  # the 2nd replays
    assert live == replayed and live.states[0].digest == replayed.states[0].digest


def test_the_env_retries_a_failed_step_on_a_bridged_game(tokenizer):
    """A reward model that fails once: the env keeps the old states and the retry
    replays them (deterministic Taxi), answering as the first try would have."""
    from lmgym.envs.rewards import RewardError
    from lmgym.envs.task_factory import build_env

    calls = []

    def flaky(batch):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("reward server down")
        return torch.zeros(batch.completion_ids.shape[0])

    responder = GymResponder(GAMES["Taxi"])
    env = build_env(
        EnvOptions(num_envs=1, tokenizer=tokenizer, max_new_tokens=128, max_turns=2),
        RecordPrompts(game_records(responder, 2)),
        flaky,
        responder=responder,
    )
    env.reset(seed=0)
    stream = tokenizer("south", add_special_tokens=False)["input_ids"] + [EOS]
    stream += tokenizer("north", add_special_tokens=False)["input_ids"]
    for action in stream:
        env.step(torch.tensor([action]))
    with pytest.raises(RewardError):
        env.step(torch.tensor([EOS]))  # ends the episode: the reward model runs, fails
    _, _, terminated, truncated, _ = env.step(torch.tensor([EOS]))
    assert bool(terminated[0] | truncated[0])


# ------------------------------------------- game_records as the docs say to use it
def test_game_records_register_as_docs_tasks_md_shows(tokenizer):
    responder = GymResponder(TextGame.generic("CliffWalking-v1"))
    env_id = register_responder_env(
        "Issue39Cliff", responder, RecordPrompts(game_records(responder, 4)), max_turns=3
    )
    env = gym.make_vec(env_id, num_envs=2, group_size=1)
    obs, _ = env.reset(seed=0)
    assert obs["input_ids"].shape[0] == 2
    docs = (Path(__file__).parents[2] / "docs" / "tasks.md").read_text(encoding="utf-8")
    assert "RecordPrompts(game_records(responder, num_games))" in docs


# ------------------------------------------------------------------ max_turn_tokens
def test_max_turn_tokens_cuts_a_turn_that_runs_on_and_counts_each_turn_afresh(
    scripted, make_turn_env, ids
):
    responder = scripted(done_at=5, reply=lambda text, turn: "+")
    env = make_turn_env(
        num_prompts=2, prompt_order="sequential", max_turn_tokens=3, responder=responder
    )
    env.reset(seed=0)
    c = ids("c")[0]
    # row 0: "cc<eos>" (3 tokens, ended by its stop id) "+" then "ccc": cut at the 3rd
    # row 1: "ccc" cut at once
    script = [[c, c], [c, c], [EOS, c]]
    truncated = []
    for actions in script:
        _, _, te, tr, _ = env.step(torch.tensor(actions))
        truncated.append(tr.tolist())
        assert not te.any()
    assert truncated == [[False, False], [False, False], [False, True]]
    for _ in range(2):
        _, _, _, tr, _ = env.step(torch.tensor([c, c]))
        assert not tr[0]
    _, _, _, tr, info = env.step(torch.tensor([c, c]))
    assert tr.tolist() == [True, True] and info["turn"].tolist() == [1, 0]


def test_turn_only_options_are_refused_without_a_responder_and_checked(make_env):
    for option, value in (("max_turn_tokens", 4), ("responder_timeout", 1.0)):
        with pytest.raises(ValueError, match=f"{option}=.*only a multi-turn env"):
            make_env(**{option: value})
    with pytest.raises(ValueError, match="max_turn_tokens=0: must be a positive integer"):
        EnvOptions(max_turn_tokens=0)
    with pytest.raises(ValueError, match="responder_timeout=-1: must be a positive number"):
        EnvOptions(responder_timeout=-1)
    with pytest.raises(ValueError, match="on_responder_timeout='later' is not one of"):
        EnvOptions(on_responder_timeout="later")


def test_a_dropped_live_game_hands_its_env_back_for_the_next_game():
    """An episode the env cuts (max_turns, the budget) drops its state untaken: its
    env goes to the spares, so a new game does not make (Taxi: build) another."""
    responder = GymResponder(GAMES["Taxi"])
    state = responder.respond(turn_input(["south"], [GameState(3, digest="")])).states[0]
    assert responder._spare == []
    del state
    gc.collect()
    assert len(responder._spare) == 1
    spare = responder._spare[0]
    state = responder.respond(turn_input(["north"], [GameState(4, digest="")])).states[0]
    assert responder._spare == [] and state.live.take() is spare
