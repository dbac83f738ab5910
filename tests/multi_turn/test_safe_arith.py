"""The calculator's safe arithmetic: right values, Python's precedence, and every
non-arithmetic input refused with a message, in bounded time (never ``eval``)."""

from __future__ import annotations

import ast
import contextlib
import time
from pathlib import Path

import pytest

from lmgym.envs.tasks.multi_turn import safe_arith
from lmgym.envs.tasks.multi_turn.safe_arith import (
    MAX_DEPTH,
    MAX_DIGITS,
    MAX_LENGTH,
    CalcError,
    evaluate,
    format_number,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("12*7+3", 87),
        ("1+2*3", 7),
        ("(1+2)*3", 9),
        ("10-4-3", 3),  # left-associative
        ("2**3**2", 512),  # right-associative
        ("2^3", 8),  # a calculator's power
        ("-2**2", -4),  # ** binds tighter than a unary minus on its left
        ("(-2)**2", 4),
        ("2**-1", 0.5),
        ("--3", 3),
        ("-+-3", 3),
        ("3*-2", -6),
        ("84/4", 21),  # exact integer division stays an integer
        ("7/2", 3.5),
        ("7//2", 3),
        ("-7//2", -4),  # floor, as in Python
        ("7%3", 1),
        ("-7%3", 2),
        ("1.5*4", 6.0),
        (".5+1.", 1.5),
        ("  ( 1 + 2 ) * ( 3 - 1 )  ", 6),
        ("100 - 9 * 9 // 2", 60),
    ],
)
def test_values_follow_python_precedence(text, value):
    result = evaluate(text)
    assert result == value
    assert type(result) is type(value)


def test_decimal_results_are_formatted_like_a_calculator():
    assert format_number(evaluate("0.1+0.2")) == "0.3"
    assert format_number(evaluate("6/3")) == "2"
    assert format_number(evaluate("1.5*2")) == "3"
    assert format_number(evaluate("1/3")) == "0.333333333333"
    assert format_number(evaluate("-12*7")) == "-84"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("__import__('os')", "unexpected '_' at position 0"),
        ("abs(-3)", "unexpected 'a' at position 0"),
        ("x+1", "unexpected 'x'"),
        ("(1).real", "unexpected '.' at position 3"),
        ("1 + 2, 3", "unexpected ','"),
        ("'1'+'2'", 'unexpected "\'"'),
        ("1e5", "unexpected 'e'"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("1+", "unexpected end of expression"),
        ("(1+2", "missing ')' at end of expression"),
        ("1+2)", "unexpected ')' at position 3"),
        ("1 2", "unexpected '2' at position 2"),
        ("*3", "unexpected '*' at position 0"),
        ("1/0", "division by zero"),
        ("1//0", "division by zero"),
        ("1%0", "modulo by zero"),
        ("0**-1", "zero to a negative power"),
        ("(-8)**0.5", "not a real number"),
    ],
)
def test_everything_else_is_refused_with_a_reason(text, message):
    with pytest.raises(CalcError) as caught:
        evaluate(text)
    assert message in str(caught.value)


def test_huge_powers_are_refused_before_they_are_computed():
    start = time.perf_counter()
    for text in ("9**9**9**9", "10**100", "2**1000000000", "(10**50)**3", "9.5**100000"):
        with pytest.raises(CalcError, match="too large"):
            evaluate(text)
    assert time.perf_counter() - start < 0.5
    assert evaluate("10**99") == 10**99  # just under the bound


def test_integer_results_are_bounded_in_digits():
    big = "9" * (MAX_DIGITS - 1)
    assert evaluate(big) == int(big)
    with pytest.raises(CalcError, match="too large"):
        evaluate(f"{big}*{big}")
    with pytest.raises(CalcError, match="too large"):
        evaluate("9" * (MAX_DIGITS + 1))


def test_overlong_input_and_deep_nesting_are_refused():
    with pytest.raises(CalcError, match=f"too long: {MAX_LENGTH + 1} characters"):
        evaluate("1" + "+1" * (MAX_LENGTH // 2))
    with pytest.raises(CalcError, match="nested too deeply"):
        evaluate("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1))
    with pytest.raises(CalcError, match="nested too deeply"):
        evaluate("-" * (MAX_DEPTH + 1) + "1")
    assert evaluate("(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH) == 1


def test_worst_case_inputs_take_bounded_time():
    """The slowest inputs the bounds allow still evaluate in milliseconds."""
    worst = [
        "*".join(["9" * 9] * 20),  # long products up to the digit bound
        "+".join(["1"] * (MAX_LENGTH // 2)),
        "2**" * 30 + "2",
        "(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH,
        "(10**99)//7%13*(10**99)//(10**98)",
    ]
    for text in worst:
        start = time.perf_counter()
        with contextlib.suppress(CalcError):
            evaluate(text[:MAX_LENGTH])
        assert time.perf_counter() - start < 0.05, text


def test_the_module_never_calls_eval_exec_or_compile():
    tree = ast.parse(Path(safe_arith.__file__).read_text())
    called = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert not called & {"eval", "exec", "compile", "__import__"}


def test_non_text_is_refused():
    with pytest.raises(CalcError, match="expected an expression as text, got int"):
        evaluate(12)  # type: ignore[arg-type]
