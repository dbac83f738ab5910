"""Built-in tasks, each registered as ``lmgym/<Name>-v0`` (see ``lmgym.envs.registration``).

| id                               | reward                                  | random | solved  |
|----------------------------------|-----------------------------------------|--------|---------|
| ``lmgym/TargetString-v0``        | fraction of target tokens in place      | 0.02   | >= 0.9  |
| ``lmgym/Reverse-v0``             | fraction of answer tokens in place      | 0.02   | >= 0.9  |
| ``lmgym/Sort-v0``                | fraction of answer tokens in place      | 0.02   | >= 0.9  |
| ``lmgym/CopyRule-v0``            | fraction of answer tokens in place      | 0.02   | >= 0.9  |
| ``lmgym/Arithmetic-v0``          | exact match (outcome), 0 or 1           | 0.0    | >= 0.9  |
| ``lmgym/ArithmeticProcess-v0``   | 1/K per correct digit (process)         | 0.02   | >= 0.9  |
| ``lmgym/LengthControl-v0``       | ``max(0, 1 - |T - n| / 4)``             | 0.07   | >= 0.9  |
| ``lmgym/Preference-v0``          | learned reward model, win rate          | 0.36   | >= 0.9  |
| ``lmgym/SemanticSimilarity-v0``  | cosine similarity, all-MiniLM-L6-v2     | 0.18   | >= 0.8  |
| ``lmgym/WordProblem-v0``         | exact match with the ``answer`` column  | 0.0    | >= 0.9  |

Chat tasks for a real instruct model (chat prompts through the tokenizer's chat
template; plain text on a tokenizer without one), each with its base score for
SmolLM2-135M-Instruct on its eval split (``TaskInfo.base_score``):

| id                                  | reward                                   | random | solved  |
|-------------------------------------|------------------------------------------|--------|---------|
| ``lmgym/ChatArithmetic-v0``         | the reply's last number is the answer    | 0.04   | >= 0.9  |
| ``lmgym/Instructions-v0``           | mean of 5 checkable constraints          | 0.31   | >= 0.9  |
| ``lmgym/PositiveContinuation-v0``   | VADER compound sentiment, ``[-1, 1]``    | 0.0    | >= 0.8  |

Each module's docstring states the reward, its range, the random-policy baseline
and the solved threshold; each has a vector factory ``make_<task>_vector`` (made
with ``lmgym.envs.task_factory``: the task's parameters plus every ``EnvOptions``
field) and a single-env factory ``make_<task>``. ``random_policy_return`` measures a baseline.
"""

from lmgym.envs.tasks._common import (
    ExactMatchReward,
    PositionMatchReward,
    random_policy_return,
)

__all__ = ["ExactMatchReward", "PositionMatchReward", "random_policy_return"]
