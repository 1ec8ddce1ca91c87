r"""Final-answer extraction from model responses.

:func:`extract_answer` works in three steps:

1. :func:`strip_special_tokens`: the response is what follows the last assistant-turn opener
   (``<|im_start|>assistant``, ``<|start_header_id|>assistant<|end_header_id|>``, ...) and
   precedes the first end-of-turn marker (``<|im_end|>``, ``<|endoftext|>``, ``</s>``,
   ``<|eot_id|>``, ``<｜end▁of▁sentence｜>``, ...); any other special token is dropped.
   Trainers that decode with ``skip_special_tokens=False`` (OpenRLHF's default) send them.
2. The strategies, in the configured order; the first that finds something wins. The
   *marker* strategies read what the model marked as final: ``boxed`` (last ``\boxed{}``,
   with boxes listed just before it: ``\boxed{1}, \boxed{2}``), ``answer_tag``
   (``<answer>...</answer>``), ``answer_is`` ("the answer is ...", "Answer: ..."), ``hash``
   (GSM8K's ``#### ...``). ``final_expression`` is the fallback for responses without a
   marker: the last math expression of the response, as math-verify reads one (the last
   ``$...$`` / ``\(...\)`` / ``\[...\]`` span, with spans listed just before it, or a plain
   number after it, whichever ends last). ``last_number`` is the older, opt-in fallback.
3. :func:`clean_answer`: delimiters, a final period, trailing units after a plain number,
   thousands separators, "approximately" tails and chained equalities are removed.

Each scanner is linear in the response length (no backtracking-prone regexes), so they are
safe to run on untrusted text in the request-handling process.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from trainer.reward.forms import UNIT_WORD, choose, fix_spelling, strip_units

__all__ = [
    "DEFAULT_STRATEGIES",
    "FALLBACK_STRATEGIES",
    "MARKER_STRATEGIES",
    "STRATEGIES",
    "clean_answer",
    "extract_answer",
    "extract_boxed",
    "extract_final_expression",
    "strip_special_tokens",
    "validate_strategies",
]

# ---------------------------------------------------------------- special tokens

# The turn openers after which the assistant's text starts (ChatML, Llama 3, DeepSeek, Gemma,
# Phi, gpt-oss harmony, Llama 2 / Mistral).
_TURN_OPENER = re.compile(
    r"<\|im_start\|>assistant|<\|start_header_id\|>assistant<\|end_header_id\|>|<｜Assistant｜>"
    r"|<start_of_turn>model|<\|assistant\|>|\[/INST\]"
    r"|<\|start\|>assistant(?:<\|channel\|>[^<\n]{0,40})?(?:<\|message\|>)?"
)
# End-of-turn / end-of-text markers: the response ends at the first one.
_END_OF_TURN = re.compile(
    r"<\|(?:im_end|endoftext|end_of_text|eot_id|eom_id|end|return|EOT|end_of_turn|endofturn|eos)\|>"
    r"|<｜end▁of▁sentence｜>|<\|end▁of▁sentence\|>|</s>|<eos>|<end_of_turn>"
)
# Any special-token-shaped piece: <|name|>, <｜name｜>, <s>, </s>, <eos>, <pad>, ...
_SPECIAL = re.compile(
    r"<\|[^|<>\n]{1,40}\|>|<｜[^｜<>\n]{1,40}｜>|</?s>|<(?:eos|bos|pad|unk|end_of_turn|start_of_turn)>"
)


def strip_special_tokens(text: str) -> str:
    """The assistant's text of ``text``, without chat-template special tokens.

    Starts after the last assistant-turn opener, ends at the first end-of-turn marker that
    follows some content (leading markers are skipped), and drops every other special token.
    """
    if "<" not in text and "[/INST]" not in text:
        return text
    opener = None
    for opener in _TURN_OPENER.finditer(text):  # noqa: B007 - we want the last match
        pass
    if opener is not None:
        text = text[opener.end() :]
    content = 0  # first index of non-space text that is not inside a special token
    for special in _SPECIAL.finditer(text):
        if text[content : special.start()].strip():
            break
        content = special.end()
    end = _END_OF_TURN.search(text, content)
    if end is not None:
        text = text[: end.start()]
    return _SPECIAL.sub("", text)


# ---------------------------------------------------------------- boxed

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)[ \t]*\{")
_BRACE_TOKEN = re.compile(r"\\[\s\S]|[{}]")  # an escaped character, or a brace
# What may separate boxes listed as one answer: "\boxed{1}, \boxed{2} and \boxed{3}".
_BOX_LIST_GAP = re.compile(r"(?:[\s$,;]|\\[()\[\]]|\\q?quad|\\text\{\s*(?:and|or)\s*\}|\b(?:and|or)\b)*")
_LIST_SEPARATOR = re.compile(r"[,;]|\\q?quad|\b(?:and|or)\b")
_MAX_LISTED = 6


def _brace_pairs(text: str) -> dict[int, int]:
    """Index of each ``{`` -> index of the ``}`` that closes it, in one pass.

    Escaped braces (``\\{`` / ``\\}``) do not count; unbalanced ones have no entry.
    """
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for token in _BRACE_TOKEN.finditer(text):
        ch = token.group()
        if ch == "{":
            stack.append(token.start())
        elif ch == "}" and stack:
            pairs[stack.pop()] = token.start()
    return pairs


def _boxes(text: str) -> list[tuple[int, int, int]]:
    """(command start, content start, closing brace) of every complete box, in order, in one pass."""
    pairs = _brace_pairs(text)
    boxes = []
    for command in _BOX_COMMAND.finditer(text):
        close = pairs.get(command.end() - 1, -1)
        if close >= 0:
            boxes.append((command.start(), command.end(), close))
    return boxes


def extract_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``.

    Braces inside the box must balance; an unclosed (truncated) box is skipped and the
    previous complete one is used. Boxes listed right before it, separated only by commas,
    "and", "or" or ``\\quad`` (``\\boxed{1}, \\boxed{2} and \\boxed{3}``), join it as one
    list answer ``1, 2, 3``. Returns ``""`` for an empty box and ``None`` when there is no
    complete box at all.
    """
    if "\\boxed" not in text and "\\fbox" not in text:
        return None
    boxes = _boxes(text)
    if not boxes:
        return None
    box = boxes[-1]
    parts = [text[box[1] : box[2]].strip()]
    k = len(boxes) - 2
    while k >= 0 and len(parts) < _MAX_LISTED:
        previous = boxes[k]
        if previous[2] > box[0]:  # nested in this one
            k -= 1
            continue
        gap = _BOX_LIST_GAP.match(text, previous[2] + 1)
        if gap is None or gap.end() != box[0] or not parts[0] or not _LIST_SEPARATOR.search(gap.group()):
            break
        box = previous
        parts.insert(0, text[box[1] : box[2]].strip())
        k -= 1
    return parts[0] if len(parts) == 1 else ", ".join(p for p in parts if p)


