"""Warm math-verify's LaTeX parser in the fork server, before any worker is forked.

The ANTLR runtime behind latex2sympy builds its DFA cache lazily: the first few
dozen parses in a fresh process cost ~60 ms each instead of ~1-10 ms. Imported
(only) through the fork server's preload list, so every worker, including each
replacement for a killed one, starts with a warm cache. Never import this in the
serving process: it costs ~0.3 s of CPU.
"""

from __future__ import annotations

from trainer.reward.math import verify_answer

SAMPLES = (
    r"\frac{1}{2}", r"2\sqrt{3}", r"\frac{\sqrt{2}}{2}", r"3\pi", r"\frac{\pi}{4}", r"(1, 2]", r"[-3, 4)",
    r"\{1, 2, 3\}", r"x^2+2x+1", r"(x+1)^2", r"50\%", r"5 \text{ cm}", r"\text{(A)}", r"x = 5", r"\infty",
    r"(-\infty, 3)", r"2^{10}", r"10!", r"\binom{5}{2}", r"e^{2}", r"\log_2 8", r"\sin(x)", r"3.14",
    r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"-\frac{3}{4}", r"\dfrac{5}{6}", r"a+b", r"\sqrt[3]{2}",
    r"1,000", r"(3, -2)", r"y = 2x + 1", r"x \in [0, 1]", r"\frac{a}{b}", r"\cos\theta", r"45^\circ",
)  # fmt: skip


def warm_up() -> None:
    """Parse and compare typical answers once (results are discarded)."""
    for i, sample in enumerate(SAMPLES):
        verify_answer(sample, sample)
        verify_answer(sample, SAMPLES[i - 1])


warm_up()
