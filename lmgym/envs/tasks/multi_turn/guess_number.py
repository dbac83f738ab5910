"""GuessNumber: find a secret integer; after each guess the environment says
``higher`` or ``lower``.

An episode: the prompt ``"guess my number from 1 to 8. after each guess i say
higher or lower."`` (a chat prompt, ``chat_game_prompt``, also asks for one number
and shows one game played first: an instruct model asked only to guess replies with
talk, and scores 0); the policy writes a guess (a turn); the responder (role
``"user"``) reads the turn's first integer (``-?[0-9]+``; ``"4"``, ``"is it 4?"``)
and answers ``"higher"`` (the secret is larger), ``"lower"`` (smaller), or ends
the episode when the guess is right. A turn without an integer is answered
``"say a number"`` and counts as a turn. Out-of-range guesses are
answered ``higher``/``lower`` like any other.

Reward: on the turn that guesses right, ``R = 1 - (k - 1) / max_turns`` for the
``k``-th policy turn (1 for a first-turn hit, ``1/max_turns`` for a hit on the last
allowed turn); every other turn 0, and an episode the env truncates (at
``max_turns`` or out of budget) returns 0. Range ``[0, 1]``. Fewer turns are
better, so bisection beats a linear scan: over ``1..8`` bisection needs at most 4
guesses (mean 2.6, return about 0.73 with ``max_turns=6``). The task cannot be
solved above ``1/n`` on the first turn without reading the answers. Solved:
``R >= 0.7``.

The secret comes from the prompt source's ``secret`` column: ``num_games`` records
with secrets drawn uniformly under ``data_seed``, split into train/eval
(``eval_fraction``) under the same seed. Every prompt has the same text (the
prompt must not give the secret away); each record is its own game, so a group
of ``group_size`` episodes shares one secret.
"""

from __future__ import annotations

import numbers
import random
import re
from dataclasses import dataclass
from typing import Literal

from lmgym.envs.options import EnvOptions
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import build_env, task_factory
from lmgym.envs.tasks._chat import ChatSplit, chat_prompt
from lmgym.envs.tasks.multi_turn._common import (
    Reply,
    check_num_games,
    column,
    split_records,
    turn_output,
)
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.envs.turns import EpisodeStart, TurnInput, TurnOutput

SOLVED_THRESHOLD = 0.7
DEFAULT_MAX_TURNS = 6
DEFAULT_MAX_NEW_TOKENS = 64
_INTEGER = re.compile(r"-?\d+")


def first_integer(text: str) -> int | None:
    """The first integer written in ``text`` (``-?[0-9]+``), or ``None``."""
    match = _INTEGER.search(text)
    return int(match.group()) if match else None


@dataclass(frozen=True)
class GuessNumber:
    """The responder: ``higher`` / ``lower`` after each wrong guess, done on the right one.

    The state of an episode is its secret (an ``int``, read from the prompt source's
    ``column`` at ``start``); it never changes.

    Args:
        low: smallest possible secret.
        high: largest possible secret.
        max_turns: the turn limit the reward formula counts against (the env's
            ``max_turns``): ``R = 1 - (k - 1) / max_turns`` for a hit on turn ``k``.
        column: the prompt-source column holding each game's secret.

    Raises:
        ValueError: ``low > high`` or ``max_turns < 1``.
    """

    low: int = 1
    high: int = 8
    max_turns: int = DEFAULT_MAX_TURNS
    column: str = "secret"
    role: Literal["user"] = "user"

    def __post_init__(self) -> None:
        if not isinstance(self.low, int) or not isinstance(self.high, int) or self.low > self.high:
            raise ValueError(
                f"low={self.low!r}, high={self.high!r}: need integers with low <= high"
            )
        if not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"max_turns={self.max_turns!r}: must be a positive integer")

    def score(self, turn: int) -> float:
        """The reward of a right guess on policy turn ``turn`` (1-based)."""
        return max(0.0, 1.0 - (turn - 1) / self.max_turns)

    def start(self, episodes: EpisodeStart) -> list[int]:
        """Each new episode's secret, from the ``column`` column.

        Raises:
            KeyError: the prompt source has no such column.
            ValueError: a secret that is not an integer in ``[low, high]``.
        """
        secrets = column(episodes.columns, self.column, "GuessNumber")
        out = []
        for j, secret in enumerate(secrets):
            if isinstance(secret, bool) or not isinstance(secret, numbers.Integral):
                raise ValueError(f"GuessNumber: row {j}: secret {secret!r} is not an integer")
            secret = int(secret)
            if not self.low <= secret <= self.high:
                raise ValueError(
                    f"GuessNumber: row {j}: secret {secret} is outside [{self.low}, {self.high}]; "
                    "widen low/high or fix the prompt source's secrets"
                )
            out.append(secret)
        return out

    def reply(self, text: str, turn: int, secret: int) -> Reply:
        """The answer to one turn ``text`` (policy turn number ``turn``)."""
        guess = first_integer(text)
        if guess is None:
            return Reply("say a number", 0.0, False, secret)
        if guess == secret:
            return Reply(None, self.score(turn), True, secret)
        return Reply("higher" if secret > guess else "lower", 0.0, False, secret)

    def respond(self, turns: TurnInput) -> TurnOutput:
        """Answer each row's guess (see the module docstring)."""
        return turn_output(
            [
                self.reply(text, int(turn), secret)
                for text, turn, secret in zip(
                    turns.turn_texts, turns.turn_index.tolist(), turns.states, strict=True
                )
            ],
            turns.prompts,
        )


