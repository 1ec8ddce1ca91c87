"""Final-answer extraction from model responses.

Each strategy is a pure function ``str -> str | None`` registered under a name in
:data:`STRATEGIES`; :func:`extract_answer` tries the configured names in order and
returns the first answer found. All scanners are linear in the response length
(no backtracking-prone regexes), so they are safe to run on untrusted text in the
request-handling process.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

__all__ = [
    "DEFAULT_STRATEGIES",
    "STRATEGIES",
    "clean_answer",
    "extract_answer",
    "extract_boxed",
    "validate_strategies",
]

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_IS = re.compile(r"(?i)\banswer\s*(?:is\b|:)")
_HASHES = "####"
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))


def _closing_brace(text: str, open_pos: int) -> int:
    """Index of the brace closing ``text[open_pos] == '{'``, or -1 when unbalanced.

    Escaped braces (``\\{`` / ``\\}``) do not count.
    """
    depth = 0
    i = open_pos
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def extract_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``.

    Braces inside the box must balance; an unclosed (truncated) box is skipped and
    the previous complete one is used. Returns ``""`` for an empty box and ``None``
    when there is no complete box at all.
    """
    end = len(text)
    while end > 0:
        start = max(text.rfind(cmd, 0, end) for cmd in _BOX_COMMANDS)
        if start < 0:
            return None
        cmd_len = len(_BOX_COMMANDS[0]) if text.startswith(_BOX_COMMANDS[0], start) else len(_BOX_COMMANDS[1])
        brace = start + cmd_len
        while brace < len(text) and text[brace] in " \t":
            brace += 1
        if brace < len(text) and text[brace] == "{":
            close = _closing_brace(text, brace)
            if close >= 0:
                return text[brace + 1 : close].strip()
        end = start
    return None


def _rest_of_line(text: str, pos: int) -> str:
    newline = text.find("\n", pos)
    return text[pos:] if newline < 0 else text[pos:newline]


def _cut_sentence(line: str) -> str:
    """Cut ``line`` at the first sentence end (". " not inside a number)."""
    for match in re.finditer(r"\.(?:\s|$)", line):
        if match.start() > 0:
            return line[: match.start()]
    return line


def extract_answer_is(text: str) -> str | None:
    """Text after the last "answer is" / "answer:" up to the end of that sentence."""
    last = None
    for last in _ANSWER_IS.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return None
    answer = clean_answer(_cut_sentence(_rest_of_line(text, last.end()).lstrip(" \t:")))
    inner = extract_boxed(answer)
    return answer if inner is None else inner


def extract_hashes(text: str) -> str | None:
    """GSM8K style: the rest of the line after the last ``####``."""
    pos = text.rfind(_HASHES)
    if pos < 0:
        return None
    return clean_answer(_rest_of_line(text, pos + len(_HASHES)))


def extract_last_number(text: str) -> str | None:
    """The last number in ``text`` (integer, decimal, ``a/b``; thousands commas removed)."""
    last = None
    for last in _NUMBER.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return None
    number = last.group(0)
    return number.replace(",", "") if _THOUSANDS.match(number) else number


STRATEGIES: dict[str, Callable[[str], str | None]] = {
    "boxed": extract_boxed,
    "answer_is": extract_answer_is,
    "hash": extract_hashes,
    "last_number": extract_last_number,
}
"""Extraction strategies by name, in the order users usually want them."""

DEFAULT_STRATEGIES: tuple[str, ...] = ("boxed", "answer_is", "hash")
"""``last_number`` is opt-in: it rewards answers the model never marked as final."""


def validate_strategies(names: Sequence[str]) -> tuple[str, ...]:
    """Return ``names`` as a tuple, or raise ValueError naming the unknown ones."""
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown or not names:
        raise ValueError(
            f"unknown extraction strategy {', '.join(map(repr, unknown)) or '(none given)'}; "
            f"expected one or more of {', '.join(STRATEGIES)}"
        )
    return tuple(names)


def clean_answer(answer: str) -> str:
    """Strip whitespace, math delimiters (``$..$``, ``\\(..\\)``, ``**..**``) and a final period."""
    text = answer.strip()
    changed = True
    while changed and text:
        changed = False
        for left, right in _WRAPPERS:
            if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
                text = text[len(left) : len(text) - len(right)].strip()
                changed = True
        if text.endswith(".") and not text.endswith(".."):
            text = text[:-1].rstrip()
            changed = True
    return text


def extract_answer(
    text: str, strategies: Sequence[str] = DEFAULT_STRATEGIES
) -> tuple[str | None, str | None]:
    """Extract the final answer from ``text``.

    Tries each named strategy in order; the first one that finds something wins.
    Returns ``(answer, strategy_name)``, or ``(None, None)`` when nothing was found.
    The answer may be ``""`` (e.g. an empty ``\\boxed{}``): callers treat that as
    "no answer" without falling back, because the model did mark an answer.
    """
    for name in strategies:
        found = STRATEGIES[name](text)
        if found is not None:
            return clean_answer(found), name
    return None, None
