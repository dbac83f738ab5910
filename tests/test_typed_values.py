"""The one converter (``lmgym.typed_values``): a table of what each annotation takes from
every source and of the error each refused value gets.

Sources: a command-line string (a flag's value, ``--env KEY=VALUE`` that is not JSON),
a JSON/YAML value (a config file, a run's ``config.json``, ``--env`` JSON), both read
by ``parse_value``; and a Python value (a config built in code), checked by
``check_value``. The call sites are tested in ``tests/cli/test_flags.py``,
``tests/training/test_env_args.py`` and ``tests/reliability/test_cli_errors.py``.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, Literal

import pytest

from lmgym.agents.config import AgentConfig, check_types, config_from_dict, restore_types
from lmgym.typed_values import (
    FALSE_WORDS,
    TRUE_WORDS,
    FieldValueError,
    check_value,
    describe,
    parse_value,
)

Ids = Sequence[int | str] | Literal["all"]  # the shape of allowed_special_tokens
Pair = tuple[float, float]


class Marker:
    """A type the converter does not know: its values pass unchanged."""


MARKER = Marker()

# (annotation, raw, expected): parse_value(raw) == expected, with the same type.
PARSED = [
    # bool: the words true/false/yes/no/1/0 in any case, JSON booleans, 1/0
    (bool, "true", True),
    (bool, "False", False),
    (bool, "YES", True),
    (bool, "no", False),
    (bool, "1", True),
    (bool, "0", False),
    (bool, True, True),
    (bool, 0, False),
    # int: an integer or its text
    (int, "3", 3),
    (int, "-2", -2),
    (int, 7, 7),
    # float: a finite number or its text, as a float
    (float, "3.0e-4", 3e-4),
    (float, "-2", -2.0),
    (float, 2, 2.0),
    (float, 0.5, 0.5),
    # str: a string; a number or boolean as its JSON text
    (str, "abc", "abc"),
    (str, "none", "none"),
    (str, 123, "123"),
    (str, 1.5, "1.5"),
    (str, True, "true"),
    # Literal: a value, or a value's text
    (Literal["a", "b"], "b", "b"),
    (Literal[1, 2], "2", 2),
    (Literal[1, 2], 1, 1),
    # X | None: None and the words none/null
    (int | None, None, None),
    (int | None, "none", None),
    (int | None, "NULL", None),
    (int | None, "5", 5),
    (str | None, "none", None),
    (str | None, "x", "x"),
    (Literal["ansi"] | None, "ansi", "ansi"),
    # A | B: the member the value already is, else the first that takes it
    (int | str, "5", "5"),
    (int | str, 5, 5),
    (Ids, "all", "all"),
    (Ids, ["<pad>", 5, "7"], ["<pad>", 5, "7"]),
    # lists: a list, or one value as a list of one (a string is never split)
    (list[str], ["q_proj", "v_proj"], ["q_proj", "v_proj"]),
    (list[str], "q_proj", ["q_proj"]),
    (list[str], ("a",), ["a"]),
    (Sequence[int], ["1", 2], [1, 2]),
    (Sequence[int] | None, 5, [5]),
    (Sequence[int] | None, "none", None),
    (Ids, "<pad>", ["<pad>"]),
    (tuple[int, ...], [1, "2"], (1, 2)),
    # fixed tuples: exactly that many values, as a tuple
    (Pair, [0.9, "0.95"], (0.9, 0.95)),
    (Pair, (1, 2), (1.0, 2.0)),
    # mappings
    (dict[str, Any], {"reward_mode": "per_token"}, {"reward_mode": "per_token"}),
    (dict[str, int], {"a": "1"}, {"a": 1}),
    # anything else: unchanged
    (Any, "5", "5"),
    (Marker, MARKER, MARKER),
    (object, MARKER, MARKER),
]


@pytest.mark.parametrize(("annotation", "raw", "expected"), PARSED)
def test_parse_value_converts(annotation, raw, expected):
    value = parse_value("f", raw, annotation)
    assert value == expected
    assert type(value) is type(expected)


# (annotation, raw, message): parse_value refuses raw with exactly this message.
REFUSED = [
    (bool, "maybe", "f='maybe': expected true or false"),
    (bool, "t", "f='t': expected true or false"),
    (bool, "y", "f='y': expected true or false"),
    (bool, 2, "f=2: expected true or false"),
    (bool, None, "f=None: expected true or false"),
    (bool, "", "f='': expected true or false"),
    (int, "2.5", "f='2.5': expected an integer"),
    (int, 2.5, "f=2.5: expected an integer"),
    (int, 3.0, "f=3.0: expected an integer"),
    (int, True, "f=True: expected an integer"),
    (float, "fast", "f='fast': expected a number"),
    (float, True, "f=True: expected a number"),
    (float, [1], "f=[1]: expected a number"),
    (float, "nan", "f='nan': must be a finite number"),
    (float, "-inf", "f='-inf': must be a finite number"),
    (float | None, float("nan"), "f=nan: must be a finite number"),
    (str, None, "f=None: expected a string"),
    (str, ["a"], "f=['a']: expected a string"),
    (Literal["a", "b"], "c", "f='c' is not one of ['a', 'b']"),
    (Literal[1, 2], True, "f=True is not one of [1, 2]"),
    (Literal["ansi"] | None, "human", "f='human' is not one of ['ansi'] or none"),
    (int | None, "big", "f='big': expected an integer or none"),
    (float | None, "big", "f='big': expected a number or none"),
    (Sequence[int], [1, "x"], "f=[1, 'x']: expected a list (an integer each)"),
    (Sequence[int], None, "f=None: expected a list (an integer each)"),
    (list[str], {"a": 1}, "f={'a': 1}: expected a list (a string each)"),
    (
        Ids,
        {"pad": 0},
        "f={'pad': 0}: expected a list (an integer or a string each) or one of ['all']",
    ),
    (Pair, [0.9], "f=[0.9]: expected a list of 2 values (a number each)"),
    (Pair, 0.9, "f=0.9: expected a list of 2 values (a number each)"),
    (tuple[int, str], [1], "f=[1]: expected a list of 2 values (an integer, a string)"),
    (dict[str, Any], [1], "f=[1]: expected a mapping"),
]


@pytest.mark.parametrize(("annotation", "raw", "message"), REFUSED)
def test_parse_value_refuses_with_one_message(annotation, raw, message):
    with pytest.raises(FieldValueError) as error:
        parse_value("f", raw, annotation)
    assert str(error.value) == message


# (annotation, value): check_value takes a Python value of the type as it is.
CHECKED = [
    (bool, True),
    (int, 3),
    (float, 3),
    (float, 0.5),
    (str, "x"),
    (Literal["a", "b"], "a"),
    (int | None, None),
    (Pair, (0.9, 0.95)),
    (Pair, [0.9, 0.95]),
    (list[str], ["a"]),
    (dict[str, Any], {}),
    (Marker, "anything"),
]


@pytest.mark.parametrize(("annotation", "value"), CHECKED)
def test_check_value_takes_values_of_the_type(annotation, value):
    check_value("f", value, annotation)


# (annotation, value, message): check_value converts nothing, so text is refused.
CHECK_REFUSED = [
    (bool, "false", "f='false': expected True or False"),
    (bool, 0, "f=0: expected True or False"),
    (int, True, "f=True: expected an integer"),
    (int, 1.5, "f=1.5: expected an integer"),
    (int, "3", "f='3': expected an integer"),
    (float, "0.5", "f='0.5': expected a number"),
    (float, float("inf"), "f=inf: must be a finite number"),
    (float | None, float("nan"), "f=nan: must be a finite number"),
    (str, 5, "f=5: expected a string"),
    (Literal["a", "b"], "c", "f='c' is not one of ['a', 'b']"),
    (int | None, "none", "f='none': expected an integer or None"),
    (list[str], "a", "f='a': expected a list (a string each)"),
    (Pair, (0.9,), "f=(0.9,): expected a list of 2 values (a number each)"),
]


@pytest.mark.parametrize(("annotation", "value", "message"), CHECK_REFUSED)
def test_check_value_refuses_with_one_message(annotation, value, message):
    with pytest.raises(FieldValueError) as error:
        check_value("f", value, annotation)
    assert str(error.value) == message


def test_without_choices_a_literal_of_strings_takes_any_string():
    check_value("f", "c", Literal["a", "b"], choices=False)
    with pytest.raises(FieldValueError, match=r"f=5: expected one of \['a', 'b'\]"):
        check_value("f", 5, Literal["a", "b"], choices=False)


def test_the_bool_words_are_one_documented_set():
    assert TRUE_WORDS == ("true", "yes", "1") and FALSE_WORDS == ("false", "no", "0")
    for word in TRUE_WORDS + FALSE_WORDS:
        assert parse_value("f", word.upper(), bool) is (word in TRUE_WORDS)


def test_the_error_is_a_value_and_a_type_error_naming_its_source():
    with pytest.raises(FieldValueError) as error:
        parse_value("iterations", 2.5, int, where="--config c.json")
    assert isinstance(error.value, ValueError) and isinstance(error.value, TypeError)
    assert str(error.value) == "--config c.json: iterations=2.5: expected an integer"
    assert (error.value.field, error.value.given, error.value.where) == (
        "iterations",
        2.5,
        "--config c.json",
    )
    copy = pickle.loads(pickle.dumps(error.value))  # crosses process boundaries intact
    assert str(copy) == str(error.value)


def test_describe_words_text_and_python_values():
    assert describe(bool | None) == "true or false or none"
    assert describe(bool | None, python=True) == "True or False or None"


# ------------------------------------------------------------- config dataclasses
def test_a_stored_config_is_read_back_by_the_converter():
    config = config_from_dict(
        AgentConfig, {"adam_betas": [0.8, 0.9], "whiten_advantages": "false", "seed": "3"}
    )
    assert config.adam_betas == (0.8, 0.9)
    assert config.whiten_advantages is False and config.seed == 3
    assert restore_types(AgentConfig, {"not_a_field": [1]}) == {"not_a_field": [1]}
    with pytest.raises(FieldValueError, match="^update_epochs=2.5: expected an integer$"):
        config_from_dict(AgentConfig, {"update_epochs": 2.5})


def test_a_config_built_in_python_is_checked_not_converted():
    with pytest.raises(TypeError, match="^whiten_advantages='false': expected True or False$"):
        check_types(AgentConfig(whiten_advantages="false"))  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"^kl_placement='both' is not one of \['reward', 'loss'\]$"
    ):
        check_types(AgentConfig(kl_placement="both"))  # type: ignore[arg-type]
