"""A safe arithmetic evaluator for the calculator tool: never ``eval``.

``evaluate(text)`` reads an expression over integers and decimals with ``+ - * /
// % **`` (``^`` is accepted for ``**``, as on a calculator), unary ``+``/``-`` and
parentheses, with a small recursive-descent parser over a token list, and
returns its value (``int`` where the result is an integer, else ``float``).
Anything else is a ``CalcError`` whose message is meant to be shown to the
policy as the tool's answer: names, calls, attributes, strings, commas and every
other character are rejected by the tokenizer before anything is evaluated.

Grammar (Python's precedence: ``**`` binds tighter than a unary minus on its
left and is right-associative, so ``-2**2 == -4`` and ``2**-1 == 0.5``)::

    expr  := term (("+" | "-") term)*
    term  := unary (("*" | "/" | "//" | "%") unary)*
    unary := ("+" | "-") unary | power
    power := atom (("**" | "^") unary)?
    atom  := NUMBER | "(" expr ")"

Bounds, so every call takes microseconds whatever the input: at most
``MAX_LENGTH`` characters, ``MAX_DEPTH`` nested parentheses/unary signs, integer
results below ``10**MAX_DIGITS`` in magnitude (a power is refused *before* it is
computed when its result would be larger), float results finite.

Semantics: Python's, except that ``/`` of two integers that divide exactly is an
integer (``84/4 == 21``, a calculator's ``21`` rather than ``21.0``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

#: Longest expression accepted, in characters.
MAX_LENGTH = 200
#: Deepest nesting of parentheses and unary signs.
MAX_DEPTH = 32
#: Integer results must have fewer digits than this.
MAX_DIGITS = 100

Number = int | float

_TOKEN = re.compile(r"\s*(?:(\d+\.\d*|\.\d+|\d+)|(\*\*|//|[-+*/%^()]))")
_LIMIT = 10**MAX_DIGITS


class CalcError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message says why."""


@dataclass(frozen=True)
class _Token:
    kind: str  # "num" or "op"
    text: str
    position: int


def tokenize(text: str) -> list[_Token]:
    """The expression's tokens.

    Raises:
        CalcError: an empty or overlong expression, or a character that is not part
            of a number, an operator or a parenthesis (the message gives its position).
    """
    if not isinstance(text, str):
        raise CalcError(f"expected an expression as text, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise CalcError(f"expression too long: {len(text)} characters (at most {MAX_LENGTH})")
    tokens: list[_Token] = []
    position = 0
    end = len(text.rstrip())
    while position < end:
        match = _TOKEN.match(text, position)
        if match is None:
            start = position + len(text[position:]) - len(text[position:].lstrip())
            raise CalcError(
                f"unexpected {text[start]!r} at position {start}: only numbers, "
                "+ - * / // % ** ^ and parentheses are allowed"
            )
        number, op = match.groups()
        start = match.start(1) if number is not None else match.start(2)
        tokens.append(_Token("num" if number is not None else "op", number or op, start))
        position = match.end()
    if not tokens:
        raise CalcError("empty expression")
    return tokens


def _checked(value: Number) -> Number:
    """``value`` if within the bounds, else a ``CalcError``."""
    if isinstance(value, int):
        if abs(value) >= _LIMIT:
            raise CalcError(f"result too large (at most {MAX_DIGITS} digits)")
        return value
    if not math.isfinite(value):
        raise CalcError("result too large for a decimal number")
    return value


def _divide(left: Number, right: Number) -> Number:
    if right == 0:
        raise CalcError("division by zero")
    if isinstance(left, int) and isinstance(right, int) and left % right == 0:
        return left // right
    try:
        return left / right
    except OverflowError:
        raise CalcError("result too large for a decimal number") from None


def _floor_divide(left: Number, right: Number) -> Number:
    if right == 0:
        raise CalcError("division by zero")
    return left // right


def _modulo(left: Number, right: Number) -> Number:
    if right == 0:
        raise CalcError("modulo by zero")
    return left % right


def _power(base: Number, exponent: Number) -> Number:
    """``base ** exponent``, refused before computing when it would be too large."""
    if base == 0 and exponent < 0:
        raise CalcError("zero to a negative power")
    if isinstance(base, int) and isinstance(exponent, int) and exponent >= 0:
        if abs(base) >= 2 and exponent * math.log10(abs(base)) >= MAX_DIGITS:
            raise CalcError(f"result too large (at most {MAX_DIGITS} digits)")
        return base**exponent
    try:
        result = float(base) ** float(exponent)
    except OverflowError:
        raise CalcError("result too large for a decimal number") from None
    except ZeroDivisionError:
        raise CalcError("zero to a negative power") from None
    if isinstance(result, complex):
        raise CalcError("not a real number (a negative number to a fractional power)")
    return result


_BINARY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": _divide,
    "//": _floor_divide,
    "%": _modulo,
}


class _Parser:
    """Recursive descent over a token list; evaluates as it parses."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.index = 0
        self.depth = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self) -> _Token:
        token = self.peek()
        if token is None:
            raise CalcError("unexpected end of expression")
        self.index += 1
        return token

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CalcError(f"expression nested too deeply (at most {MAX_DEPTH} levels)")

    def expr(self) -> Number:
        value = self.term()
        while (token := self.peek()) is not None and token.text in ("+", "-"):
            self.take()
            value = _checked(_BINARY[token.text](value, self.term()))
        return value

    def term(self) -> Number:
        value = self.unary()
        while (token := self.peek()) is not None and token.text in ("*", "/", "//", "%"):
            self.take()
            value = _checked(_BINARY[token.text](value, self.unary()))
        return value

    def unary(self) -> Number:
        token = self.peek()
        if token is not None and token.text in ("+", "-"):
            self.take()
            self.nest()
            value = self.unary()
            self.depth -= 1
            return -value if token.text == "-" else value
        return self.power()

    def power(self) -> Number:
        base = self.atom()
        token = self.peek()
        if token is not None and token.text in ("**", "^"):
            self.take()
            self.nest()
            exponent = self.unary()
            self.depth -= 1
            return _checked(_power(base, exponent))
        return base

    def atom(self) -> Number:
        token = self.take()
        if token.kind == "num":
            return _checked(float(token.text) if "." in token.text else int(token.text))
        if token.text == "(":
            self.nest()
            value = self.expr()
            self.depth -= 1
            closing = self.peek()
            if closing is None or closing.text != ")":
                where = "end of expression" if closing is None else f"position {closing.position}"
                raise CalcError(f"missing ')' at {where}")
            self.take()
            return value
        raise CalcError(f"unexpected {token.text!r} at position {token.position}")


def evaluate(text: str) -> Number:
    """The value of the arithmetic expression ``text``.

    Args:
        text: e.g. ``"12*7+3"``, ``"(1.5 + 2) ** 2"``, ``"-7 // 2"``.

    Returns:
        An ``int`` where the result is an integer computed from integers (``/``
        included when it divides exactly), else a ``float``.

    Raises:
        CalcError: the expression is malformed, too long, too deep, or its value is
            too large, undefined (division by zero) or not real.
    """
    parser = _Parser(tokenize(text))
    value = parser.expr()
    leftover = parser.peek()
    if leftover is not None:
        raise CalcError(f"unexpected {leftover.text!r} at position {leftover.position}")
    return value


def format_number(value: Number) -> str:
    """How the calculator shows a value: an integer as is, a float with up to 12
    significant digits (``0.1+0.2`` -> ``"0.3"``), a whole float without ``.0``."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.12g}"