# ---------------------------------------------------------------- marker strategies

_ANSWER_IS = re.compile(r"(?i)\banswer\s*(?:(?:is|should be|would be|will be|must be)\b|:|=)")
_HASHES = "####"
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))


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
    rest = _rest_of_line(text, last.end()).lstrip(" \t:")
    if rest.startswith("**") and "**" not in rest[2:]:
        rest = rest[2:]  # the bold label's closing marks: "**Answer:** 7"
    answer = clean_answer(_cut_sentence(rest.lstrip()), units=False)  # extract_answer drops units, if asked
    inner = extract_boxed(answer)
    return answer if inner is None else inner


def extract_hashes(text: str) -> str | None:
    """GSM8K style: the rest of the line after the last ``####``."""
    pos = text.rfind(_HASHES)
    if pos < 0:
        return None
    return clean_answer(_rest_of_line(text, pos + len(_HASHES)), units=False)


_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}\b")


def extract_answer_tag(text: str) -> str | None:
    """The last ``<answer>...</answer>`` (R1-style): a marker inside it, else its content.

    Content that reads as prose (two words or more) goes through ``final_expression``.
    """
    start = text.rfind("<answer>")
    if start < 0:
        return None
    end = text.find("</answer>", start)
    inner = text[start + len("<answer>") : end if end >= 0 else len(text)]
    for strategy in (extract_boxed, extract_answer_is, extract_hashes):
        found = strategy(inner)
        if found is not None:
            return found
    if len(_PROSE_WORD.findall(inner)) >= 2:
        return extract_final_expression(inner)
    return inner.strip()


