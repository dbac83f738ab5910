"""``--env KEY=VALUE`` values are typed from ``EnvOptions``'s fields (an env option)
or the task's own parameter annotations, by the one converter (``lmgym.typed_values``),
with one-line errors that name the key, the value and the expected type."""

from __future__ import annotations

import gymnasium as gym
import pytest

import lmgym  # noqa: F401  (registers the tasks)
from lmgym.envs.options import ENV_OPTION_NAMES, OPTION_TYPES
from lmgym.training.env_args import check_env_kwargs

TASK = "lmgym/TargetString-v0"


def test_every_option_has_a_type_from_the_dataclass():
    assert tuple(OPTION_TYPES) == ENV_OPTION_NAMES
    assert OPTION_TYPES["max_new_tokens"] == int | None


def test_values_are_converted_to_the_option_types():
    assert check_env_kwargs(
        TASK,
        {
            "autoreset": "no",
            "center_potential": 1,
            "max_new_tokens": "6",
            "max_prompt_length": "none",
            "unfinished_penalty": "-2",
            "stop_token_ids": [1, 2],
            "allowed_special_tokens": ["<pad>", 5, "7"],
            "target": "abc",
        },
    ) == {
        "autoreset": False,
        "center_potential": True,
        "max_new_tokens": 6,
        "max_prompt_length": None,
        "unfinished_penalty": -2.0,
        "stop_token_ids": [1, 2],
        "allowed_special_tokens": ["<pad>", 5, "7"],  # a name stays a name
        "target": "abc",
    }
    assert check_env_kwargs(TASK, {"allowed_special_tokens": "all"}) == {
        "allowed_special_tokens": "all"
    }
    # One value where a list is expected is a list of one, as in a config file.
    assert check_env_kwargs(TASK, {"allowed_special_tokens": "<pad>", "stop_token_ids": 5}) == {
        "allowed_special_tokens": ["<pad>"],
        "stop_token_ids": [5],
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": True}, "env argument max_new_tokens=True: expected an integer or none"),
        ({"center_potential": 2}, "env argument center_potential=2: expected true or false"),
        ({"unfinished_penalty": "low"}, "env argument unfinished_penalty='low': expected a number"),
        (
            {"stop_token_ids": [1, "x"]},
            "env argument stop_token_ids=[1, 'x']: expected a list (an integer each) or none",
        ),
        (
            {"allowed_special_tokens": {"pad": 0}},
            "env argument allowed_special_tokens={'pad': 0}: expected a list (an integer or a "
            "string each) or one of ['all']",
        ),
        (
            {"prompt_order": "random"},
            "env argument prompt_order='random' is not one of ['shuffle', 'sequential']",
        ),
        (
            {"unfinished_penalty": "nan"},
            "env argument unfinished_penalty='nan': must be a finite number",
        ),
    ],
)
def test_a_value_of_the_wrong_type_names_the_key_and_the_type(kwargs, message):
    with pytest.raises(ValueError) as error:
        check_env_kwargs(TASK, kwargs)
    assert str(error.value) == message


def test_a_factory_taking_kwargs_still_gets_typed_options():
    def make(num_envs: int = 1, group_size: int = 1, **kwargs: object) -> None:
        raise AssertionError("not built")

    gym.register("argtest/Any-v0", vector_entry_point=make)
    try:
        assert check_env_kwargs("argtest/Any-v0", {"autoreset": "yes", "colour": "red"}) == {
            "autoreset": True,
            "colour": "red",
        }
        with pytest.raises(ValueError, match="env argument autoreset='maybe': expected true"):
            check_env_kwargs("argtest/Any-v0", {"autoreset": "maybe"})
    finally:
        del gym.registry["argtest/Any-v0"]


def test_a_task_parameter_is_typed_by_its_annotation():
    assert check_env_kwargs("lmgym/LengthControl-v0", {"max_length": "5"}) == {"max_length": 5}
    with pytest.raises(ValueError, match=r"env argument tolerance='wide': expected a number"):
        check_env_kwargs("lmgym/LengthControl-v0", {"tolerance": "wide"})


@pytest.mark.parametrize(
    ("key", "flag"),
    [("num_envs", "--num-prompts x --group-size"), ("num_prompts", "--num-prompts")],
)
def test_the_batch_is_set_by_the_run_not_by_env(key, flag):
    with pytest.raises(ValueError) as error:
        check_env_kwargs(TASK, {key: "4"})
    assert str(error.value) == f"env argument {key}: set by the run ({flag}), not an env argument"


def test_an_unknown_key_names_the_closest_argument():
    with pytest.raises(ValueError, match=r"takes no such argument; did you mean target\? valid: "):
        check_env_kwargs(TASK, {"targt": "abc"})


def test_a_data_split_field_is_typed_from_the_shared_record():
    assert check_env_kwargs("lmgym/Reverse-v0", {"eval_fraction": "0.5", "data_seed": "3"}) == {
        "eval_fraction": 0.5,
        "data_seed": 3,
    }
    with pytest.raises(ValueError, match=r"env argument split='test' is not one of \['train', "):
        check_env_kwargs("lmgym/Reverse-v0", {"split": "test"})