def chat_game_prompt(low: int, high: int) -> list[dict[str, str]]:
    """The chat prompt: the rules, one demonstrated game (bisection, three guesses),
    then a new game.

    Measured on SmolLM2-135M-Instruct (16 held-out games of 1..8, 96 tokens): asked
    only to guess, it answers with talk ("I'm ready to play. What number would you
    like to guess?"), greedy 0.00 and sampled 0.06 even when told "Reply with one
    number only"; after the demonstrated game it plays, greedy 0.49 (it counts up
    from 1) and sampled 0.14: a signal for group-relative agents, and room to learn
    bisection (benchmarks/results/real_model/base/guess.json).
    """
    rules = (
        f"Let's play a game: I'm thinking of a number from {low} to {high}. Guess it. "
        "Reply with one number only. After each guess I say higher or lower."
    )
    # Bisection on a secret in the upper half: the middle ("higher"), the middle of
    # the rest ("lower" when it overshoots), then the secret; fewer when the range
    # is too narrow to tell them apart.
    mid = (low + high) // 2
    secret = (mid + high + 1) // 2
    guesses = list(dict.fromkeys([mid, (secret + high + 1) // 2, secret]))
    replies = ["higher" if guess < secret else "lower" for guess in guesses[:-1]]
    demo = list(zip([rules, *replies], map(str, guesses), strict=True))
    return chat_prompt(f"Correct. New game. {rules}", shots=demo)


def guess_number_records(
    low: int = 1, high: int = 8, num_games: int = 64, data_seed: int = 0, *, chat: bool = False
) -> list[dict[str, object]]:
    """``num_games`` records ``{"prompt", "secret"}``, secrets uniform in ``[low, high]``
    under ``data_seed``; every prompt has the same text.

    Raises:
        ValueError: ``num_games < 2`` (a train/eval split needs two games).
    """
    check_num_games(num_games)
    if chat:
        prompt = chat_game_prompt(low, high)
    else:  # the character tokenizer's alphabet: lowercase, digits and .,:-
        question = f"guess my number from {low} to {high}. after each guess i say higher or lower."
        prompt = chat_prompt(question, chat=False)
    rng = random.Random(data_seed)
    return [{"prompt": prompt, "secret": rng.randint(low, high)} for _ in range(num_games)]


@dataclass(frozen=True, kw_only=True)
class GuessNumberParams(ChatSplit):
    """GuessNumber's parameters (and ``ChatSplit``'s; ``data_seed`` also seeds the
    secrets).

    Attributes:
        low: smallest secret.
        high: largest secret.
        num_games: records (games) in the prompt source, before the split.
    """

    low: int = 1
    high: int = 8
    num_games: int = 64


@task_factory(GuessNumberParams, max_new_tokens=DEFAULT_MAX_NEW_TOKENS, max_turns=DEFAULT_MAX_TURNS)
def make_guess_number_vector(options: EnvOptions, params: GuessNumberParams) -> TokenVectorEnv:
    """``lmgym/GuessNumber-v0`` as a native vector env (parameters: ``GuessNumberParams``).

    Env options:
        max_turns: policy turns per episode (default 6; the reward counts against it).
        max_new_tokens: token budget for the policy's turns and the answers (default 64).
    """
    low, high = params.low, params.high
    responder = GuessNumber(
        low, high, max_turns=options.max_turns or max(1, high - low + 1), column="secret"
    )
    chat = params.wants_chat(options.tokenizer)
    records = guess_number_records(low, high, params.num_games, params.data_seed, chat=chat)
    source = split_records(records, params)
    return build_env(
        options, source, None, responder=responder, max_new_tokens=DEFAULT_MAX_NEW_TOKENS
    )


make_guess_number = single_env_factory(make_guess_number_vector)
