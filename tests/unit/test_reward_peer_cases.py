"""The service's verdicts on the peer-derived case set, against plain math-verify (issue 15).

The cases (tests/reward_peer_cases.py) come from other projects' grading tests and evaluation
code. The service's path is VerifyPool.score (what /get_reward runs). The baseline is plain
math-verify as its README shows it: ``verify(parse("$" + label + "$"), parse(response))`` on the
raw response, with math-verify's default extraction.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from collections.abc import Iterator

import pytest

from tests.reward_peer_cases import CASES, REQUIRED_CATEGORIES, SOURCES
from trainer.reward.pool import VerifyPool

PEER_AGREEMENT_TARGET = 0.97


def _math_verify_baseline(response: str, label: str) -> int:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        gold = parse(f"${label}$", parsing_timeout=None)
        return int(bool(verify(gold, parse(response, parsing_timeout=None), timeout_seconds=None)))
    except Exception:  # noqa: BLE001 - a crash of the baseline counts as a 0, as in a reward loop
        return 0


@pytest.fixture(scope="module")
def verdicts() -> Iterator[dict[str, tuple[int, int]]]:
    """case id -> (service verdict, math-verify verdict)."""
    with VerifyPool(processes=2, timeout=3.0) as pool:
        ours = pool.score([c.response for c in CASES], [c.label for c in CASES])
    yield {
        c.id: (int(r.score == 1.0), _math_verify_baseline(c.response, c.label))
        for c, r in zip(CASES, ours, strict=True)
    }


def test_the_case_set_is_what_the_issue_asks() -> None:
    assert len(CASES) >= 200
    assert len({c.id for c in CASES}) == len(CASES)
    repos = {SOURCES[c.source].repo for c in CASES}
    assert len(repos) >= 5, repos
    assert "huggingface/Math-Verify" not in repos
    for key, source in SOURCES.items():
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", source.repo), key
        assert re.fullmatch(r"[0-9a-f]{40}", source.commit), key
        assert source.path and not source.path.startswith("/"), key
    categories = defaultdict(Counter)
    for c in CASES:
        assert c.source in SOURCES, c.id
        assert c.expected in (0, 1), c.id
        categories[c.category][c.expected] += 1
    for name in REQUIRED_CATEGORIES:
        assert categories[name][1] and categories[name][0], f"{name} needs correct and wrong cases"
    assert sum(c.response.count("<|") + c.response.count("</s>") > 0 for c in CASES) >= 25  # end markers


def _table(verdicts: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int, int]]:
    """category -> (cases, service agreeing, math-verify agreeing); key "all" for the total."""
    table: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for c in CASES:
        ours, baseline = verdicts[c.id]
        for key in (c.category, "all"):
            table[key][0] += 1
            table[key][1] += ours == c.expected
            table[key][2] += baseline == c.expected
    return {k: (n, a, b) for k, (n, a, b) in table.items()}


def test_service_agrees_at_least_as_often_as_math_verify_in_every_category(verdicts) -> None:
    table = _table(verdicts)
    print("\ncategory        cases  service  math-verify")
    for name, (n, ours, baseline) in sorted(table.items(), key=lambda kv: kv[0] == "all"):
        print(f"{name:15s} {n:5d}  {ours / n:7.1%}  {baseline / n:11.1%}")
    behind = {k: v for k, v in table.items() if v[1] < v[2]}
    assert not behind, f"categories where plain math-verify agrees more often: {behind}"


def test_service_agrees_with_the_peers_where_they_agree(verdicts) -> None:
    settled = [c for c in CASES if c.contested is None]
    wrong = [(c.id, c.label, c.response[-80:]) for c in settled if verdicts[c.id][0] != c.expected]
    agreement = 1 - len(wrong) / len(settled)
    print(f"\nservice agreement on {len(settled)} uncontested cases: {agreement:.1%}")
    assert agreement >= PEER_AGREEMENT_TARGET, wrong
