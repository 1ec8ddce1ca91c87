"""Answer extraction, math-verify comparison, the numeric fast path and dataset lookup."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

import pytest

from trainer.reward.extract import (
    DEFAULT_STRATEGIES,
    MARKER_STRATEGIES,
    clean_answer,
    extract_answer,
    extract_boxed,
    validate_strategies,
)
from trainer.reward.math import (
    MathRewardConfig,
    Reason,
    _parse_boxed,
    fast_compare,
    label_to_str,
    score_response,
    verify_answer,
)
from trainer.reward.server.dataset import DatasetError, load_dataset, render_prompt

# (response, label, expected score). Verdicts are math-verify 0.9.0's, checked by hand
# where they might surprise (noted inline).
CASES = [
    # the same half, written many ways
    (r"so \boxed{0.5}", "1/2", 1.0),
    (r"\boxed{1/2}", "0.5", 1.0),
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{\dfrac12}", "1/2", 1.0),
    (r"\boxed{\tfrac{1}{2}}", r"\frac12", 1.0),
    (r"\boxed{\frac{2}{4}}", "1/2", 1.0),
    (r"\boxed{0.7500}", "3/4", 1.0),
    (r"\boxed{\dfrac{3}{4}}", "0.75", 1.0),
    # missing / empty / several boxes
    ("no box here", "5", 0.0),
    (r"\boxed{}", "5", 0.0),
    (r"\boxed{ }", "5", 0.0),
    (r"\boxed{3} then \boxed{5}", "5", 1.0),  # last box wins
    (r"\boxed{5} then \boxed{3}", "5", 0.0),
    (r"\boxed{7} and a truncated \boxed{", "7", 1.0),  # unclosed last box is skipped
    (r"\boxed{\frac{1}{2", "1/2", 0.0),
    (r"\fbox{7}", "7", 1.0),
    # nested braces
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", 1.0),
    (r"\boxed{\frac{1}{\frac{1}{2}}}", "2", 1.0),
    (r"\boxed{\{1,2\}}", r"\{2,1\}", 1.0),  # sets, order-free
    # units, whitespace, currency, thousands separators
    (r"\boxed{5 \text{ cm}}", "5", 1.0),
    (r"\boxed{5\,\mathrm{cm}}", "5", 1.0),
    (r"\boxed{  42  }", "42", 1.0),
    ("\\boxed{\n42\n}", "42", 1.0),
    (r"\boxed{\$5}", "5", 1.0),
    (r"\boxed{1,000}", "1000", 1.0),
    # garbage
    (r"\boxed{asdf qwer}", "7", 0.0),
    (r"\boxed{@@@}", "7", 0.0),
    (r"\boxed{\frac{}", "7", 0.0),
    # huge numbers
    (r"\boxed{10^{100}}", "1" + "0" * 100, 1.0),
    (r"\boxed{123456789012345678901234567890}", "123456789012345678901234567890", 1.0),
    (r"\boxed{123456789012345678901234567891}", "123456789012345678901234567890", 0.0),
    # negatives
    (r"\boxed{-3}", "-3", 1.0),
    (r"\boxed{-3}", "3", 0.0),
    (r"\boxed{-\frac{1}{2}}", "-0.5", 1.0),
    # percent: math-verify accepts both 50 and 0.5 for 50%
    (r"\boxed{50\%}", "50", 1.0),
    (r"\boxed{50\%}", "0.5", 1.0),
    # intervals and sets
    (r"\boxed{[1,2)}", "[1,2)", 1.0),
    (r"\boxed{[1,2)}", "(1,2)", 0.0),
    (r"\boxed{x \in (0, \infty)}", r"(0,\infty)", 1.0),
    # close-looking decimals: math-verify rounds floats to 6 decimals
    (r"\boxed{0.333}", "1/3", 0.0),
    (r"\boxed{0.3333}", r"\frac{1}{3}", 0.0),
    (r"\boxed{0.333333}", "1/3", 1.0),
    (r"\boxed{3.14}", r"\pi", 0.0),
    (r"\boxed{\sqrt{2}}", "1.41421356", 1.0),
    (r"\boxed{\sqrt{2}}", "1.414", 0.0),
    # latex vs plain, symbolic equivalence
    (r"\boxed{\pi}", r"\pi", 1.0),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    (r"\boxed{5^{2}}", "25", 1.0),
    (r"\boxed{3.0}", "3", 1.0),
    (r"\boxed{x=5}", "5", 1.0),
    (r"\boxed{\infty}", r"\infty", 1.0),
    (r"\boxed{-\infty}", r"\infty", 0.0),
    (r"\boxed{1e-07}", "0.0000001", 0.0),  # math-verify reads 1e-07 as e - 7
    (r"\boxed{\text{(A)}}", "A", 1.0),
    # labels that carry their own box or delimiters
    (r"\boxed{2}", r"The answer is $\boxed{2}$", 1.0),
    (r"\boxed{2}", "$2$", 1.0),
    # marker strategies, then the final expression (default: boxed, answer_tag, answer_is, hash,
    # final_expression)
    ("the answer is 5", "5", 1.0),
    ("The final answer is: 18.", "18", 1.0),
    ("work...\n#### 72", "72", 1.0),
    ("<answer>72</answer>", "72", 1.0),
    ("I think 7 apples", "7", 1.0),  # no marker: the final expression
    ("I think 7 apples", "8", 0.0),
    # chat end markers are not part of the answer
    ("#### 4<|im_end|>", "4", 1.0),
    ("The answer is 12.<|endoftext|>", "12", 1.0),
    ("Answer: 3/4</s>", "0.75", 1.0),
]


@pytest.mark.parametrize(
    ("response", "label", "expected"), CASES, ids=[f"{i:02d}" for i in range(len(CASES))]
)
def test_score_table(response: str, label: str, expected: float) -> None:
    result = score_response(response, label)
    assert result.score == expected, result
    assert result.reason == (Reason.CORRECT if expected == 1.0 else result.reason)
    if expected == 0.0:
        assert result.reason != Reason.CORRECT


def test_table_is_big_enough() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize(
    ("response", "label", "reason"),
    [
        ("no box here", "5", Reason.NO_ANSWER),
        (r"\boxed{}", "5", Reason.NO_ANSWER),
        (r"\boxed{4}", "5", Reason.WRONG),
        (r"\boxed{@@@}", "5", Reason.PARSE_ERROR),
        (r"\boxed{5}", "", Reason.BAD_LABEL),
        (r"\boxed{5}", "@@@", Reason.BAD_LABEL),
        (r"\boxed{5}", None, Reason.NO_LABEL),
        (r"\boxed{" + "1+" * 600 + "1}", "5", Reason.TOO_LONG),
        (r"\boxed{9^{9^{9}}}", "5", Reason.TOO_COMPLEX),
        (r"\boxed{(10^{10})!}", "5", Reason.TOO_COMPLEX),
        (r"\boxed{5}", "9^{9^{9}}", Reason.BAD_LABEL),
    ],
)
def test_reasons(response: str, label: str | None, reason: str) -> None:
    assert score_response(response, label).reason == reason


# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{1}", "1"),
        (r"a \boxed{1} b \boxed{2} c", "2"),
        (r"\boxed{\frac{a}{b}}", r"\frac{a}{b}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{a\}b}", r"a\}b"),  # escaped brace does not close the box
        (r"\boxed {3}", "3"),
        (r"\fbox{4}", "4"),
        (r"\boxed{1} \fbox{5}", "5"),
        (r"\boxed{}", ""),
        (r"\boxed{2} \boxed{3", "2"),
        ("nothing", None),
        (r"\boxed 7", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "strategies", "expected"),
    [
        ("The answer is 42.", ("answer_is",), ("42", "answer_is")),
        ("Answer: $\\frac{1}{2}$", ("answer_is",), (r"\frac{1}{2}", "answer_is")),
        ("so the final answer is **3.5**. Done", ("answer_is",), ("3.5", "answer_is")),
        ("answer is 1. Then the answer is 2.", ("answer_is",), ("2", "answer_is")),
        ("#### 1,234\n", ("hash",), ("1,234", "hash")),
        ("we get 12 then 3/4 here", ("last_number",), ("3/4", "last_number")),
        ("total 1,234,567 dollars", ("last_number",), ("1234567", "last_number")),
        ("-5 degrees", ("last_number",), ("-5", "last_number")),
        (r"\boxed{4}. So the answer is 3.", ("boxed", "answer_is"), ("4", "boxed")),
        (r"\boxed{4}. So the answer is 3.", ("answer_is", "boxed"), ("3", "answer_is")),
        (r"The answer is $\boxed{4}$ cm.", ("answer_is",), ("4", "answer_is")),
        ("no numbers", ("boxed", "answer_is", "hash", "last_number"), (None, None)),
        (r"\boxed{} answer is 3", DEFAULT_STRATEGIES, ("", "boxed")),  # empty box: no fallback
    ],
)
def test_extract_strategies(
    text: str, strategies: tuple[str, ...], expected: tuple[str | None, str | None]
) -> None:
    assert extract_answer(text, strategies) == expected


def test_strategies_are_chosen_in_config() -> None:
    unmarked = score_response("I count 7 apples", "7")
    assert (unmarked.score, unmarked.detail) == (1.0, "correct:final_expression")
    markers_only = MathRewardConfig(strategies=MARKER_STRATEGIES)
    assert score_response("I count 7 apples", "7", markers_only).reason == Reason.NO_ANSWER
    config = MathRewardConfig(strategies=("boxed", "last_number"))
    assert score_response("I count 7 apples", "7", config).detail == "correct:last_number"
    assert score_response("I count 7 apples", "7", MathRewardConfig(strategies=("hash",))).score == 0.0
    assert score_response(r"so \boxed{7}", "7").detail == "correct:boxed"
    assert score_response("#### 8<|im_end|>", "7").detail == "wrong:hash"


def test_unknown_strategy_is_rejected_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"'bogus'.*boxed, answer_tag, answer_is, hash, final_expression, last_number"):
        validate_strategies(["boxed", "bogus"])


@pytest.mark.parametrize(
    ("raw", "clean"),
    [(" $5$ ", "5"), (r"\(x\)", "x"), ("**7**.", "7"), ("3.", "3"), ("1...", "1..."), ("$$ \\pi $$", r"\pi")],
)
def test_clean_answer(raw: str, clean: str) -> None:
    assert clean_answer(raw) == clean


# ---------------------------------------------------------------- fast path


@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [
        ("5", "5", True),
        ("5", "6", False),
        ("-0", "0", True),
        ("0.5", "1/2", True),
        (r"\dfrac12", "0.5", True),
        ("3.0", "3", True),
        ("0.333", "1/3", False),
        ("0.333333", "1/3", None),  # within rounding distance: math-verify decides
        ("40.0000000677703", "40.00000006777030", None),  # > 15 digits: sympy precision differs
        ("1234567.5", "1234567.5", None),  # large floats: precision matters
        (r"\sqrt{2}", "1.414", None),
        ("007", "7", None),  # non-canonical: not on the fast path
        ("1,234", "1234", True),  # thousands separators, as math-verify reads them in a box
        ("-12,345,678", "-12345678", True),
        ("1,234", "1243", False),
        ("1,23", "123", None),  # not thousands: a list, math-verify decides
        ("12.5\\%", "12.5", True),  # a percentage equals its number either way (peers' leniency)
        ("12.5\\%", "0.125", True),
        ("25\\%", "0.5", False),
        ("[1, 5)", "[1,5)", True),
        ("[1, 5)", "(1, 5)", False),
        ("(-3, 4]", "(-3,5]", False),
        ("(3, -2)", "(3,-2)", None),  # a point, not an interval
        ("[2, 2]", "\\{2\\}", None),
        ("(1, 2)", "1", None),
        ("[-\\infty, 3]", "(-\\infty,3]", True),  # sympy opens infinite ends
        ("(-\\infty, 3)", "(-\\infty, 3]", False),
    ],
)
def test_fast_compare_cases(answer: str, label: str, expected: bool | None) -> None:
    assert fast_compare(answer, label) is expected


def _random_number(rng: random.Random) -> str:
    sign = "-" if rng.random() < 0.2 else ""
    kind = rng.randrange(4)
    if kind == 0:
        return sign + str(rng.choice([rng.randint(0, 20), rng.randint(0, 10**6), rng.randint(0, 10**30)]))
    if kind == 1:
        return sign + f"{rng.randint(0, 10 ** rng.randint(0, 6))}.{rng.randint(0, 10 ** rng.randint(1, 9))}"
    if kind == 2:
        return sign + f"{rng.randint(0, 30)}/{rng.randint(1, 30)}"
    return sign + rf"\frac{{{rng.randint(0, 30)}}}{{{rng.randint(1, 30)}}}"


def _neighbour(rng: random.Random, text: str) -> str:
    value = Fraction(text.replace(r"\frac{", "").replace("}{", "/").replace("}", ""))
    return rng.choice(
        [
            f"{value.numerator}/{value.denominator}" if value.denominator != 1 else str(value.numerator),
            f"{float(value):.6f}",
            f"{float(value):.4f}",
            f"{float(value):.8f}",
            text + ("0" if "." in text else ""),
        ]
    )


def test_fast_path_agrees_with_math_verify() -> None:
    """Every verdict the fast path gives must be math-verify's verdict for the same strings."""
    from math_verify import verify

    rng = random.Random(1234)
    decided = 0
    for _ in range(400):
        a = _random_number(rng)
        b = rng.choice([a, _neighbour(rng, a), _random_number(rng)])
        verdict = fast_compare(a, b)
        if verdict is None:
            continue
        decided += 1
        reference = verify(list(_parse_boxed(b)), list(_parse_boxed(a)), timeout_seconds=None)
        assert verdict == reference, (a, b)
    assert decided > 250  # the fast path must actually cover plain numbers


