"""Extraction details (issue 15): special tokens, the final-expression fallback, listed boxes, cleaning."""

from __future__ import annotations

import time

import pytest

from trainer.reward.extract import (
    clean_answer,
    extract_answer,
    extract_boxed,
    extract_final_expression,
    strip_special_tokens,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 4<|im_end|>", "#### 4"),
        ("The answer is 4<|im_end|><|endoftext|><|endoftext|>", "The answer is 4"),
        ("x</s></s>", "x"),
        ("Answer: 5<|eot_id|>", "Answer: 5"),
        ("Answer: 5<｜end▁of▁sentence｜>", "Answer: 5"),
        ("Answer: 5<end_of_turn>", "Answer: 5"),
        ("9<|im_end|>\n<|im_start|>user\nmore?<|im_end|>", "9"),  # a new turn after the end is not the answer
        ("<|im_start|>user\nQ: 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>", "\n4"),
        ("<|start_header_id|>assistant<|end_header_id|>\n\n7<|eot_id|>", "\n\n7"),
        ("<|im_end|>\nleading marker, then text<|im_end|>", "\nleading marker, then text"),
        ("<|start|>assistant<|channel|>final<|message|>5<|return|>", "5"),
        ("no markers at all", "no markers at all"),
        ("a < b and c > d", "a < b and c > d"),
    ],
)
def test_strip_special_tokens(text: str, expected: str) -> None:
    assert strip_special_tokens(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She makes $18 every day.", "18"),  # a price, not math
        ("She sells 9 at $2 each, making $18 every day.", "18"),
        (r"Adding $\frac{1}{2}$ and $\frac{1}{4}$ gives $\frac{3}{4}$.", r"\frac{3}{4}"),
        (r"the solutions are $x=0$ and $x=1$.", "x=0, x=1"),
        (r"so $x = 5 + 5 + 1 = 11$", "11"),
        ("12000 / 40 = 300 minutes", "300"),
        ("the total is 1,234,567 dollars", "1234567"),
        ("a drop of 25%.", r"25\%"),
        ("it falls to -5 degrees", "-5"),
        ("pages 3-4", "4"),
        ("AZYUK2A", None),
        ("no numbers here", None),
        (r"The vector is \[\begin{pmatrix} 2 \\ -1 \end{pmatrix}\]", r"\begin{pmatrix} 2 \\ -1 \end{pmatrix}"),
        (r"$$x^2$$ then \(y\)", "y"),
        (r"unclosed $x + 1", "1"),
    ],
)
def test_final_expression(text: str, expected: str | None) -> None:
    assert extract_final_expression(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{1}, \boxed{2} and \boxed{3}", "1, 2, 3"),
        (r"$\boxed{3}$ or $\boxed{5}$", "3, 5"),
        (r"\(\boxed{1}\) and \(\boxed{-2}\).", "1, -2"),
        (r"\boxed{1} and and or thus but \boxed{2} and \boxed{3}", "2, 3"),
        (r"\boxed{3} then \boxed{5}", "5"),
        (r"\boxed{1} \boxed{5}", "5"),  # no separator: not a list
        (r"\boxed{7} and a truncated \boxed{", "7"),
    ],
)
def test_listed_boxes(text: str, expected: str) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("4 meters", "4"),
        ("60 mph", "60"),
        ("20 m^2", "20"),
        ("30 min", "30"),
        ("1 million", "1000000"),
        ("20 percent", r"20\%"),
        ("1 000", "1000"),
        ("5 x", "5 x"),  # a variable, not a unit
        ("2 pi", r"2 \pi"),
        ("5 and 6", "5 and 6"),
        (r"\frac{\sqrt{3}}{3} \approx 0.577", r"\frac{\sqrt{3}}{3}"),
        ("x = 5 + 5 + 1 = 11", "11"),
        ("y = 2x + 1", "y = 2x + 1"),
        ("a=1, b=2", "a=1, b=2"),
    ],
)
def test_clean_answer_units_and_forms(raw: str, clean: str) -> None:
    assert clean_answer(raw) == clean


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>72</answer>", ("72", "answer_tag")),
        ("<answer>The answer is 15.</answer>", ("15", "answer_tag")),
        ("<answer>So she has 7 left over</answer>", ("7", "answer_tag")),
        ("<think>the answer is 10? no</think>\nThere are 12.", ("12", "final_expression")),
        ("<think>all of it \\boxed{3}</think>", ("3", "boxed")),  # nothing after the thinking
        ("**Answer:** 7", ("7", "answer_is")),
        ("so the answer should be 12, not 15.", ("12, not 15", "answer_is")),
        ("Answer = 9", ("9", "answer_is")),
    ],
)
def test_markers_and_thinking(text: str, expected: tuple[str, str]) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "$a " * 200_000,  # many openers, never closed
        "<|" * 200_000,
        "\\boxed{" * 50_000,
        "1," * 200_000,
        "$1 $" * 100_000,
    ],
)
def test_scanners_are_linear_on_hostile_text(text: str) -> None:
    started = time.process_time()
    extract_answer(text)
    assert time.process_time() - started < 2.0
