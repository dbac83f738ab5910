"""TextArena single-player games as lmgym multi-turn tasks (``pip install 'lmgym[textarena]'``).

Run ``python examples/textarena_games.py``. Three TextArena games are registered
as lmgym tasks: ``lmgym/TextArena-GuessTheNumber-v0`` (a number game),
``lmgym/TextArena-Crosswords-v0`` (a word game) and
``lmgym/TextArena-TowerOfHanoi-v0`` (a puzzle). The prompt is the game's own
opening text; each policy turn is one move (``[12]``, ``[A C]``; a move without
brackets is sent in brackets, for tokenizers that cannot spell them), sent to
the live TextArena game, whose answer the env appends before the next turn; the
game's reward arrives on the turn that ends it.

The script plays the Tower of Hanoi with a scripted policy (the 7-move solution
on one row, a wrong first move then the solution on another) and prints the first
row's episode as the buffer holds it. Train on any of them like on any task:
``GRPO(policy, gym.make_vec("lmgym/TextArena-TowerOfHanoi-v0", num_envs=8,
tokenizer=policy.tokenizer))`` (a pretrained chat model, with
``stop_token_ids=policy.stop_token_ids``, for a real run).
"""

from __future__ import annotations

import string

import gymnasium as gym
import torch

import lmgym  # noqa: F401  (registers the lmgym/... tasks)
from lmgym.char_tokenizer import make_char_tokenizer

TASK = "lmgym/TextArena-TowerOfHanoi-v0"
# A character tokenizer that spells what TextArena writes (capitals, brackets, newlines).
CHARS = string.ascii_letters + string.digits + " +-*=:.,?!'[]()_\n"
SOLUTION = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]


def play(env, scripts: list[list[str]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Step every row through its scripted turns (token by token, each turn ended by
    the stop token) until every episode is over; the returns and the last observation."""
    tok = env.tokenizer
    streams = [
        [
            i
            for turn in turns
            for i in tok(turn, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ]
        for turns in scripts
    ]
    obs, _ = env.reset(seed=0)
    returns = torch.zeros(env.num_envs)
    done = torch.zeros(env.num_envs, dtype=torch.bool)
    for position in range(max(map(len, streams))):
        actions = [s[position] if position < len(s) else tok.eos_token_id for s in streams]
        obs, reward, terminated, truncated, _ = env.step(torch.tensor(actions))
        returns += reward
        done |= terminated | truncated
        if bool(done.all()):
            break
    return returns, obs


def main() -> list[float]:
    """Play two Tower of Hanoi episodes; returns their returns (both 1.0: solved)."""
    env = gym.make_vec(
        TASK,
        num_envs=2,
        group_size=1,
        autoreset=False,
        split="all",
        tokenizer=make_char_tokenizer(CHARS),
    )
    print(f"{TASK}: the prompt is the game's opening\n{env.prompt_source[0]}")
    returns, obs = play(env, [SOLUTION, ["[B C]", *SOLUTION]])  # B is empty
    text = env.tokenizer.decode(obs["input_ids"][1][obs["attention_mask"][1].bool()])
    print("row 1's episode as its buffer holds it (<eos> ends a policy turn):")
    print(text)
    print(f"returns: {returns.tolist()}")
    return returns.tolist()


if __name__ == "__main__":
    main()