_SYMBOLIC = [
    "{a}\\sqrt{{{b}}}", "\\sqrt{{{c}}}", "{a}\\pi", "\\frac{{\\pi}}{{{b}}}", "x^2+{d}x+{e}", "(x+{a})^2", "{a}x+{b}",
    "{a}y+{b}", "{f}\\%", "{a}", "\\frac{{{a}}}{{{b}}}", "{g:.6f}", "x={a}", "({a}, {h}]", "\\{{{a},{b}\\}}", "e^{{{a}}}",
    "\\sin(x)^2+\\cos(x)^2", "\\log({b})", "{a}i", "\\frac{{1}}{{\\sqrt{{{b}}}}}", "\\frac{{\\sqrt{{{b}}}}}{{{b}}}",
    "{a} \\text{{ cm}}", "x^{{{a}}}", "\\frac{{x}}{{{b}}}", "\\infty", "{a}!", "\\binom{{{h}}}{{{a}}}",
    "\\begin{{pmatrix}}{a}\\\\{b}\\end{{pmatrix}}",
]  # fmt: skip


def test_numeric_reject_agrees_with_math_verify() -> None:
    """When the probe says "clearly different", math-verify must say False too."""
    from math_verify import verify

    from trainer.reward.math import _clearly_different

    rng = random.Random(99)
    decided = 0
    for _ in range(250):
        a, b = rng.randint(1, 9), rng.choice([2, 3, 5, 6, 7, 12])
        values = {"a": a, "b": b, "c": a * a * b, "d": 2 * a, "e": a * a, "f": 10 * a, "g": a / b, "h": a + b}
        x, y = (rng.choice(_SYMBOLIC).format(**values) for _ in range(2))
        gold, pred = _parse_boxed(y), _parse_boxed(x)
        if gold and pred and _clearly_different(gold, pred):
            decided += 1
            assert not verify(list(gold), list(pred), timeout_seconds=None), (x, y)
    assert decided > 80


