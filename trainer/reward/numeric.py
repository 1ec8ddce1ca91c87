r"""Decide "wrong" (and "same text") without sympy, for the common shapes of math answers.

math-verify parses LaTeX with an ANTLR grammar: 2 to 50 ms of CPU per expression, most of a
verification's cost. Many verdicts need no parse at all:

* :func:`same_text`: the answer is the label, up to spaces next to symbols and ``\dfrac`` /
  ``\tfrac`` for ``\frac``: math-verify parses both the same way, so it says equal;
* :func:`clearly_different`: both sides are expressions of a small LaTeX subset (numbers,
  ``+ - * /``, ``\frac``, ``\sqrt``, ``\pi``, powers, one-letter variables, implicit
  products), or tuples / intervals of such with the same brackets, or equations with the
  same left side; evaluated at fixed probe points (one per variable name) their values
  differ by more than math-verify's float rounding. Then ``a - b`` is not identically zero,
  and no check of math-verify can find them equal.

Everything else (equal values, other syntax, ``e`` and ``i``, functions, sets, percent,
units) returns "unknown" and goes to math-verify. Randomized tests in
tests/unit/test_reward_numeric.py check every "wrong" against math-verify.
"""

from __future__ import annotations

import cmath
import re

__all__ = ["clearly_different", "evaluate", "same_text"]

# ---------------------------------------------------------------- same text

