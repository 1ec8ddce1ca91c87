"""Math answer verification: extraction + comparison with a reference through math-verify.

Pure functions, usable in-process by the trainer. The reference semantics are::

    verify(parse(r"\\boxed{" + label + "}"), parse(r"\\boxed{" + answer + "}"))

with math-verify's default LaTeX + expression extraction (``label`` and ``answer``
cleaned of ``$`` delimiters etc.). Shortcuts that give the same verdicts, each
checked against math-verify by randomized unit tests:

* plain integers, decimals, simple fractions and integer/infinite intervals are
  compared exactly without sympy (``fast_compare``);
* after parsing, two plain expressions whose values clearly differ at a probe point
  are "wrong" without running ``simplify()`` (``_clearly_different``).

Answers whose exact value would have more than ``max_digits`` digits (``9^{9^{9}}``)
score 0 as "too_complex" before sympy sees them (trainer.reward.guard).

math-verify's own timeouts use ``signal.alarm`` and only work in a main thread, so
they are disabled here: other hostile inputs (``\\sqrt{10^{9999}+1}``) still run for
minutes. Run untrusted input through :class:`trainer.reward.pool.VerifyPool`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple

from trainer.reward.extract import DEFAULT_STRATEGIES, clean_answer, extract_answer, extract_boxed
from trainer.reward.forms import LENIENCIES, lone_letter, unstyle_letters
from trainer.reward.guard import too_big
from trainer.reward.numeric import clearly_different, same_text

__all__ = [
    "MathRewardConfig",
    "Reason",
    "RewardResult",
    "fast_compare",
    "label_to_str",
    "normalize_answer",
    "normalize_label",
    "quick_check",
    "score_response",
    "verify_answer",
]

# We disable math-verify's signal-based timeouts on purpose (see module docstring);
# its once-per-process warning about that is noise in our logs.
logging.getLogger("math_verify").setLevel(logging.ERROR)


class Reason:
    """Values of :attr:`RewardResult.reason`."""

    CORRECT = "correct"
    WRONG = "wrong"
    NO_ANSWER = "no_answer"  # nothing extracted, or an empty box
    PARSE_ERROR = "parse_error"  # math-verify could not turn the answer into math
    BAD_LABEL = "bad_label"  # math-verify could not parse the reference answer
    NO_LABEL = "no_label"  # no reference answer for this item
    TOO_LONG = "too_long"  # extracted answer longer than MathRewardConfig.max_answer_chars
    TOO_COMPLEX = "too_complex"  # its exact value has more than MathRewardConfig.max_digits digits
    TIMEOUT = "timeout"  # verification exceeded the pool's per-item timeout
    ERROR = "error"  # unexpected exception or worker crash


@dataclass(frozen=True, slots=True)
class RewardResult:
    """Outcome of verifying one response: score is 1.0 or 0.0.

    ``path`` is the extraction strategy that found the answer (``boxed``, ``answer_is``, ...,
    ``final_expression`` for the no-marker fallback), None when nothing was extracted.
    """

    score: float
    reason: str
    extracted: str | None = None
    path: str | None = None

    @classmethod
    def of(cls, correct: bool, extracted: str | None) -> RewardResult:
        """A correct/wrong result."""
        return cls(1.0 if correct else 0.0, Reason.CORRECT if correct else Reason.WRONG, extracted)

    @property
    def detail(self) -> str:
        """The reason with the path that scored, e.g. ``correct:boxed``, ``wrong:final_expression``."""
        return self.reason if self.path is None else f"{self.reason}:{self.path}"

    def on_path(self, path: str | None) -> RewardResult:
        """This result, found through extraction strategy ``path``."""
        return self if path == self.path else replace(self, path=path)


@dataclass(frozen=True)
class MathRewardConfig:
    """How answers are extracted and compared.

    strategies: extraction strategy names tried in order (see trainer.reward.extract.STRATEGIES).
    fast_path: decide plain numbers/fractions without sympy (same verdicts as math-verify).
    max_answer_chars: longer extracted answers score 0 with reason "too_long" (sympy cost guard).
    max_digits: answers whose exact value would have more digits (``9^{9^{9}}``) score 0 with
        reason "too_complex" without calling sympy; 0 disables the check (the pool timeout remains).
    lenient: the leniencies on (trainer.reward.forms.LENIENCIES, all by default): ``units`` drops a
        unit after the answer (``2\\pi cm``), ``styled_letters`` reads ``\\mathcal{B}`` as ``B``. A dataset
        where the unit or the style is part of the answer turns them off (the service's ``--lenient``).
    """

    strategies: tuple[str, ...] = field(default=DEFAULT_STRATEGIES)
    fast_path: bool = True
    max_answer_chars: int = 1000
    max_digits: int = 100_000
    lenient: frozenset[str] = frozenset(LENIENCIES)


_DEFAULT_CONFIG = MathRewardConfig()


def label_to_str(label: object) -> str:
    """Render a JSON label (str, int or float) as the text math-verify will parse."""
    if isinstance(label, str):
        return label
    if isinstance(label, bool) or not isinstance(label, int | float):
        raise TypeError(f"label must be a string or a number, got {type(label).__name__}")
    if isinstance(label, float):
        if label != label or label in (float("inf"), float("-inf")):
            raise ValueError(f"label must be a finite number, got {label!r}")
        if label.is_integer() and abs(label) < 1e15:
            return str(int(label))
        return format(Decimal(repr(label)), "f")
    return str(label)


def normalize_answer(answer: str, config: MathRewardConfig | None = None, *, cleaned: bool = False) -> str:
    """An extracted answer as compared: cleaned (trainer.reward.extract.clean_answer) with the config's
    leniencies (units dropped, styled letters written plain). ``cleaned``: ``answer`` comes from
    ``extract_answer(..., units=...)`` with this config's units, so only the letters are left to do."""
    lenient = (config or _DEFAULT_CONFIG).lenient
    text = answer if cleaned else clean_answer(answer, units="units" in lenient)
    return unstyle_letters(text) if "styled_letters" in lenient else text


def normalize_label(label: str, config: MathRewardConfig | None = None) -> str:
    """A reference answer as compared: its last ``\\boxed{}`` content if any, then as an answer is."""
    boxed = extract_boxed(label) if "\\boxed" in label or "\\fbox" in label else None
    return normalize_answer(boxed if boxed is not None else label, config)


# ---------------------------------------------------------------- fast path


class _Num(NamedTuple):
    value: Fraction
    is_float: bool  # math-verify parses it to a sympy Float (rounded comparison)
    digits: int = 0  # digit count of a decimal: above 15, sympy gives the Float more precision


_INT_RE = re.compile(r"-?(?:0|[1-9]\d{0,299})")
_DEC_RE = re.compile(r"-?(?:0|[1-9]\d{0,14})\.\d{1,15}")
_SLASH_RE = re.compile(r"(-?)(0|[1-9]\d{0,29})/([1-9]\d{0,29})")
_FRAC_RE = re.compile(r"(-?)\\[dt]?frac\{(0|[1-9]\d{0,29})\}\{([1-9]\d{0,29})\}")
_FRAC_SHORT_RE = re.compile(r"(-?)\\[dt]?frac(\d)([1-9])")
_FLOAT_DECIDE_LIMIT = Fraction(10**6)
_FLOAT_DIGITS = 15
_FLOAT_ROUNDING_GAP = Fraction(2, 10**6)  # > one unit of math-verify's 6-decimal rounding


_THOUSANDS_RE = re.compile(r"-?[1-9]\d{0,2}(?:,\d{3})+")


def _as_number(text: str) -> _Num | None:
    if _INT_RE.fullmatch(text):
        return _Num(Fraction(int(text)), False)
    if _THOUSANDS_RE.fullmatch(text):  # 1,234: math-verify reads thousands separators in a box
        return _Num(Fraction(int(text.replace(",", ""))), False)
    if _DEC_RE.fullmatch(text):
        # math-verify rewrites exactly "0.5" to \frac{1}{2} (a Rational); same verdicts either way.
        return _Num(Fraction(text), True, sum(ch.isdigit() for ch in text))
    for pattern in (_SLASH_RE, _FRAC_RE, _FRAC_SHORT_RE):
        match = pattern.fullmatch(text)
        if match:
            sign, num, den = match.groups()
            value = Fraction(int(num), int(den))
            return _Num(-value if sign else value, False)
    return None


_END = r"(-?\d{1,15}|[-+]?\\infty)"
_INTERVAL_RE = re.compile(rf"([\[(])\s*{_END}\s*,\s*{_END}\s*([\])])")
_INF = 10**16  # beyond any 15-digit end


def _end_value(text: str) -> int:
    if text.endswith("\\infty"):
        return -_INF if text.startswith("-") else _INF
    return int(text)


def _as_interval(text: str) -> tuple[bool, int, int, bool] | None:
    """(left_open, lo, hi, right_open) of ``[a, b)``-style text with integer or infinite ends.

    None unless lo < hi (sympy turns the others into points, sets or nothing). Infinite
    ends are always open in sympy, whatever bracket was written.
    """
    match = _INTERVAL_RE.fullmatch(text)
    if not match:
        return None
    lo, hi = _end_value(match[2]), _end_value(match[3])
    if lo >= hi or lo == _INF or hi == -_INF:
        return None
    return match[1] == "(" or lo == -_INF, lo, hi, match[4] == ")" or hi == _INF


_PERCENT_SUFFIXES = ("\\%", "%")


def _split_percent(text: str) -> tuple[str, bool]:
    for suffix in _PERCENT_SUFFIXES:
        if text.endswith(suffix):
            return text[: -len(suffix)].rstrip(), True
    return text, False


def _compare_numbers(a: _Num, b: _Num) -> bool | None:
    if not (a.is_float or b.is_float):
        return a.value == b.value
    if abs(a.value) >= _FLOAT_DECIDE_LIMIT or abs(b.value) >= _FLOAT_DECIDE_LIMIT:
        return None  # sympy Float precision (15 digits) starts to matter
    if a.value == b.value:
        # Equal values compare equal after rounding only if both Floats have sympy's default
        # 15-digit precision; longer decimals round differently (seen: 40.0000000677703 vs
        # 40.00000006777030 -> False in math-verify).
        return True if a.digits <= _FLOAT_DIGITS and b.digits <= _FLOAT_DIGITS else None
    if abs(a.value - b.value) > _FLOAT_ROUNDING_GAP:
        return False
    return None


def fast_compare(answer: str, label: str) -> bool | None:
    """Compare plain numbers and integer intervals exactly as math-verify would, or return None.

    Integers and fractions compare exactly (sympy Integer/Rational equality). When a
    decimal is involved math-verify rounds both sides to 6 decimals; we answer only
    when the values are identical or clearly further apart than that rounding.
    Intervals are equal when brackets and ends are (math-verify's interval rule);
    their LaTeX parse is the slowest common case, hence this path.

    A percentage against a plain number (``12.5\\%`` vs ``12.5`` or ``0.125``) is equal when
    either reading is: the peers' graders accept both (hendrycks' MATH and PRM800K drop the
    sign, Qwen2.5-Math / DeepSeek-Math divide by 100); math-verify accepts only integers
    without the sign, so here we are more lenient than math-verify, on purpose.
    """
    answer, answer_pct = _split_percent(answer)
    label, label_pct = _split_percent(label)
    a = _as_number(answer)
    if a is None:
        if answer_pct or label_pct:
            return None
        ia = _as_interval(answer) if answer[:1] in "[(" else None
        ib = _as_interval(label) if ia is not None and label[:1] in "[(" else None
        return None if ia is None or ib is None else ia == ib
    b = _as_number(label)
    if b is None:
        return None
    if answer_pct == label_pct:
        return _compare_numbers(a, b)
    pct, plain = (a, b) if answer_pct else (b, a)
    as_is = _compare_numbers(pct, plain)
    hundredth = _compare_numbers(_Num(pct.value / 100, True, pct.digits + 2), plain)
    if as_is or hundredth:
        return True
    return False if as_is is False and hundredth is False else None


# ---------------------------------------------------------------- math-verify path


@lru_cache(maxsize=1)
def _extraction_config() -> tuple[object, ...]:
    """math-verify's default extraction, without its unit stripping: units are dropped before (leniency
    ``units``, trainer.reward.forms), so that the fast path and math-verify read the same text. Its own
    list strips single letters after a number (``\\boxed{2ab}`` would be 2)."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    normalization = NormalizationConfig(basic_latex=True, units=False, malformed_operators=True, nits=True,
                                        boxed="all", equations=False)
    return (LatexExtractionConfig(normalization_config=normalization), ExprExtractionConfig())


@lru_cache(maxsize=8192)
def _parse_boxed(text: str) -> tuple[object, ...]:
    """math-verify parse of ``\\boxed{text}`` (cached: labels repeat a lot)."""
    from math_verify import parse

    return tuple(parse("\\boxed{" + text + "}", list(_extraction_config()), parsing_timeout=None))


def _has_math(parsed: tuple[object, ...]) -> bool:
    from sympy import Basic, MatrixBase

    return any(isinstance(p, Basic | MatrixBase) for p in parsed)


_PROBE_POINTS = (0.5377, 1.8339, 0.8622, 1.3188, 0.6907, 1.4235, 0.7761, 1.2311)
_PROBE_DIGITS = 20


def _probe_value(expr: object, symbols: tuple[object, ...]) -> complex | None:
    """Value of a plain expression at fixed probe points, or None when not a finite number."""
    try:
        subs = dict(zip(symbols, _PROBE_POINTS, strict=False)) if symbols else None
        value = complex(expr.evalf(_PROBE_DIGITS, subs=subs))  # type: ignore[attr-defined]
    except (TypeError, ValueError, OverflowError, ZeroDivisionError, AttributeError):
        return None
    if value != value or abs(value) == float("inf"):
        return None
    return value


def _clearly_different(gold: tuple[object, ...], pred: tuple[object, ...]) -> bool:
    """True only if math-verify is certain to answer False, without running simplify().

    Applies when every sympy item on both sides is a plain expression (no sets, relations,
    matrices, bare symbols or percentages) and each gold/pred pair evaluates to clearly
    different numbers at the same probe point: then a - b is not identically zero, so
    none of math-verify's string, rounded-numeric or simplify() checks can succeed.
    String fallbacks must differ too (math-verify compares str/str pairs literally).
    """
    from sympy import Expr, MatrixExpr, Symbol, UnevaluatedExpr

    if not (_has_math(gold) and _has_math(pred)):
        return False  # verify() decides; the reason is then bad_label / parse_error
    maths = [x for x in gold + pred if not isinstance(x, str)]
    if len(maths) > 4:
        return False
    for x in maths:
        if not isinstance(x, Expr) or isinstance(x, MatrixExpr | Symbol) or x.has(UnevaluatedExpr):
            return False
    for g in gold:
        for p in pred:
            if isinstance(g, str) or isinstance(p, str):
                if isinstance(g, str) and isinstance(p, str) and g.strip() and g.strip() == p.strip():
                    return False
                continue
            symbols = tuple(sorted(g.free_symbols | p.free_symbols, key=str))  # type: ignore[attr-defined]
            if len(symbols) > len(_PROBE_POINTS):
                return False
            a, b = _probe_value(g, symbols), _probe_value(p, symbols)
            if a is None or b is None:
                return False
            if abs(a - b) <= max(2e-6, 1e-9 * max(abs(a), abs(b))):
                return False
    return True


_CHOICE = r"(?:\\text(?:bf)?\{\s*|\\mathrm\{\s*)?\(?([A-J])\)?(?:\s*\})?"
_CHOICE_LABEL = re.compile(_CHOICE)
_CHOICE_ANSWER = re.compile(_CHOICE + r"(?=$|[\s.:,;])")


def choice_letter(label: str) -> str | None:
    """The option letter of a multiple-choice label (``C``, ``(C)``, ``\\text{(C)}``), else None."""
    match = _CHOICE_LABEL.fullmatch(label)
    return match[1] if match else None


def quick_check(answer: str | None, label: str, config: MathRewardConfig) -> RewardResult | None:
    """Everything decidable without sympy; None means "needs math-verify".

    ``answer`` is the cleaned extracted answer, ``label`` the normalized reference. A
    multiple-choice label (one option letter) is compared with the option letter the answer
    starts with ("(C) 12", "C. 12"), as Qwen2.5-Math's and lighteval's graders do.
    """
    if not answer:
        return RewardResult(0.0, Reason.NO_ANSWER, answer)
    if not label:
        return RewardResult(0.0, Reason.BAD_LABEL, answer)
    if len(answer) > config.max_answer_chars:
        return RewardResult(0.0, Reason.TOO_LONG, answer)
    letter = choice_letter(label)
    if letter is not None:
        chosen = _CHOICE_ANSWER.match(answer)
        if chosen is not None:
            return RewardResult.of(chosen[1] == letter, answer)
    if "styled_letters" in config.lenient and "\\" in answer + label:
        ours, theirs = lone_letter(answer), lone_letter(label)  # \mathbb{R} against R
        if ours is not None and theirs is not None:
            return RewardResult.of(ours == theirs, answer)
    if config.fast_path:
        verdict = fast_compare(answer, label)
        if verdict is None and same_text(answer, label):
            verdict = True
        if verdict is None and clearly_different(answer, label):
            verdict = False
        if verdict is not None:
            return RewardResult.of(verdict, answer)
    return None


def verify_answer(answer: str | None, label: str, config: MathRewardConfig | None = None) -> RewardResult:
    """Compare an extracted answer with a reference answer (both plain text/LaTeX).

    No timeout: run through VerifyPool for untrusted input.
    """
    from math_verify import verify

    config = config or _DEFAULT_CONFIG
    label = normalize_label(label, config)
    answer = normalize_answer(answer, config) if answer is not None else None
    quick = quick_check(answer, label, config)
    if quick is not None:
        return quick
    assert answer is not None  # quick_check handles None
    try:
        gold = _parse_boxed(label)
        if not gold:
            return RewardResult(0.0, Reason.BAD_LABEL, answer)
        if any(too_big(g, config.max_digits) for g in gold):
            return RewardResult(0.0, Reason.BAD_LABEL, answer)
        pred = _parse_boxed(answer)
        if not pred:
            return RewardResult(0.0, Reason.PARSE_ERROR, answer)
        if any(too_big(p, config.max_digits) for p in pred):
            return RewardResult(0.0, Reason.TOO_COMPLEX, answer)
        if config.fast_path and _clearly_different(gold, pred):  # skips simplify() on wrong answers
            return RewardResult(0.0, Reason.WRONG, answer)
        if verify(list(gold), list(pred), timeout_seconds=None):
            return RewardResult(1.0, Reason.CORRECT, answer)
        if not _has_math(gold):  # only a string fallback: the label is not math
            return RewardResult(0.0, Reason.BAD_LABEL, answer)
        return RewardResult(0.0, Reason.WRONG if _has_math(pred) else Reason.PARSE_ERROR, answer)
    except (MemoryError, RecursionError):
        return RewardResult(0.0, Reason.ERROR, answer)


def score_response(response: str, label: str | None, config: MathRewardConfig | None = None) -> RewardResult:
    """Extract the final answer from ``response`` and verify it against ``label`` in-process."""
    config = config or _DEFAULT_CONFIG
    if label is None:
        return RewardResult(0.0, Reason.NO_LABEL, None)
    answer, strategy = extract_answer(response, config.strategies, units="units" in config.lenient)
    return verify_answer(answer, label, config).on_path(strategy)
