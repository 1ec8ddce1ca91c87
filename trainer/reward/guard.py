"""Cheap rejection of answers whose exact value is astronomically large.

sympy evaluates integer powers, factorials and binomials exactly, so answers such
as ``9^{9^{9}}``, ``(10^{10})!`` or ``\\binom{10^{12}}{10^6}`` make math-verify run
for minutes (or exhaust memory) in C code. Walking the parsed (still unevaluated)
expression tree and estimating the number of digits of every exact number it
would build costs microseconds and turns the most common hang class into an
instant "too_complex". Hangs of other shapes are still caught by the pool timeout.
"""

from __future__ import annotations

import math

__all__ = ["estimated_digits", "too_big"]

_LOG10_2 = math.log10(2)


def _int_digits(n: int) -> float:
    return math.log10(abs(n)) if n else 0.0  # exact enough, and fine for huge ints


def _value(size: float) -> float:
    """10**size (the magnitude a size stands for), inf when it would overflow."""
    return 10.0**size if size < 300 else math.inf


def estimated_digits(expr: object) -> float:
    """Upper-bound estimate of the digits of the largest exact number sympy would build for ``expr``.

    Symbolic parts count as small (sympy keeps ``x^{10^{10}}`` symbolic); floats count by
    magnitude only (mpmath handles big exponents without exact arithmetic).
    """
    worst = [0.0]
    _size(expr, worst, depth=0)
    return worst[0]


def too_big(expr: object, max_digits: int) -> bool:
    """True if ``expr`` would make sympy build a number with more than ``max_digits`` digits."""
    return max_digits > 0 and estimated_digits(expr) > max_digits


def _size(expr: object, worst: list[float], depth: int) -> float:  # noqa: C901 - one case per node kind
    from sympy import Basic, Float, Pow, Rational, binomial, factorial, factorial2

    if not isinstance(expr, Basic):
        return 0.0
    if depth > 200:  # absurdly deep trees are not plausible answers
        worst[0] = math.inf
        return math.inf
    if isinstance(expr, Rational):
        size = max(_int_digits(int(expr.p)), _int_digits(int(expr.q)))
    elif isinstance(expr, Float):
        try:
            size = max(0.0, math.log10(abs(float(expr)))) if expr != 0 else 0.0
        except (OverflowError, ValueError):
            size = 0.0
    elif isinstance(expr, Pow):
        base, exp = expr.args
        base_size = _size(base, worst, depth + 1)
        exp_size = _size(exp, worst, depth + 1)
        numeric = not base.free_symbols and not exp.free_symbols and exp.is_number
        if isinstance(exp, Rational):  # the exponent's value, not its digits: 1/2 halves
            exp_value = abs(int(exp.p)) / int(exp.q) if exp_size < 300 else math.inf
        else:
            exp_value = _value(exp_size)
        size = base_size * exp_value if numeric and base_size > 0 else base_size
    elif isinstance(expr, factorial | factorial2):
        n = _value(_size(expr.args[0], worst, depth + 1)) if not expr.free_symbols else 0.0
        size = n * math.log10(n) if n > 1 else 0.0
    elif isinstance(expr, binomial):
        n_size, k_size = (_size(a, worst, depth + 1) for a in expr.args)
        size = 0.0 if expr.free_symbols else min(_value(k_size), _value(n_size)) * max(n_size, 1.0)
    else:
        sizes = [_size(arg, worst, depth + 1) for arg in expr.args]
        if not sizes:
            size = 0.0
        elif expr.is_Mul:
            size = sum(sizes)
        else:
            size = max(sizes) + _LOG10_2
    if math.isnan(size):
        size = math.inf
    worst[0] = max(worst[0], size)
    return size