@pytest.mark.parametrize(
    ("answer", "big"),
    [
        ("9^{9^{9^{9}}}", True),
        ("9^{9^{9}}", True),
        ("10^{10^{10}}", True),
        ("(10^{10})!", True),
        (r"\binom{10^{12}}{10^{6}}", True),
        (r"\frac{1}{2^{10^{10}}}", True),
        ("10^{100}", False),
        ("2^{1000}", False),
        ("100!", False),
        (r"\binom{10^{6}}{2}", False),
        ("x^{10^{10}}", False),  # symbolic: sympy keeps it symbolic
        ("1^{10^{100}}", False),
        (r"\sqrt{10^{9999}+1}", False),  # slow for other reasons: left to the pool timeout
    ],
)
def test_digit_guard(answer: str, big: bool) -> None:
    from trainer.reward.guard import too_big

    assert any(too_big(p, 100_000) for p in _parse_boxed(answer)) is big
    assert not any(too_big(p, 0) for p in _parse_boxed(answer))  # 0 disables


def test_interval_fast_path_agrees_with_math_verify() -> None:
    from math_verify import verify

    rng = random.Random(7)

    def interval() -> str:
        a, b = (rng.choice([str(rng.randint(-9, 9)), r"\infty", r"-\infty"]) for _ in range(2))
        return f"{rng.choice('[(')}{a}{rng.choice([', ', ','])}{b}{rng.choice(')]')}"

    decided = 0
    for _ in range(300):
        x = interval()
        y = rng.choice([interval(), x, x.replace(" ", "")])
        verdict = fast_compare(x, y)
        if verdict is not None:
            decided += 1
            reference = verify(list(_parse_boxed(y)), list(_parse_boxed(x)), timeout_seconds=None)
            assert verdict == reference, (x, y)
    assert decided > 60


