"""Instructions: verifiable instruction following (in the spirit of IFEval and RLVR).

Each prompt asks for a sentence about a topic under checkable constraints, e.g.::

    Write one sentence about the ocean. Rules:
    - Use exactly 6 words.
    - Use only lowercase letters.
    - Include the word "blue".
    - Do not use any commas.
    - Put your answer between <answer> and </answer>.

The constraints (``constraints=``, any of the five, in this order):

- ``word_count``: exactly ``n`` words (``n`` drawn from ``[min_words, max_words]``);
  a word is a run of letters or digits, ``'`` and ``-`` joining runs
  (``"don't"``, ``"well-known"``: one word each);
- ``lowercase``: no uppercase letter, and at least one letter;
- ``include_word``: the prompt's word appears as a whole word (any case);
- ``no_commas``: no ``,`` and at least one word;
- ``answer_tags``: the whole reply, whitespace stripped, is one
  ``<answer>...</answer>`` span with a word inside.

By default (``examples=1``) one worked example leads the prompt: the same kind of
request about another topic and a reply that meets every rule, as a user and an
assistant turn. SmolLM2-135M-Instruct never writes the tags nor keeps to
lowercase without it (so no completion of a group shows the way); with it, a few
do (eval split, mean reward greedy/T=1: 0.25/0.27 with the example, 0.21/0.17
without). ``examples=0`` and ``strict=True`` are the harder levels.

Every constraint but ``answer_tags`` is checked on the *answer*: the text inside
the first ``<answer>...</answer>`` of the reply if it has one, else the whole
reply. An empty answer satisfies nothing (no free credit for saying nothing).

Reward: one component per constraint (1 if satisfied, else 0), each a
``FunctionReward`` named after the constraint, combined by ``CombinedReward`` with
weight ``1/K``: ``R = (1/K) * sum_k c_k``, the share of the ``K`` constraints
satisfied, and the components are logged apart (``reward/word_count``, ...,
through ``lmgym.envs.reward_component_means``). With ``strict=True`` (IFEval's
prompt-level strict accuracy, the harder level) ``R = 1`` only when every
constraint holds, else 0; the components are logged the same way. Range
``[0, 1]``; bandit mode is the meaningful one.

Random-policy baseline (the character tokenizer's uniform token ids, plain-text
prompts): about 0.31, nearly all of it ``lowercase`` and ``no_commas`` (that
vocabulary has no capital letters, and often no comma falls in a random string);
it cannot write ``<``, so ``answer_tags`` stays 0. Solved: ``R >= 0.9``.

Prompts are chat conversations when the tokenizer has a chat template
(``chat=True``/``False`` forces either way; plain text otherwise); pass
``stop_token_ids=policy.stop_token_ids``. ``split`` holds out ``eval_fraction`` of
``dataset_size`` distinct prompts drawn under ``data_seed``. Default budget: 48
tokens (a six-word sentence in tags takes about 20 with SmolLM2's tokenizer).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor

from lmgym.envs.options import EnvOptions
from lmgym.envs.prompts import RecordPrompts
from lmgym.envs.rewards import CombinedReward, FunctionReward
from lmgym.envs.single import single_env_factory
from lmgym.envs.task_factory import build_env, task_factory
from lmgym.envs.tasks._chat import ChatSplit, chat_prompt, distinct_draws
from lmgym.envs.token_env import TokenVectorEnv
from lmgym.types import Prompt, RewardInput

SOLVED_THRESHOLD = 0.9
DEFAULT_MAX_NEW_TOKENS = 48
CONSTRAINTS = ("word_count", "lowercase", "include_word", "no_commas", "answer_tags")
TOPICS = (
    "the ocean", "a rainy day", "your favorite food", "a city at night", "a small dog",
    "the moon", "a winter morning", "an old book", "a summer garden", "a train ride",
    "a busy market", "the mountains", "a cup of coffee", "a lost key", "a birthday party",
    "the desert", "a quiet library", "a river", "a football game", "an autumn forest",
    "a new bicycle", "the stars", "a school bus", "a sleepy cat", "a fishing boat",
    "a snowy road", "a music concert", "a lighthouse", "a kitchen", "a thunderstorm",
)  # fmt: skip
WORDS = (
    "blue", "happy", "green", "light", "water", "sun", "quiet", "warm", "cold", "bright",
    "soft", "tree", "road", "home", "fast", "sweet", "dark", "gold", "wind", "song",
    "stone", "smile", "bread", "fire", "cloud", "small", "river", "sky", "morning", "friend",
)  # fmt: skip
EXAMPLES = (
    ("a garden", 5, "green", "the green garden smells sweet"),
    ("a bakery", 4, "bread", "fresh bread smells good"),
)
"""Worked examples ``(topic, n, word, sentence)``: each sentence meets every rule."""
RULES = {
    "word_count": "Use exactly {num_words} words.",
    "lowercase": "Use only lowercase letters.",
    "include_word": 'Include the word "{word}".',
    "no_commas": "Do not use any commas.",
    "answer_tags": "Put your answer between <answer> and </answer>.",
}
_WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")
_TAGGED = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


# ----------------------------------------------------------------- the checks
def answer_text(completion: str) -> str:
    """The text inside the first ``<answer>...</answer>``, else the whole completion;
    whitespace stripped."""
    match = _TAGGED.search(completion)
    return (match.group(1) if match else completion).strip()


def words(text: str) -> list[str]:
    """The words of ``text`` (runs of letters/digits, ``'`` and ``-`` joining runs)."""
    return _WORD.findall(text)


def word_count(
    prompts: Sequence[Prompt], completions: Sequence[str], num_words: Sequence[int]
) -> list[float]:
    """1.0 where the answer has exactly ``num_words`` words, else 0.0."""
    return [
        float(len(words(answer_text(c))) == n) for c, n in zip(completions, num_words, strict=True)
    ]


def lowercase(prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
    """1.0 where the answer has a letter and no uppercase letter, else 0.0."""
    out = []
    for c in completions:
        text = answer_text(c)
        out.append(float(any(ch.isalpha() for ch in text) and text == text.lower()))
    return out


def include_word(
    prompts: Sequence[Prompt], completions: Sequence[str], word: Sequence[str]
) -> list[float]:
    """1.0 where ``word`` is one of the answer's words (any case), else 0.0."""
    return [
        float(w.lower() in {x.lower() for x in words(answer_text(c))})
        for c, w in zip(completions, word, strict=True)
    ]


def no_commas(prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
    """1.0 where the answer has a word and no comma, else 0.0."""
    return [float(bool(words(t)) and "," not in t) for t in map(answer_text, completions)]


def answer_tags(prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
    """1.0 where the whole completion (stripped) is one ``<answer>...</answer>`` span
    with a word inside, else 0.0."""
    out = []
    for c in completions:
        match = _TAGGED.fullmatch(c.strip())
        out.append(float(match is not None and bool(words(match.group(1)))))
    return out


CHECKS: dict[str, Callable[..., list[float]]] = {
    "word_count": word_count,
    "lowercase": lowercase,
    "include_word": include_word,
    "no_commas": no_commas,
    "answer_tags": answer_tags,
}


# ----------------------------------------------------------------- the reward
class AllSatisfied:
    """1 where every component of a mean-of-constraints reward is 1, else 0 (strict).

    Wraps the ``CombinedReward`` of the constraints; its components stay logged
    apart (``last_components`` and ``pop_component_means`` are the wrapped one's).

    Args:
        combined: the constraints with weight ``1/K`` each.
    """

    def __init__(self, combined: CombinedReward) -> None:
        self.combined = combined
        self.name = "all_constraints"
        self.required_columns = combined.required_columns

    def __call__(self, batch: RewardInput) -> Tensor:
        return (self.combined(batch) >= 1.0 - 1e-6).float()

    @property
    def last_components(self) -> dict[str, Tensor]:
        return self.combined.last_components

    def pop_component_means(self) -> dict[str, float]:
        """The wrapped reward's per-constraint means (see ``CombinedReward``)."""
        return self.combined.pop_component_means()


def parse_constraints(constraints: str) -> list[str]:
    """``"word_count,no_commas"`` as a list in ``CONSTRAINTS`` order.

    Raises:
        ValueError: an unknown or repeated name, or none.
    """
    names = [name.strip() for name in constraints.split(",") if name.strip()]
    unknown = [name for name in names if name not in CONSTRAINTS]
    if not names or unknown or len(set(names)) != len(names):
        raise ValueError(
            f"constraints={constraints!r}: give distinct names separated by commas, "
            f"from {', '.join(CONSTRAINTS)}"
        )
    return [name for name in CONSTRAINTS if name in names]


def instruction_reward(
    constraints: Sequence[str], strict: bool = False
) -> CombinedReward | AllSatisfied:
    """The mean (or with ``strict``, the all-or-nothing) of the named constraints."""
    combined = CombinedReward(
        [(FunctionReward(CHECKS[name], name=name), 1.0 / len(constraints)) for name in constraints],
        name="instructions",
    )
    return AllSatisfied(combined) if strict else combined


# ----------------------------------------------------------------- the prompts
def question(constraints: Sequence[str], topic: str, num_words: int, word: str) -> str:
    """The request for a sentence about ``topic`` under the named rules."""
    rules = "\n".join(f"- {RULES[c].format(num_words=num_words, word=word)}" for c in constraints)
    return f"Write one sentence about {topic}. Rules:\n{rules}"


def example_turns(constraints: Sequence[str], examples: int) -> list[tuple[str, str]]:
    """The first ``examples`` worked examples as ``(question, answer)`` turns; each
    answer meets every rule (in tags when ``answer_tags`` is one of them).

    Raises:
        ValueError: ``examples`` outside ``[0, len(EXAMPLES)]``.
    """
    if not isinstance(examples, int) or not 0 <= examples <= len(EXAMPLES):
        raise ValueError(f"examples={examples!r}: must be an integer in [0, {len(EXAMPLES)}]")
    wrap = "<answer>{}</answer>" if "answer_tags" in constraints else "{}"
    return [
        (question(constraints, topic, n, word), wrap.format(sentence))
        for topic, n, word, sentence in EXAMPLES[:examples]
    ]


def instruction_records(
    constraints: Sequence[str],
    dataset_size: int = 400,
    min_words: int = 3,
    max_words: int = 8,
    data_seed: int = 0,
    *,
    examples: int = 1,
    chat: bool = True,
) -> list[dict[str, object]]:
    """``dataset_size`` distinct prompt records ``{"prompt", "num_words", "word"}``,
    each prompt led by ``examples`` worked examples (user/assistant turns).

    Raises:
        ValueError: a bad word range or ``dataset_size`` (the message names the field).
    """
    if (
        not isinstance(min_words, int)
        or not isinstance(max_words, int)
        or not 1 <= min_words <= max_words
    ):
        raise ValueError(
            f"min_words={min_words!r}, max_words={max_words!r}: need integers 1 <= min_words <= max_words"
        )

    def draw(rng: random.Random) -> tuple[str, int, str]:
        return rng.choice(TOPICS), rng.randint(min_words, max_words), rng.choice(WORDS)

    distinct = len(TOPICS) * (max_words - min_words + 1) * len(WORDS)
    shots = example_turns(constraints, examples)
    return [
        {
            "prompt": chat_prompt(question(constraints, topic, n, word), shots=shots, chat=chat),
            "num_words": n,
            "word": word,
        }
        for topic, n, word in distinct_draws(
            draw, dataset_size, distinct, data_seed, "dataset_size"
        )
    ]


@dataclass(frozen=True, kw_only=True)
class InstructionsParams(ChatSplit):
    """Instructions' parameters (and ``ChatSplit``'s; ``data_seed`` also seeds the
    prompts).

    Attributes:
        constraints: comma-separated names from ``CONSTRAINTS`` (default: all five).
        strict: reward 1 only when every constraint holds (default: their mean).
        examples: worked examples (a request and a reply meeting every rule) before
            the question, 0 to 2; 0 is the harder level.
        min_words, max_words: the range of the ``word_count`` constraint's ``n``.
        dataset_size: distinct prompts drawn (before the split).
    """

    constraints: str = ",".join(CONSTRAINTS)
    strict: bool = False
    examples: int = 1
    min_words: int = 3
    max_words: int = 8
    dataset_size: int = 400


@task_factory(InstructionsParams)
def make_instructions_vector(options: EnvOptions, params: InstructionsParams) -> TokenVectorEnv:
    """``lmgym/Instructions-v0`` as a native vector env (parameters:
    ``InstructionsParams``); token budget 48 by default."""
    names = parse_constraints(params.constraints)
    records = instruction_records(
        names,
        params.dataset_size,
        params.min_words,
        params.max_words,
        params.data_seed,
        examples=params.examples,
        chat=params.wants_chat(options.tokenizer),
    )
    pairs = [(record["prompt"], str(i)) for i, record in enumerate(records)]
    kept = [records[int(i)] for _, i in params.select(pairs)]
    reward = instruction_reward(names, params.strict)
    return build_env(options, RecordPrompts(kept), reward, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)


make_instructions = single_env_factory(make_instructions_vector)
