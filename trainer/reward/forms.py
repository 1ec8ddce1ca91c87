r"""Spellings of an answer that mean the same thing: radicals, stray characters, units, styled letters.

Two kinds, both applied to the extracted answer and to the label alike (``trainer.reward.math``):

* spelling fixes, always on (:func:`fix_spelling`): they cannot change what an answer means.
  ``\sqrt[3]2`` is ``\sqrt[3]{2}`` and ``\sqrt 3`` is ``\sqrt{3}`` (TeX takes one token when no brace
  follows: one digit, one letter or one Greek letter); ``\mathcal P`` is ``\mathcal{P}``; a label's
  stray trailing backslash, line break or slash (``185\``, ``185\\``, ``24/``) is dropped.
* leniencies, on by default and switchable per dataset (:data:`LENIENCIES`, the reward service's
  ``--lenient``), because each can hurt a dataset where the difference matters:

  - ``units``: a unit after the answer is dropped (``2\pi cm``, ``4\pi \text{ cm}^2``,
    ``3\sqrt{2}\ \mathrm{m}``, ``4 meters``): wrong for a dataset whose labels carry the unit that
    is asked for (``5 m`` against ``5 cm``);
  - ``styled_letters``: a letter in a font or style command is the letter (``\mathcal{B}`` = ``B``,
    ``\mathbf{v}`` = ``v``; a whole answer ``\mathbb{R}`` = ``R``): wrong where the style is the
    answer (a vector against its length, a set against a point).

Everything here is linear in the text length (no backtracking-prone patterns), like the extraction.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

__all__ = [
    "LENIENCIES",
    "UNIT_WORD",
    "UnknownNames",
    "choose",
    "fix_spelling",
    "lone_letter",
    "strip_units",
    "unstyle_letters",
    "validate_leniencies",
]

LENIENCIES: tuple[str, ...] = ("units", "styled_letters")
"""The switchable leniencies, all on by default (see the module docstring)."""


class UnknownNames(ValueError):
    """Names that are not among the ones a setting knows (:func:`choose`): ``unknown`` holds them (empty when none
    was given), ``known`` the names there are."""

    def __init__(self, message: str, unknown: list[Any], known: Iterable[str]) -> None:
        super().__init__(message)
        self.unknown, self.known = unknown, tuple(known)


def choose(names: Iterable[Any], known: Iterable[str], what: str, *, none: bool = False) -> tuple[str, ...]:
    """``names`` (stripped; empty ones dropped) as a tuple when each is one of ``known`` and there is one at least;
    with ``none``, ``none`` alone is the empty choice. Else :class:`UnknownNames`, saying which are not known (the
    rule of the reward service's --extract and --lenient, and of the inventory's reward_server__extract and
    reward_server__lenient)."""
    known = tuple(known)
    names = [n.strip() if isinstance(n, str) else n for n in names]
    names = [n for n in names if n != ""]
    if none and names == ["none"]:
        return ()
    unknown = [n for n in names if not isinstance(n, str) or n not in known]
    if unknown or not names:
        listed = ", ".join(map(repr, unknown)) or "(none given)"
        raise UnknownNames(f"unknown {what} {listed}; expected one or more of {', '.join(known)}"
                           + (", or none" if none else ""), unknown, known)
    return tuple(names)


def validate_leniencies(names: Iterable[str]) -> frozenset[str]:
    """``names`` as a frozenset, or :class:`UnknownNames`. ``none`` alone means no leniency."""
    return frozenset(choose(names, LENIENCIES, "leniency", none=True))


# ---------------------------------------------------------------- spelling fixes (always on)

_GREEK = (
    "alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|pi|rho|sigma"
    "|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Pi|Sigma|Phi|Psi|Omega"
)
# \sqrt or \sqrt[n] followed by one unbraced token: a digit, a letter or a Greek letter.
_BARE_RADICAND = re.compile(rf"\\sqrt(\s*\[[^\[\]{{}}]{{1,20}}\])?\s*(\\(?:{_GREEK})(?![A-Za-z])|[0-9A-Za-z])")
_STYLES = "mathcal|mathscr|mathfrak|mathsf|mathit|mathbf|mathrm|mathnormal|boldsymbol|bm|pmb|mathbb"
# A style command with an unbraced letter: "\mathcal P", "\mathbb Z".
_BARE_STYLED = re.compile(rf"\\({_STYLES})\s+([A-Za-z])(?![A-Za-z])")


def fix_spelling(text: str) -> str:
    r"""``text`` with radicals braced, styled letters braced and a stray tail dropped (meaning kept)."""
    if "\\" not in text and "/" not in text:
        return text
    if "\\sqrt" in text:
        text = _BARE_RADICAND.sub(lambda m: f"\\sqrt{(m[1] or '').strip()}{{{m[2]}}}", text)
    if "\\math" in text or "\\b" in text or "\\pmb" in text:
        text = _BARE_STYLED.sub(r"\\\1{\2}", text)
    return _drop_stray_tail(text)


def _drop_stray_tail(text: str) -> str:
    r"""``text`` without what may trail an answer and mean nothing: backslashes (a stray one, a TeX line
    break ``\\``, a control space ``\ ``) and a final slash after an operand."""
    text = text.rstrip()
    core = text.rstrip("\\ \t\n")
    if core != text and "\\" in text[len(core) :] and core and not core.endswith(("^", "_")):
        text = core
    if len(text) > 1 and text.endswith("/") and (text[-2].isalnum() or text[-2] in "})]"):
        text = text[:-1]
    return text


# ---------------------------------------------------------------- units (leniency "units")

# Units written as words after an expression: learned from the unit lists of verl's prime_math and
# OpenRLHF's math_utils (cm, meter, second, ...), lm-eval's Minerva normaliser and Qwen2.5-Math's
# parser. Two letters at least: a single letter after an expression is more often a variable
# (2\pi r h) than a unit; single-letter units count inside \text{} / \mathrm{} only, or after a plain
# number (trainer.reward.extract.clean_answer).
_UNIT_NAMES = (
    "mm|cm|dm|km|nm|ft|yd|mi|mph|kph|kmh|kg|mg|lb|lbs|oz|sec|min|hr|hrs|yr|yrs|ml|mL|cl|gal|deg|rad|sq|cu"
    "|inch|inches|foot|feet|yard|mile|meter|metre|centimeter|centimetre|millimeter|millimetre|kilometer"
    "|kilometre|gram|kilogram|pound|ounce|ton|tonne|second|minute|hour|day|week|month|year|liter|litre"
    "|gallon|degree|radian|unit|cent|dollar|square|cubic|acre|hectare"
)
UNIT_WORD = rf"(?:{_UNIT_NAMES})(?:e?s)?(?:\^\{{?[23]\}}?|[²³])?"
"""One unit word, two letters at least (``cm``, ``inches``, ``cm^2``), as a regex."""
_UNIT_PHRASE = rf"{UNIT_WORD}(?:\s*/\s*(?:{UNIT_WORD}|[smhgL])|\s+{UNIT_WORD}){{0,2}}"
_SPACING = r"(?:\s|\\[,;:! ]|~)*"
# A unit in a text-like group: \text{ cm}, \mathrm{m}, \mbox{ square units}, with ^2 / ^3 after it.
_TEXT_UNIT = re.compile(
    rf"(?<=[\w}})\]$]){_SPACING}\\(?:text|textnormal|textrm|mbox|mathrm)\s*"
    r"\{[\s~]*[A-Za-z°][A-Za-z°./\s^0-9]{0,40}\}(?:\^\{?[23]\}?|[²³])?\s*$"
)
# A unit word at the end, after a space or right after a digit, a brace or a bracket.
_WORD_UNIT = re.compile(rf"(?:(?<=[\d}})\]])|(?<=[\w}})\]$])\s){_SPACING}{_UNIT_PHRASE}\s*$")
# Square / cubic metres written m^2, m^3: a single letter, but only with its power.
_METRE_POWER = re.compile(rf"(?<=[\w}})\]$])\s{_SPACING}m(?:\^\{{?[23]\}}?|[²³])\s*$")


_TEXT_GROUPS = ("\\text", "\\mbox", "\\mathrm")
_TEXT_GROUP_END = re.compile(r"\\text\w*\s*\{[^{}]*\}$")
_TAIL_CHARS = 120  # a unit is short: the patterns look at the end of the text only (bounded cost)


def strip_units(text: str) -> str:
    r"""``text`` without a unit at its end (``2\pi cm`` -> ``2\pi``); unchanged when nothing but the unit
    would be left, or when what precedes it ends in an operator or in text (the "unit" is then an
    operand, or a word of a text answer)."""
    end = text.rstrip()[-6:]
    if not end or not (end[-1].isalpha() or end[-1] in "}²³" or end.endswith(("^2", "^3"))):
        return text  # most answers end in a digit or a closing bracket: no unit can end there
    offset = max(0, len(text) - _TAIL_CHARS)
    tail = text[offset:]
    patterns = (_WORD_UNIT, _METRE_POWER)
    if any(group in tail for group in _TEXT_GROUPS):
        patterns = (_TEXT_UNIT, *patterns)
    for pattern in patterns:
        match = pattern.search(tail)
        if match is not None:
            rest = text[: offset + match.start()].rstrip()
            if (rest and not rest.endswith(("+", "-", "*", "/", "^", "_", "=", "(", "[", "{", ",", "\\"))
                    and not _TEXT_GROUP_END.search(rest[-60:])):
                return rest
    return text


# ---------------------------------------------------------------- styled letters (leniency "styled_letters")

# Every style but \mathbb, which names a set (\mathbb{R} is (-\infty, \infty) to math-verify): a whole
# answer \mathbb{R} matches a bare R through lone_letter() only.
_UNWRAP = re.compile(
    r"\\(?:mathcal|mathscr|mathfrak|mathsf|mathit|mathbf|mathrm|mathnormal|boldsymbol|bm|pmb"
    r"|text|textbf|textit|textrm|textsf|textnormal)\s*\{\s*([A-Za-z])\s*\}"
)
_LONE = re.compile(rf"(?:\\(?:{_STYLES}|text|textbf|textit|textrm|textsf|textnormal)\s*\{{\s*([A-Za-z])\s*\}}|([A-Za-z]))")


def unstyle_letters(text: str) -> str:
    r"""``text`` with every styled single letter written plain (``\mathcal{B} \cup C`` -> ``B \cup C``)."""
    if "\\" not in text:
        return text

    def plain(m: re.Match[str]) -> str:  # "\sin\mathbf{x}" -> "\sin x", not "\sinx"
        before = m.string[m.start() - 1] if m.start() else ""
        return (" " if before.isalpha() else "") + m[1]

    return _UNWRAP.sub(plain, text)


def lone_letter(text: str) -> str | None:
    r"""The letter of an answer that is one letter, plain or in any style (``\mathbb{R}`` -> ``R``), else None."""
    match = _LONE.fullmatch(text.strip())
    return None if match is None else (match[1] or match[2])