def test_fast_path_off_gives_same_scores() -> None:
    slow = MathRewardConfig(fast_path=False)
    for response, label, expected in CASES[:8]:
        assert score_response(response, label, slow).score == expected


@pytest.mark.parametrize(
    ("label", "text"),
    [(3, "3"), (3.0, "3"), (0.5, "0.5"), (1e-07, "0.0000001"), (-2.25, "-2.25"), ("x", "x")],
)
def test_label_to_str(label: object, text: str) -> None:
    assert label_to_str(label) == text


@pytest.mark.parametrize("label", [True, None, [1], float("nan")])
def test_label_to_str_rejects(label: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        label_to_str(label)


def test_verify_answer_directly() -> None:
    assert verify_answer(r"\frac{1}{2}", "0.5").score == 1.0
    assert verify_answer(None, "0.5").reason == Reason.NO_ANSWER


# ---------------------------------------------------------------- dataset lookup

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1/2?"}]
CHATML = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1/2?<|im_end|>\n<|im_start|>assistant\n"


def test_render_chatml_exactly() -> None:
    assert render_prompt(CHAT, "chatml") == CHATML
    assert render_prompt("Hi", "chatml") == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt("Hi", "none") == "Hi"
    assert render_prompt("Hi", "Q: {}\nA:") == "Q: Hi\nA:"


@pytest.mark.parametrize(
    ("value", "template", "message"),
    [
        (CHAT, "none", "needs a string"),
        ([{"role": "user"}], "chatml", "message 0"),
        ("x", "llama9", "unknown prompt template"),
    ],
)
def test_render_errors(value: object, template: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render_prompt(value, template)


def test_dataset_json_array(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"q": "What is 2+2?", "answer": 4}, {"q": "Half?", "label": "1/2"}]))
    index = load_dataset(str(path), "q")
    assert len(index) == 2
    assert index.lookup("What is 2+2?") == "4"
    assert index.lookup("Half?") == "1/2"  # falls back to 'label'
    assert index.lookup("  Half?\n") == "1/2"  # whitespace-tolerant
    assert index.lookup("Unknown") is None


