"""EchoTurn: the environment says a letter; the policy's next turn must repeat it.

The smallest task that cannot be solved without reading what the environment
said, meant as a sanity check of multi-turn training (does the policy condition
on the observation?). An episode has two policy turns:

1. the prompt ``"say anything, then repeat the letter i say."``; the policy writes
   any turn (it only has to end it, with a stop id, within the budget);
2. the responder (role ``"user"``) answers with the episode's secret letter, bare
   (``"c"``, no newline after it, so the answer follows it directly); the
   policy's second turn must be that letter: ``R = 1`` if the turn's text,
   whitespace stripped, equals it (case-insensitive), else 0. The episode ends
   there.

With the character tokenizer an episode's buffer reads
``say anything, then repeat the letter i say.\n`` ``ok<eos>`` ``[c]`` ``c<eos>``
(the environment's token in brackets).

Reward: 1 or 0 on the second turn, 0 on the first; an episode the env truncates
(out of budget before the second turn ends) returns 0. Range ``[0, 1]``. Every
prompt has the same text, so a policy that ignores the observation scores
``1/len(letters)`` at best (0.25 with the default ``"abcd"``). Solved: ``R >= 0.9``.

Which letter: the prompt source's ``letter`` column gives each game a first
letter (``num_games`` records, record ``i`` holding ``letters[i % len(letters)]``,
split into train/eval under ``data_seed``). With ``spread=True`` (the default) the
episodes of one game that start together (a group of ``group_size`` rows) hear
the letters in turn from there: the ``j``-th hears ``letters[(first + j) %
len(letters)]``, so a group of ``len(letters)`` rows hears every letter once. A
policy cannot tell its row apart, so this hides nothing from it; what it changes
is the credit: a policy that always answers ``"a"`` is right in some rows of a
group and wrong in the others, and a group-relative baseline (GRPO, RLOO)
rewards answering ``"a"`` exactly where ``"a"`` was said. With ``spread=False``
a whole group hears one letter, and such a policy scores all 1 or all 0 in every
group: no advantage, and GRPO on a tiny model stalls at the blind 0.25 (seed 0,
150 iterations, measured while this task was designed).

For a tiny model trained from scratch, a small vocabulary makes the task quick:
``tokenizer=make_char_tokenizer("abcd")`` leaves five legal ids (``<eos>`` and
the letters), so a random turn ends after a few tokens and a random second turn
is right one time in 25 (the prompt's characters read as ``<unk>``, the same in
every episode); ``tests/multi_turn/test_learning_multi_turn.py`` trains GRPO,
RLOO and PPO on it in under 100 iterations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmgym.envs.options import EnvOptions
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import build_env, task_factory
from lmgym.envs.tasks._chat import ChatSplit, chat_prompt
from lmgym.envs.tasks.multi_turn._common import Reply, check_num_games, column, split_records
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.envs.turns import EpisodeStart, TurnInput, TurnOutput

SOLVED_THRESHOLD = 0.9
DEFAULT_LETTERS = "abcd"
DEFAULT_MAX_TURNS = 2
DEFAULT_MAX_NEW_TOKENS = 16


def check_letters(letters: str) -> str:
    """``letters`` if it is at least two distinct (case-insensitive) single letters.

    Raises:
        ValueError: fewer than two, a repeat, or a character that is not a letter.
    """
    if (
        not isinstance(letters, str)
        or len(letters) < 2
        or not letters.isalpha()
        or len(set(letters.lower())) != len(letters)
    ):
        raise ValueError(
            f"letters={letters!r}: need at least two distinct letters (case-insensitive), "
            "e.g. 'abcd'"
        )
    return letters


@dataclass(frozen=True)
class EchoTurn:
    """The responder: says the episode's letter after turn 1, scores turn 2.

    The state of an episode is its letter (a one-character ``str``, read from the
    prompt source's ``column`` at ``start``); it never changes.

    Args:
        letters: the letters an episode's secret may be (``start`` refuses others).
        column: the prompt-source column holding each game's (first) letter.
        spread: the ``j``-th episode of one game in a ``start`` call hears the
            letter ``j`` places after the game's, cyclically (see the module
            docstring); ``False``: every episode of a game hears the game's letter.

    Raises:
        ValueError: ``letters`` is not at least two distinct letters.
    """

    letters: str = DEFAULT_LETTERS
    column: str = "letter"
    spread: bool = True
    role: Literal["user"] = "user"

    def __post_init__(self) -> None:
        check_letters(self.letters)

    def start(self, episodes: EpisodeStart) -> list[str]:
        """Each new episode's letter: its game's, from the ``column`` column, moved
        on by its place among the episodes of that game in this call if ``spread``.

        Raises:
            KeyError: the prompt source has no such column.
            ValueError: a value that is not one of ``letters``.
        """
        values = column(episodes.columns, self.column, "EchoTurn")
        for j, letter in enumerate(values):
            if not isinstance(letter, str) or len(letter) != 1 or letter not in self.letters:
                raise ValueError(
                    f"EchoTurn: row {j}: letter {letter!r} is not one of {self.letters!r}"
                )
        if not self.spread:
            return list(values)
        seen: dict[int, int] = {}
        out = []
        for letter, game in zip(values, episodes.prompt_index.tolist(), strict=True):
            j = seen.get(game, 0)
            seen[game] = j + 1
            out.append(self.letters[(self.letters.index(letter) + j) % len(self.letters)])
        return out

    @staticmethod
    def reply(text: str, turn: int, letter: str) -> Reply:
        """The answer to one turn ``text`` (policy turn number ``turn``)."""
        if turn <= 1:
            return Reply(letter, 0.0, False, letter)
        return Reply(None, float(text.strip().lower() == letter.lower()), True, letter)

    def respond(self, turns: TurnInput) -> TurnOutput:
        """Say the letter after a first turn; score (and end) after the second.

        The letter is said bare, with no newline after it (unlike the other plain-text
        tasks' observations), so the policy's answer follows it directly."""
        replies = [
            self.reply(text, int(turn), letter)
            for text, turn, letter in zip(
                turns.turn_texts, turns.turn_index.tolist(), turns.states, strict=True
            )
        ]
        return TurnOutput(
            observations=[r.observation for r in replies],
            rewards=[r.reward for r in replies],
            done=[r.done for r in replies],
            states=[r.state for r in replies],
        )


def echo_records(
    letters: str = DEFAULT_LETTERS, num_games: int = 64, *, chat: bool = False
) -> list[dict[str, object]]:
    """``num_games`` records ``{"prompt", "letter"}``: record ``i`` holds
    ``letters[i % len(letters)]``; every prompt has the same text.

    Raises:
        ValueError: bad ``letters``, or ``num_games < 2`` (a split needs two games).
    """
    check_letters(letters)
    check_num_games(num_games)
    text = (
        "Say anything. Then I will say a letter: reply with that letter only."
        if chat
        else "say anything, then repeat the letter i say."
    )
    prompt = chat_prompt(text, chat=chat)
    return [{"prompt": prompt, "letter": letters[i % len(letters)]} for i in range(num_games)]


@dataclass(frozen=True, kw_only=True)
class EchoTurnParams(ChatSplit):
    """EchoTurn's parameters (and ``ChatSplit``'s).

    Attributes:
        letters: the secret letters (at least two, distinct).
        num_games: records (games) in the prompt source, before the split; record
            ``i`` holds ``letters[i % len(letters)]``.
        spread: the rows of a group hear different letters (see the module
            docstring); ``False``: one letter per game.
    """

    letters: str = DEFAULT_LETTERS
    num_games: int = 64
    spread: bool = True


@task_factory(EchoTurnParams, max_new_tokens=DEFAULT_MAX_NEW_TOKENS, max_turns=DEFAULT_MAX_TURNS)
def make_echo_turn_vector(options: EnvOptions, params: EchoTurnParams) -> TokenVectorEnv:
    """``lmgym/EchoTurn-v0`` as a native vector env (parameters: ``EchoTurnParams``).

    Env options:
        max_turns: policy turns per episode (default 2; the responder ends the
            episode after the second).
        max_new_tokens: token budget for both turns and the letter (default 16).
    """
    letters = params.letters
    records = echo_records(letters, params.num_games, chat=params.wants_chat(options.tokenizer))
    source = split_records(records, params)
    return build_env(
        options,
        source,
        None,
        responder=EchoTurn(letters, column="letter", spread=params.spread),
        max_new_tokens=DEFAULT_MAX_NEW_TOKENS,
    )


make_echo_turn = single_env_factory(make_echo_turn_vector)
