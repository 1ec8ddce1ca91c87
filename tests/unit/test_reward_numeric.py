"""The sympy-free verdicts (trainer.reward.numeric) never contradict math-verify.

Random expressions of the supported LaTeX subset, written with the shorthands models use
(\\frac12, 2x, x(x+1), \\sqrt[3]{..}, \\cdot, spacing commands), paired with perturbed, swapped,
re-spaced and unrelated ones: every "clearly different" must be math-verify's False and
every "same text" its True.
"""

from __future__ import annotations

import random

import pytest

from trainer.reward.math import _parse_boxed
from trainer.reward.numeric import clearly_different, evaluate, same_text

VARIABLES = "xyzabn"


def _number(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.6:
        return str(rng.randint(1, 12))
    if roll < 0.8:
        return str(rng.randint(13, 999))
    return f"{rng.randint(0, 9)}.{rng.randint(1, 99)}"


def _expr(rng: random.Random, depth: int = 0) -> str:
    if depth > 2 or rng.random() < 0.3:
        return rng.choice([_number(rng), rng.choice(VARIABLES), r"\pi", f"{_number(rng)}{rng.choice(VARIABLES)}"])
    a, b = _expr(rng, depth + 1), _expr(rng, depth + 1)
    return rng.choice([
        f"{a}+{b}", f"{a} - {b}", f"{a}\\cdot {b}", f"\\frac{{{a}}}{{{b}}}", f"\\dfrac{{{a}}}{{{b}}}",
        f"\\frac{rng.randint(1, 9)}{rng.randint(1, 9)}", f"\\sqrt{{{a}}}", f"{rng.randint(2, 9)}\\sqrt{{{a}}}",
        f"\\sqrt[3]{{{a}}}", f"({a})^2", f"{rng.choice(VARIABLES)}^{{{rng.randint(2, 4)}}}", f"-{a}",
        f"{rng.randint(2, 9)}({a})", f"{rng.choice(VARIABLES)}({a}+{b})", f"\\left({a}\\right)\\left({b}\\right)",
        f"{rng.randint(1, 99)}\\frac{{{rng.randint(1, 9)}}}{{{rng.randint(2, 9)}}}",  # a mixed number
        f"{rng.choice(VARIABLES)}^{rng.randint(10, 99)}", f"2^{rng.randint(2, 19)}",  # unbraced exponents
        f"\\frac{rng.randint(100, 999)}", f"\\sqrt{rng.randint(10, 99)}", f"\\sqrt{rng.randint(2, 9)}{rng.choice(VARIABLES)}",
    ])  # fmt: skip


def _perturb(rng: random.Random, text: str) -> str:
    digits = [i for i, ch in enumerate(text) if ch.isdigit()]
    if not digits:
        return text + "+1"
    i = rng.choice(digits)
    return text[:i] + str((int(text[i]) + rng.randint(1, 8)) % 10) + text[i + 1 :]


def _respace(text: str) -> str:
    return text.replace("+", " + ").replace("\\frac", "\\dfrac").replace("{", " {")


def _pairs(seed: int, n: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        a = _expr(rng)
        b = rng.choice([_perturb(rng, a), _expr(rng), _respace(a), a])
        shape = rng.random()
        if shape < 0.15:
            c = _expr(rng)
            left, right = rng.choice(["()", "[]", "(]"])
            pairs.append((f"{left}{a}, {c}{right}", rng.choice([f"{left}{b}, {c}{right}", f"{left}{c}, {a}{right}"])))
        elif shape < 0.25:
            pairs.append((f"y = {a}", rng.choice([f"y = {b}", f"y={a}", f"x = {b}"])))
        else:
            pairs.append((a, b))
    return pairs


def _math_verify(answer: str, label: str) -> bool:
    from math_verify import verify

    return bool(verify(list(_parse_boxed(label)), list(_parse_boxed(answer)), timeout_seconds=None))


def test_never_contradicts_math_verify() -> None:
    decided_different = decided_same = 0
    for answer, label in _pairs(seed=2024, n=500):
        if clearly_different(answer, label):
            decided_different += 1
            assert not _math_verify(answer, label), ("we say different, math-verify says equal", answer, label)
        elif same_text(answer, label):
            decided_same += 1
            assert _math_verify(answer, label), ("same text, but math-verify says different", answer, label)
    assert decided_different > 100 and decided_same > 40  # both shortcuts must actually be exercised


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (r"2\sqrt{3}", 2 * 3**0.5), (r"\frac12", 0.5), (r"\dfrac{3}{4}", 0.75), (r"\sqrt[3]{8}", 2.0),
        (r"-2^2", -4.0), (r"2\cdot 3+1", 7.0), (r"\left(1+1\right)^{3}", 8.0), (r"\frac{\pi}{2}", 3.141592653589793 / 2),
    ],
)  # fmt: skip
def test_evaluate(text: str, value: float) -> None:
    result = evaluate(text)
    assert result is not None and abs(result - value) < 1e-12


@pytest.mark.parametrize(
    "text", [r"1/2x", r"e^2", r"2i", r"\sin x", r"x \% ", r"\{1,2\}", r"\infty", r"10^{100}", r"\frac{1}{0}", "1,000",
             r"918\frac{1}{2}", r"x^23", r"2^10", r"\frac123", r"\sqrt23"]
)
def test_evaluate_leaves_the_rest_to_math_verify(text: str) -> None:
    assert evaluate(text) is None


def test_shapes() -> None:
    assert clearly_different("(1, 2]", "(1, 3]")
    assert not clearly_different("(1, 2]", "[1, 3]")  # other brackets: math-verify decides
    assert clearly_different("y = 2x+1", "y = 2x-1")
    assert not clearly_different("y = 2x+1", "2x-1")
    assert not clearly_different("x^2+2x+1", "(x+1)^2")  # equal values are never "different"
    assert same_text(r"\dfrac{1}{2}", r"\frac {1}{2}") and not same_text("@@", "@@")
    assert not same_text("2 3", "23") and not same_text(r"\left(x\right)", "(x)")