def test_dataset_jsonl_chatml(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    lines = [
        json.dumps({"message": CHAT, "answer": "0.5"}),
        "",
        json.dumps({"message": "Plain", "answer": "7"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    index = load_dataset(str(path), "message", template="chatml")
    assert index.lookup(CHATML) == "0.5"
    assert index.lookup("<|im_start|>user\nPlain<|im_end|>\n<|im_start|>assistant\n") == "7"
    assert index.lookup("Plain") is None


def test_dataset_custom_label_key(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"p": "x", "solution": "3", "answer": "9"}) + "\n")
    assert load_dataset(str(path), "p", label_key="solution").lookup("x") == "3"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"q": "a", "answer": 1}\n{oops\n', "line 2 is not valid JSON"),
        ('[{"q": "a", "answer": 1}', "invalid JSON"),
        ('{"other": "a", "answer": 1}\n', "has no 'q' field"),
        ('{"q": "a"}\n', "neither 'answer'"),
        ('["just a string"]', "record 0 is a string"),
        ('{"q": [{"role": "user", "content": "x"}], "answer": 1}\n', "needs a string"),
    ],
)
def test_dataset_errors_name_the_problem(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        load_dataset(str(path), "q")


def test_dataset_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(str(tmp_path / "nope.jsonl"), "q")