# Whitespace next to a symbol ("x + 1", "\\frac {1}{2}"); not between two letters or digits ("2 3").
_SPACING = re.compile(r"\s+(?=[^\w\s])|(?<=[^\w\s])\s+")
_SPELLING = (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"))


def _canonical(text: str) -> str:
    for old, new in _SPELLING:
        text = text.replace(old, new)
    return _SPACING.sub("", text.strip())


def same_text(answer: str, label: str) -> bool:
    """Whether answer and label are the same text up to spacing and spelling variants."""
    a, b = _canonical(answer), _canonical(label)
    return a == b and any(ch.isalnum() for ch in a)


# ---------------------------------------------------------------- a tiny evaluator

_TOKEN = re.compile(r"\d+(?:\.\d+)?|\.\d+|\\[A-Za-z]+|\\[,;:! ]|[A-Za-z]|\S")
_IGNORED = frozenset({"\\left", "\\right", "\\,", "\\;", "\\:", "\\!", "\\ ", "\\displaystyle"})
_FRACS = frozenset({"\\frac", "\\dfrac", "\\tfrac", "\\cfrac"})
_TIMES = frozenset({"*", "\\cdot", "\\times"})
_NOT_VARIABLES = frozenset("eiEI")  # Euler's number / the imaginary unit in math-verify: left to it
_MIXED_NUMBER = re.compile(r"\d\s*\\[dtc]?frac")
_MAX_TOKENS = 400
_MAX_EXPONENT = 64.0


def _probe(name: str) -> float:
    """A fixed, irrational-looking value per variable name (the same on both sides)."""
    return 0.5 + ((ord(name) * 0.6180339887498949) % 1.0) * 1.3


class _Unsupported(Exception):
    pass


class _Parser:
    def __init__(self, text: str) -> None:
        if _MIXED_NUMBER.search(text):
            raise _Unsupported  # 918\frac{1}{2}: math-verify reads a mixed number, 918 + 1/2
        tokens = [t for t in _TOKEN.findall(text) if t not in _IGNORED]
        if len(tokens) > _MAX_TOKENS:
            raise _Unsupported
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        if self.pos >= len(self.tokens):
            raise _Unsupported
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def expect(self, token: str) -> None:
        if self.take() != token:
            raise _Unsupported

    def argument(self) -> complex:
        """A command argument: ``{expr}``, one digit or one letter.

        Unbraced digit strings are read differently by different parsers (math-verify:
        ``x^23`` is x^23, ``\\frac123`` is 1/23, ``\\sqrt23`` is 3 sqrt 2): left to it.
        """
        if self.peek() == "{":
            self.take()
            value = self.expr()
            self.expect("}")
            return value
        token = self.peek()
        if token is not None and token[0].isdigit():
            if not token.isdigit() or len(token) > 1:
                raise _Unsupported
            self.take()
            return complex(int(token))
        return self.atom()

    def expr(self) -> complex:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> complex:
        value = self.signed()
        divided = False
        while True:
            token = self.peek()
            if token in _TIMES:
                self.take()
                value *= self.signed()
            elif token == "/":
                self.take()
                divisor = self.signed()
                if divisor == 0:
                    raise _Unsupported
                value /= divisor
                divided = True
            elif token is not None and self._starts_factor(token):
                if divided:
                    raise _Unsupported  # 1/2x: (1/2)x or 1/(2x)? left to math-verify
                value *= self.power()  # implicit product: 2\sqrt{3}, 3x, x(x+1)
            else:
                return value

    @staticmethod
    def _starts_factor(token: str) -> bool:
        return token[0].isdigit() or token in ("(", "{", "\\pi", "\\sqrt") or token in _FRACS or token.isalpha()

    def signed(self) -> complex:
        if self.peek() in ("-", "+"):
            return -self.signed() if self.take() == "-" else self.signed()
        return self.power()

    def power(self) -> complex:
        base = self.atom()
        if self.peek() != "^":
            return base
        self.take()
        exponent = self.argument()
        if abs(exponent) > _MAX_EXPONENT or (base == 0 and exponent.real <= 0):
            raise _Unsupported
        return base**exponent

    def atom(self) -> complex:
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            return complex(float(token))
        if token in ("(", "{"):
            value = self.expr()
            self.expect(")" if token == "(" else "}")
            return value
        if token in _FRACS:
            short = self.peek()
            if short is not None and short.isdigit() and len(short) == 2:  # \frac12: 1/2 for every parser
                self.take()
                numerator, denominator = complex(int(short[0])), complex(int(short[1]))
            else:
                numerator = self.argument()
                denominator = self.argument()
            if denominator == 0:
                raise _Unsupported
            return numerator / denominator
        if token == "\\sqrt":
            if self.peek() == "[":
                self.take()
                index = self.expr()
                self.expect("]")
                radicand = self.argument()
                if index == 0 or abs(index) > _MAX_EXPONENT:
                    raise _Unsupported
                return radicand ** (1 / index)
            return cmath.sqrt(self.argument())
        if token == "\\pi":
            return complex(cmath.pi)
        if len(token) == 1 and token.isalpha() and token not in _NOT_VARIABLES:
            return complex(_probe(token))
        raise _Unsupported


def evaluate(text: str) -> complex | None:
    """The real value of a LaTeX-subset expression at the probe points, or None when unsupported."""
    try:
        parser = _Parser(text)
        value = parser.expr()
        if parser.pos != len(parser.tokens):
            return None
    except (_Unsupported, OverflowError, ZeroDivisionError, ValueError):
        return None
    if value != value or abs(value) == float("inf") or abs(value.imag) > 1e-12 * max(1.0, abs(value.real)):
        return None  # non-real values (\\sqrt{-2}): math-verify's handling of them is its own
    return value


def _differ(a: complex, b: complex) -> bool:
    """Further apart than math-verify's 6-decimal float rounding could bridge."""
    return abs(a - b) > max(2e-6, 1e-9 * max(abs(a), abs(b)))


# ---------------------------------------------------------------- shapes

_BRACKETS = {"(": ")", "[": "]"}


def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _tuple(text: str) -> tuple[str, list[str], str] | None:
    """(open, elements, close) of ``(a, b)`` / ``[a, b)``-style text with top-level commas."""
    text = text.replace("\\left", "").replace("\\right", "").strip()
    if len(text) < 2 or text[0] not in _BRACKETS or text[-1] not in ")]":
        return None
    inner = text[1:-1]
    elements = _split_top(inner, ",")
    if len(elements) < 2 or any(_depth_broken(e) for e in elements):
        return None
    return text[0], elements, text[-1]


def _depth_broken(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += ch in "({["
        depth -= ch in ")}]"
        if depth < 0:
            return True
    return depth != 0


def clearly_different(answer: str, label: str) -> bool:
    """True only when math-verify is certain to find ``answer`` and ``label`` different."""
    if "=" in answer or "=" in label:
        a_sides, b_sides = _split_top(answer, "="), _split_top(label, "=")
        if len(a_sides) != 2 or len(b_sides) != 2 or _canonical(a_sides[0]) != _canonical(b_sides[0]):
            return False
        if not re.fullmatch(r"[A-Za-z]", _canonical(a_sides[0])):
            return False  # only "y = ...", where the right sides must be equal
        answer, label = a_sides[1], b_sides[1]
    a_tuple, b_tuple = _tuple(answer), _tuple(label)
    if a_tuple or b_tuple:
        if not (a_tuple and b_tuple) or (a_tuple[0], a_tuple[2], len(a_tuple[1])) != (b_tuple[0], b_tuple[2], len(b_tuple[1])):
            return False
        values = [(evaluate(x), evaluate(y)) for x, y in zip(a_tuple[1], b_tuple[1], strict=True)]
        if any(x is None or y is None for x, y in values):
            return False
        if len(values) == 2 and values[0][0].real >= values[1][0].real and values[0][1].real >= values[1][1].real:
            return False  # (a, b) may be read as an interval: two empty ones are equal
        return any(_differ(x, y) for x, y in values)  # type: ignore[arg-type]
    a, b = evaluate(answer), evaluate(label)
    return a is not None and b is not None and _differ(a, b)