# ---------------------------------------------------------------- the fallback: final expression

_DELIMITER = re.compile(r"\\[\[\]()$]|\$\$|\$|\n")
_SPAN_LIST_GAP = re.compile(r"\s*(?:,\s*(?:and|or)?|and|or|;)\s*")
_TEXT_NUMBER = re.compile(
    r"(?<![\w.\\])(?P<sign>-)?[$€£¥]?"
    r"(?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:/\d+)?|\.\d+)"
    r"(?P<percent>\s?%|\s?percent\b)?"
)


def _math_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of the math spans of ``text``, in order, in one linear pass.

    ``$$..$$``, ``\\[..\\]``, ``\\(..\\)`` and ``$..$``. An inline ``$`` span follows
    pandoc's rule, so that prices ("$2 each, making $18") are not math: the opening ``$``
    has a non-space character right after it, the closing one a non-space character right
    before it and no digit right after it, and the span stays on one line.
    """
    spans: list[tuple[int, int, str]] = []
    state: str | None = None  # None, "$", "$$", "\\[", "\\("
    open_end = 0  # where the open span's content starts
    n = len(text)
    for token in _DELIMITER.finditer(text):
        kind, pos = token.group(), token.start()
        if kind == "\\$":
            continue  # an escaped dollar is text
        if state is None:
            if kind in ("$$", "\\[", "\\("):
                state, open_end = kind, token.end()
            elif kind == "$" and token.end() < n and not text[token.end()].isspace():
                state, open_end = "$", token.end()
            continue
        if state == "$":
            if kind == "\n":
                state = None
            elif kind in ("$", "$$"):
                closes = not text[pos - 1].isspace() and not (pos + 1 < n and text[pos + 1].isdigit())
                if closes and pos > open_end:
                    spans.append((open_end - 1, pos + 1, text[open_end:pos]))
                    state = None
                elif pos + 1 < n and not text[pos + 1].isspace():
                    open_end = pos + 1  # not a closer, but a valid opener: the first $ was a price
            continue
        closer = {"$$": "$$", "\\[": "\\]", "\\(": "\\)"}[state]
        if kind == closer:
            spans.append((open_end - len(state), token.end(), text[open_end:pos]))
            state = None
    return spans


def extract_final_expression(text: str) -> str | None:
    """The last math expression of ``text`` (the fallback for responses without a marker).

    The last math span wins, together with the spans listed right before it ("$x=0$ and $x=1$"),
    unless a plain number follows it: then that number (sign, thousands separators, a simple
    ``a/b``, a percent sign) is the answer. None when the text has neither.
    """
    spans = _math_spans(text)
    tail_start = spans[-1][1] if spans else 0
    number = None
    for number in _TEXT_NUMBER.finditer(text, tail_start):  # noqa: B007 - we want the last match
        pass
    if number is not None:
        value = number["number"].replace(",", "") if "," in number["number"] else number["number"]
        return (number["sign"] or "") + value + ("\\%" if number["percent"] else "")
    if not spans:
        return None
    listed = [spans[-1]]
    for previous in reversed(spans[:-1]):
        if len(listed) >= _MAX_LISTED:
            break
        gap = _SPAN_LIST_GAP.fullmatch(text, previous[1], listed[0][0])
        if gap is None:
            break
        listed.insert(0, previous)
    return ", ".join(clean_answer(content, units=False) for _, _, content in listed)


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
    "answer_tag": extract_answer_tag,
    "answer_is": extract_answer_is,
    "hash": extract_hashes,
    "final_expression": extract_final_expression,
    "last_number": extract_last_number,
}
"""Extraction strategies by name, in the order users usually want them."""

MARKER_STRATEGIES: tuple[str, ...] = ("boxed", "answer_tag", "answer_is", "hash")
"""Strategies that read what the model marked as its final answer."""

FALLBACK_STRATEGIES: tuple[str, ...] = ("final_expression", "last_number")
"""Strategies for responses without a marker."""

DEFAULT_STRATEGIES: tuple[str, ...] = (*MARKER_STRATEGIES, "final_expression")
"""Markers first, then the final expression. Leave ``final_expression`` out (``--extract
boxed,answer_tag,answer_is,hash``) for datasets whose answers must be marked to count."""


def validate_strategies(names: Sequence[str]) -> tuple[str, ...]:
    """Return ``names`` as a tuple, or raise :class:`trainer.reward.forms.UnknownNames` (a ValueError) naming the
    unknown ones."""
    return choose(names, STRATEGIES, "extraction strategy")


# ---------------------------------------------------------------- cleaning

# Units after a plain number ("4 meters", "60 mph", "20 m^2"), learned from the unit lists of
# the Minerva normaliser, PRM800K's grader and Qwen2.5-Math's parser. Single letters only
# where they cannot be a variable of the answer.
_UNIT_WORD = (
    r"(?:[a-zA-Z]{2,}|[mgsLlhKVWJN])(?:\^?[23²³])?(?:/[a-zA-Z]+(?:\^?[23²³])?)?\.?"
)
_NUMBER_UNITS = re.compile(
    rf"(?P<number>[-−]?[$€£¥]?\d[\d,]*(?:\.\d+)?(?:/\d+)?)\s*(?P<units>{_UNIT_WORD}(?:\s+{_UNIT_WORD}){{0,2}})"
)
_NOT_UNITS = frozenset({"pi", "sqrt", "frac", "and", "or", "times", "cdot", "to", "of", "is", "i", "e", "x"})
_SCALE_WORDS = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_SPACE_THOUSANDS = re.compile(r"-?\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?:\.\d+)?")
_PERCENT_WORD = re.compile(r"(?P<number>-?\d[\d,]*(?:\.\d+)?)\s*(?:percent|per cent|pct)\.?", re.IGNORECASE)
_APPROX = re.compile(r"\\approx|≈|\\simeq")
_PLAIN_PI = re.compile(r"(?<![A-Za-z])(?:pi|π)(?![A-Za-z])")
_EQUALS = re.compile(r"(?<![<>!\\:])=(?!=)")
_KNOWN_UNIT = re.compile(rf"{UNIT_WORD}(?:/[A-Za-z]+)?\.?")


def _top_level_split(text: str, pattern: re.Pattern[str]) -> list[str]:
    """``text`` split at the matches of ``pattern`` that are outside braces and brackets."""
    parts, depth, start = [], 0, 0
    matches = {m.start(): m.end() for m in pattern.finditer(text)}
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "{([":
            depth += 1
        elif ch in "})]":
            depth -= 1
        elif depth == 0 and i in matches:
            parts.append(text[start:i])
            start = matches[i]
            i = start
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _plain_number_answer(text: str, units: bool = True) -> str | None:
    """``text`` as a plain number when it is one followed by a scale word, "percent" or (``units``) units.

    Letters right after the digits count as units only when they are one ("60mph", "5cm", "5m"): "2ab"
    is a product, not 2 with units.
    """
    percent = _PERCENT_WORD.fullmatch(text)
    if percent:
        return percent["number"].replace(",", "") + "\\%"
    if _SPACE_THOUSANDS.fullmatch(text):
        return re.sub(r"[ \u00a0\u202f]", "", text)
    match = _NUMBER_UNITS.fullmatch(text)
    if match is None:
        return None
    words = [w.rstrip(".").lower() for w in match["units"].split()]
    number = match["number"].replace("−", "-").lstrip("$€£¥")
    if "," in number:
        number = number.replace(",", "")
    if len(words) == 1 and words[0] in _SCALE_WORDS:
        try:
            return str(int(number) * _SCALE_WORDS[words[0]]) if number.lstrip("-").isdigit() else None
        except ValueError:
            return None
    if not units or any(w in _NOT_UNITS or w in _SCALE_WORDS for w in words):
        return None
    attached = match.end("number") == match.start("units")
    if attached and len(match["units"].split()[0]) > 1 and not _KNOWN_UNIT.fullmatch(match["units"].split()[0]):
        return None
    return number


def clean_answer(answer: str, units: bool = True) -> str:
    """An extracted answer as compared.

    Strips whitespace, math delimiters (``$..$``, ``\\(..\\)``, ``**..**``) and a final
    period; fixes spellings that mean the same (``\\sqrt[3]2``, a stray trailing backslash:
    trainer.reward.forms.fix_spelling); keeps what precedes "approximately"
    (``\\frac{\\sqrt3}{3} \\approx 0.577``) and what follows the last ``=`` of a chain
    (``x = 5 + 5 + 1 = 11``); reduces a plain number with a scale word or "percent" to the number
    (``1 million``, ``20 percent``) and drops space thousands separators (``1 000``). With ``units``
    (the leniency of that name), a unit after the answer goes too (``4 meters``, ``2\\pi cm``,
    ``4\\pi \\text{ cm}^2``).
    """
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
    text = fix_spelling(text)
    if _APPROX.search(text):
        before = _top_level_split(text, _APPROX)[0].strip()
        text = before or text
    if text.count("=") >= 2 and "," not in text and ";" not in text:
        parts = _top_level_split(text, _EQUALS)
        if len(parts) > 2 and parts[-1].strip():
            text = parts[-1].strip()
    plain = _plain_number_answer(text, units) if text[:1].isdigit() or text[:1] in "-−$€£¥" else None
    if plain is not None:
        return plain
    if units:
        bare = strip_units(text)
        if bare != text:
            return clean_answer(bare, units)  # "$5\sqrt{3}$ cm": the delimiters were not the whole text
    if "\\" not in text and ("pi" in text or "π" in text):
        text = _PLAIN_PI.sub(r"\\pi", text)  # "2 pi" in prose is 2 pi, not 2 * p * i
    return text


def _after_thinking(text: str) -> str:
    """The text after the last ``</think>`` when there is any: a reasoning model's scratch work
    ("the answer is 10? No...") is not its answer. All of it when nothing follows (truncated)."""
    end = text.rfind("</think>")
    if end < 0:
        return text
    after = text[end + len("</think>") :]
    return after if after.strip() else text


def extract_answer(
    text: str, strategies: Sequence[str] = DEFAULT_STRATEGIES, units: bool = True
) -> tuple[str | None, str | None]:
    """Extract the final answer from ``text``.

    Strips chat special tokens (:func:`strip_special_tokens`) and, after a ``</think>``,
    the reasoning before it; then tries each named
    strategy in order; the first one that finds something wins. Returns ``(answer,
    strategy_name)``, or ``(None, None)`` when nothing was found. The answer may be ``""``
    (e.g. an empty ``\\boxed{}``): callers treat that as "no answer" without falling back,
    because the model did mark an answer. ``units``: drop a unit after the answer (clean_answer).
    """
    text = _after_thinking(strip_special_tokens(text))
    for name in strategies:
        found = STRATEGIES[name](text)
        if found is not None:
            return clean_answer(found, units), name
    return None, None
