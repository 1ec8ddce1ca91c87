"""Question-answering rewards: exact match and token F1 of the ``<answer>...</answer>`` against gold answers.

The normalisation is the one Search-R1 (and SQuAD / DPR / FlashRAG before it) compares answers with:
lower-case, drop ASCII punctuation, drop the articles a / an / the as words, collapse whitespace. A gold
label is one string or a list of acceptable strings; a prediction scores the best over them.

The prediction is the LAST ``<answer>...</answer>`` of the response (the prompt is not searched, so an
example answer in the prompt never scores); a response without one scores 0 (``n_no_answer``).
Retrieved ``<information>`` blocks and the other tools' result blocks (``<output>``, ``<result>``) are part of
a multi-turn response: an ``<answer>`` tag inside one is ignored, so a passage, or a program that prints
``<answer>...</answer>``, cannot answer for the policy.

Registered as ``--reward_fn exact_match`` and ``--reward_fn f1`` (:mod:`trainer.reward.local`).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

from trainer.reward.client import RewardBatch

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INFORMATION = re.compile(r"<(information|output|result)>.*?(</\1>|$)", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, no punctuation, no articles, single spaces (Search-R1's / SQuAD's normalisation)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_answer(response: str) -> str | None:
    """The text of the last ``<answer>...</answer>`` outside the tools' result blocks; None if there is none."""
    matches = _ANSWER.findall(_INFORMATION.sub(" ", response))
    return matches[-1].strip() if matches else None


def golds(label: Any) -> list[str]:
    """A label as its list of acceptable answers: a string, or a list / tuple of strings (numbers as text)."""
    if label is None:
        raise ValueError("a QA reward needs a gold answer for every prompt (--label_key); got none")
    if isinstance(label, str):
        return [label]
    if isinstance(label, int | float) and not isinstance(label, bool):
        return [str(label)]
    if isinstance(label, list | tuple) and label and all(isinstance(x, str | int | float) for x in label):
        return [str(x) for x in label]
    raise ValueError(f"gold answer {label!r}: expected a string or a non-empty list of strings")


def exact_match(prediction: str, gold: Any) -> float:
    """1.0 when the normalised prediction equals one normalised gold answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds(gold)))


def f1(prediction: str, gold: Any) -> float:
    """Token F1 between the normalised prediction and the best gold answer (SQuAD's: bags of words; yes /
    no / noanswer must match exactly)."""
    return max(_f1(normalize_answer(prediction), normalize_answer(g)) for g in golds(gold))


def _f1(pred: str, gold: str) -> float:
    special = ("yes", "no", "noanswer")
    if (pred in special or gold in special) and pred != gold:
        return 0.0
    p, g = pred.split(), gold.split()
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def _responses(queries: Sequence[str], prompts: Sequence[str] | None) -> list[str]:
    if prompts is None:
        return list(queries)
    return [q[len(p):] if q.startswith(p) else q for q, p in zip(queries, prompts, strict=True)]


class QaReward:
    """A local reward function (``queries, prompts, labels -> RewardBatch``) scoring with ``metric``;
    logs ``exact_match``, ``f1`` (means over the batch), ``accuracy`` (= exact match) and ``n_no_answer``."""

    def __init__(self, metric: str = "exact_match") -> None:
        if metric not in ("exact_match", "f1"):
            raise ValueError(f"unknown QA metric {metric!r}: expected exact_match or f1")
        self.metric = metric

    def __call__(self, queries: Sequence[str], prompts: Sequence[str] | None = None,
                 labels: Sequence[Any] | None = None) -> RewardBatch:
        if labels is None:
            raise ValueError(f"reward_fn {self.metric} needs gold answers (--label_key)")
        if len(labels) != len(queries):
            raise ValueError(f"{len(queries)} responses and {len(labels)} labels; expected one label each")
        ems, f1s, missing = [], [], 0
        for response, label in zip(_responses(queries, prompts), labels, strict=True):
            answer = extract_answer(response)
            if answer is None:
                golds(label)  # a missing gold is an error even where no answer was given
                missing += 1
                ems.append(0.0)
                f1s.append(0.0)
                continue
            ems.append(exact_match(answer, label))
            f1s.append(f1(answer, label))
        n = max(len(ems), 1)
        scores = ems if self.metric == "exact_match" else f1s
        return RewardBatch(list(scores), {"accuracy": sum(ems) / n, "exact_match": sum(ems) / n,
                                          "f1": sum(f1s) / n, "n_no_answer": float(missing)})

