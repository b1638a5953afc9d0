"""``calculator``: exact-ish arithmetic with a small recursive-descent parser (never ``eval``).

Grammar: ``expr := term (('+'|'-') term)*``, ``term := unary (('*'|'/'|'//'|'%') unary)*``,
``unary := ('-'|'+') unary | power``, ``power := atom ('**' unary)?`` (right-associative, binds
tighter than a unary minus on its left, as in Python), ``atom := number | '(' expr ')'``.
Numbers: ``12``, ``1.5``, ``.5``, ``2e3``. Integers stay exact; ``/`` gives a float.
Bounds: 1000 characters, 100 levels of nesting, integers up to 4096 bits.
"""

from __future__ import annotations

import math
import re
from typing import Final

import msgspec

from services.tools.sdk import ToolError, tool

MAX_EXPRESSION_CHARS: Final = 1000
MAX_DEPTH: Final = 100
MAX_INT_BITS: Final = 4096

_TOKEN_RE: Final = re.compile(r"\s*(?:(\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)|(\*\*|//|[-+*/%()]))")

Number = int | float


class CalculatorInput(msgspec.Struct, forbid_unknown_fields=True):
    """An arithmetic expression."""

    expression: str


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None or m.end() == pos:
            bad = text[pos:].lstrip()[:1]
            raise ToolError(f"unexpected character {bad!r} at position {len(text) - len(text[pos:].lstrip())}")
        out.append(m.group(1) or m.group(2))
        pos = m.end()
    return out


def _check(value: Number) -> Number:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError("result too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("result is not a finite number")
    return value


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ToolError("unexpected end of expression")
        self.pos += 1
        return tok

    def parse(self) -> Number:
        if not self.tokens:
            raise ToolError("empty expression")
        value = self.expr()
        if self.peek() is not None:
            raise ToolError(f"unexpected {self.peek()!r}")
        return value

    def expr(self) -> Number:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = _check(value + rhs if op == "+" else value - rhs)
        return value

    def term(self) -> Number:
        value = self.unary()
        while self.peek() in ("*", "/", "//", "%"):
            op = self.take()
            rhs = self.unary()
            if op == "*":
                value = _check(value * rhs)
                continue
            if rhs == 0:
                raise ToolError("division by zero")
            if op == "/":
                value = _check(value / rhs)
            elif op == "//":
                value = _check(value // rhs)
            else:
                value = _check(value % rhs)
        return value

    def unary(self) -> Number:
        if self.peek() in ("-", "+"):
            op = self.take()
            self.enter()
            try:
                value = self.unary()
            finally:
                self.depth -= 1
            return -value if op == "-" else value
        return self.power()

    def power(self) -> Number:
        base = self.atom()
        if self.peek() != "**":
            return base
        self.take()
        self.enter()
        try:
            exp = self.unary()
        finally:
            self.depth -= 1
        return _pow(base, exp)

    def atom(self) -> Number:
        tok = self.take()
        if tok == "(":
            self.enter()
            try:
                value = self.expr()
            finally:
                self.depth -= 1
            if self.take() != ")":
                raise ToolError("expected ')'")
            return value
        if tok[0].isdigit() or tok[0] == ".":
            if any(c in tok for c in ".eE"):
                return _check(float(tok))
            if len(tok) > 1300:  # ~4096 bits
                raise ToolError("number too large")
            return _check(int(tok))
        raise ToolError(f"unexpected {tok!r}")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ToolError("expression nested too deeply")


def _pow(base: Number, exp: Number) -> Number:
    if base == 0 and exp < 0:
        raise ToolError("division by zero")
    if isinstance(base, int) and isinstance(exp, int) and exp >= 0:
        if abs(base) > 1 and exp * max(1, abs(base).bit_length() - 1) > MAX_INT_BITS:
            raise ToolError("result too large")
        return _check(base**exp)
    try:
        result = float(base) ** float(exp)
    except OverflowError:
        raise ToolError("result too large") from None
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    if isinstance(result, complex):
        raise ToolError("result is not a real number")
    return _check(result)


def evaluate(expression: str) -> Number:
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        return _Parser(_tokens(expression)).parse()
    except OverflowError:
        raise ToolError("result too large") from None


def format_number(value: Number) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


@tool(
    name="calculator",
    description="Evaluate an arithmetic expression: + - * / // % ** and parentheses.",
    read_only=True,
    inline=True,  # own parser with bounded input: quick and never blocks
)
def calculator(args: CalculatorInput) -> str:
    return format_number(evaluate(args.expression))
