r"""Answer spellings (trainer.reward.forms) and the switchable leniencies, through the verifier's real path.

The cases come from issue 33 (units after an expression, \mathcal letters, \sqrt[3]2, a label "185\")
and from the peers' normalisers cited in tests/reward_peer_cases.py (sections "units after an
expression", "letters", "radicals", "labels").
"""

from __future__ import annotations

import pytest

from trainer.reward.extract import clean_answer, extract_answer
from trainer.reward.forms import (
    LENIENCIES,
    fix_spelling,
    lone_letter,
    strip_units,
    unstyle_letters,
    validate_leniencies,
)
from trainer.reward.math import MathRewardConfig, score_response

STRICT = MathRewardConfig(lenient=frozenset())


@pytest.mark.parametrize(
    ("raw", "fixed"),
    [
        (r"\sqrt[3]2", r"\sqrt[3]{2}"),
        (r"\sqrt[3] 2", r"\sqrt[3]{2}"),
        (r"1+\sqrt[3]2", r"1+\sqrt[3]{2}"),
        (r"\sqrt2", r"\sqrt{2}"),
        (r"\sqrt 3", r"\sqrt{3}"),
        (r"\sqrt23", r"\sqrt{2}3"),  # TeX takes one token
        (r"\sqrt[3]\pi", r"\sqrt[3]{\pi}"),
        (r"\sqrt[3]{2}", r"\sqrt[3]{2}"),
        (r"\sqrt{x+1}", r"\sqrt{x+1}"),
        (r"\mathcal P", r"\mathcal{P}"),
        (r"\mathbb Z", r"\mathbb{Z}"),
        ("185\\", "185"),
        ("185\\\\", "185"),
        ("x^2+1\\", "x^2+1"),
        ("12\\%\\\\", "12\\%"),
        ("24/", "24"),
        ("\\", "\\"),  # nothing would be left
        ("x^\\", "x^\\"),
        (r"\{1, 2\}", r"\{1, 2\}"),  # an escaped brace is not a stray backslash
        (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"),
    ],
)
def test_fix_spelling(raw: str, fixed: str) -> None:
    assert fix_spelling(raw) == fixed


@pytest.mark.parametrize(
    ("raw", "bare"),
    [
        (r"2\pi cm", r"2\pi"),
        (r"2\pi\text{ cm}", r"2\pi"),
        (r"4\pi \text{ cm}^2", r"4\pi"),
        (r"3\sqrt{2}\ \mathrm{m}", r"3\sqrt{2}"),
        (r"\frac{25}{2} \text{ square units}", r"\frac{25}{2}"),
        (r"x + 1 \text{ meters}", "x + 1"),
        (r"12\,\text{cm}", "12"),
        (r"3\text{ km/h}", "3"),
        (r"5 \mathrm{~cm}", "5"),
        (r"4\sqrt{2}cm", r"4\sqrt{2}"),
        (r"4\pi m^2", r"4\pi"),
        (r"\frac{9}{2}\text{ cm}^3", r"\frac{9}{2}"),
        # not units: a variable, a product, a command, a text answer, an operand
        (r"2\pi r", r"2\pi r"),
        (r"2\pi r h", r"2\pi r h"),
        ("2ab", "2ab"),
        (r"(27,\infty)", r"(27,\infty)"),
        (r"\text{Evelyn}", r"\text{Evelyn}"),
        (r"A^\mathrm{T}", r"A^\mathrm{T}"),
        (r"x \sec", r"x \sec"),
        ("x + cm", "x + cm"),
        ("cm", "cm"),
        (r"A \text{ and } \text{B}", r"A \text{ and } \text{B}"),
    ],
)
def test_strip_units(raw: str, bare: str) -> None:
    assert strip_units(raw) == bare


def test_units_after_a_plain_number_need_a_space_or_a_known_unit() -> None:
    assert clean_answer("60mph") == "60"
    assert clean_answer("5cm") == "5"
    assert clean_answer("17 apples") == "17"
    assert clean_answer("2ab") == "2ab"  # a product
    assert clean_answer("4 meters", units=False) == "4 meters"
    assert clean_answer("1 million", units=False) == "1000000"  # a scale word is no unit
    assert extract_answer("So the rope is 4 meters.\nAnswer: 4 meters", units=False) == ("4 meters", "answer_is")
    assert extract_answer("So the rope is 4 meters.\nAnswer: 4 meters") == ("4", "answer_is")


def test_styled_letters() -> None:
    assert unstyle_letters(r"\mathcal{B}") == "B"
    assert unstyle_letters(r"\mathcal{A} \cup \mathscr{B}") == r"A \cup B"
    assert unstyle_letters(r"\sin\mathbf{x}") == r"\sin x"  # not the command \sinx
    assert unstyle_letters(r"\mathbb{R}") == r"\mathbb{R}"  # a set: only a whole answer against a letter
    assert unstyle_letters(r"\mathcal{AB}") == r"\mathcal{AB}"
    assert lone_letter(r"\mathbb{R}") == "R"
    assert lone_letter(" R ") == "R"
    assert lone_letter(r"\mathbb{R}^2") is None
    assert lone_letter("RR") is None


def test_validate_leniencies() -> None:
    assert validate_leniencies(["units", " styled_letters "]) == frozenset(LENIENCIES)
    assert validate_leniencies(["none"]) == frozenset()
    with pytest.raises(ValueError, match=r"unknown leniency 'unit'; expected .*units, styled_letters, or none"):
        validate_leniencies(["unit"])
    with pytest.raises(ValueError, match=r"\(none given\)"):
        validate_leniencies([""])


# (response, label, verdict with every leniency on, verdict with none): each row differs, so each switch
# is shown to act on the path /get_reward runs.
SWITCHED = [
    (r"The arc is $\boxed{2\pi cm}$.", r"2\pi", 1, 0),
    (r"The rope is $\boxed{5\text{ cm}}$.", r"5\text{ m}", 1, 0),
    ("Answer: 4 meters", "4", 1, 0),
    (r"The set is $\boxed{\mathcal{B}}$.", "B", 1, 0),
    (r"The set is $\boxed{B}$.", r"\mathcal{B}", 1, 0),
    (r"The domain is $\boxed{R}$.", r"\mathbb{R}", 1, 0),
]


@pytest.mark.parametrize(("response", "label", "lenient", "strict"), SWITCHED)
def test_each_leniency_can_be_switched_off(response: str, label: str, lenient: int, strict: int) -> None:
    assert score_response(response, label).score == lenient
    assert score_response(response, label, STRICT).score == strict


@pytest.mark.parametrize(
    ("response", "label", "score"),
    [
        (r"$\boxed{\sqrt[3]2}$", r"\sqrt[3]{2}", 1),  # spelling fixes hold whatever the leniencies
        (r"$\boxed{\sqrt[3]{2}}$", r"\sqrt[3]2", 1),
        (r"$\boxed{185}$", "185\\", 1),
        (r"$\boxed{186}$", "185\\", 0),
        (r"$\boxed{2ab}$", "2", 0),  # math-verify's own unit list reads 2ab as 2: not used
        (r"$\boxed{5 \text{ cm}}$", r"5 \text{ cm}", 1),  # units kept on both sides still compare
    ],
)
def test_spelling_fixes_do_not_depend_on_the_leniencies(response: str, label: str, score: int) -> None:
    assert score_response(response, label).score == score
    assert score_response(response, label, STRICT).score == score


def test_one_leniency_alone() -> None:
    units_only = MathRewardConfig(lenient=frozenset({"units"}))
    assert score_response(r"$\boxed{2\pi cm}$", r"2\pi", units_only).score == 1
    assert score_response(r"$\boxed{\mathcal{B}}$", "B", units_only).score == 0
