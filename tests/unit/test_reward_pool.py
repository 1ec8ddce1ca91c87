"""VerifyPool: per-item timeouts, worker replacement, no process leaks."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainer.procs import alive, stat_fields
from trainer.reward.math import Reason, verify_answer
from trainer.reward.pool import VerifyPool, VerifyPoolError

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 1.0
SLACK = 1.5  # scheduling, worker replacement, a loaded 2-core CI box


def _hang(k: int) -> tuple[str, str]:
    """A response sympy works on for minutes (factoring a ~10^4-digit radicand, holding the GIL).

    Unlike towers such as 9^{9^{9}}, which the digit guard rejects up front, these reach
    sympy. Each k gives a new string, so the pool's result cache cannot answer it.
    """
    return rf"\boxed{{\sqrt{{10^{{{9999 - k}}}+1}}}}", str(k)


# Not on the numeric fast path: each of these needs sympy in a worker.
GOOD = [
    (r"\boxed{\sqrt{2}}", r"\sqrt{2}", 1.0),
    (r"\boxed{2\pi}", r"2\pi", 1.0),
    (r"\boxed{x+1}", "1+x", 1.0),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"\boxed{3\sqrt{2}}", r"\sqrt{18}", 1.0),
    (r"\boxed{\pi^2}", r"\pi^{2}", 1.0),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{2}", 0.0),
    (r"\boxed{e}", r"\pi", 0.0),
]


def _children(pid: int) -> set[int]:
    """Live (non-zombie) child PIDs of ``pid``, from /proc."""
    kids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(int(entry))
        if fields is not None and int(fields[1]) == pid and fields[0] != "Z":
            kids.add(int(entry))
    return kids


def _wait_gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.fixture(scope="module")
def pool() -> Iterator[VerifyPool]:
    with VerifyPool(processes=2, timeout=TIMEOUT) as p:
        yield p


def _batch(bad: list[tuple[str, str]], copies: int = 2) -> tuple[list[str], list[str], list[float | None]]:
    items: list[tuple[str, str, float | None]] = [g for _ in range(copies) for g in GOOD]
    for i, (response, label) in enumerate(bad):
        items.insert(3 + 4 * i, (response, label, None))
    return [r for r, _, _ in items], [lbl for _, lbl, _ in items], [e for _, _, e in items]


def _check(results, expected) -> None:
    for result, want in zip(results, expected, strict=True):
        if want is None:
            assert (result.score, result.reason) == (0.0, Reason.TIMEOUT), result
        else:
            assert result.score == want, result
            assert result.reason in (Reason.CORRECT, Reason.WRONG), result


def test_pathological_item_is_really_slow_without_timeout() -> None:
    """The pathological input must not finish in 3x the pool timeout when run unguarded."""
    ctx = multiprocessing.get_context("spawn")  # leaves the pool's fork server alone
    proc = ctx.Process(target=verify_answer, args=(r"\sqrt{10^{9999}+1}", "0"), daemon=True)
    proc.start()
    try:
        proc.join(3 * TIMEOUT + 2)  # + imports in the fresh interpreter
        assert proc.is_alive(), "expected this verification to hang; pick a slower input"
    finally:
        proc.kill()
        proc.join()


def test_timeout_among_good_items(pool: VerifyPool) -> None:
    responses, labels, expected = _batch([_hang(0)])
    before = dict(pool.stats)
    started = time.monotonic()
    results = pool.score(responses, labels)
    elapsed = time.monotonic() - started
    _check(results, expected)
    assert results[3].extracted == r"\sqrt{10^{9999}+1}"
    assert pool.stats["timeouts"] == before["timeouts"] + 1
    # It used up its CPU budget; it was not cut short by the wall-clock backstop (which retries).
    assert pool.stats["starved_retries"] == before["starved_retries"]
    assert elapsed < pool.wall_timeout


def test_more_pathological_items_than_processes(pool: VerifyPool) -> None:
    """3 hangs on 2 processes run side by side, not one after another (demotion + spares)."""
    responses, labels, expected = _batch([_hang(1), _hang(2), _hang(3)])
    before = dict(pool.stats)
    results = pool.score(responses, labels)
    _check(results, expected)
    assert pool.stats["timeouts"] == before["timeouts"] + 3
    # Each hang's worker was demoted (its queue handed on, a spare started) long before its
    # budget was used up, so the three budgets were spent in parallel.
    assert pool.stats["demoted"] >= before["demoted"] + 3
    assert pool.stats["spawned"] >= before["spawned"] + 3


def test_pool_keeps_working_and_stays_bounded(pool: VerifyPool) -> None:
    before = pool.worker_pids()
    for round_ in range(3):
        bad = [_hang(10 + round_)]
        responses, labels, expected = _batch(bad, copies=1)
        _check(pool.score(responses, labels), expected)
    responses, labels, expected = _batch([])
    _check(pool.score(responses, labels), expected)
    time.sleep(0.3)
    pids = pool.worker_pids()
    assert 2 <= len(pids) <= pool.max_processes
    assert all(alive(p) for p in pids)
    killed = [p for p in before if p not in pids]
    assert killed, "timed-out workers should have been replaced"
    assert _wait_gone(killed, 5) == []
    parents = {int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) for p in pids}
    assert len(parents) == 1  # all forked by the fork server
    assert _children(parents.pop()) == set(pids)  # nothing else is left behind


def test_timeout_is_never_cached(pool: VerifyPool) -> None:
    """A timeout may be bad luck: the same item is verified again next time, not answered from the cache."""
    response, label = _hang(0)  # timed out in an earlier test
    before = pool.stats["timeouts"]
    results = pool.score([response], [label])
    assert results[0].reason == Reason.TIMEOUT
    assert pool.stats["timeouts"] == before + 1  # ran (and timed out) again
    assert pool.stats["cache_hits"] == 0 or pool._cache.get((results[0].extracted, label)) is None


def test_concurrent_callers(pool: VerifyPool) -> None:
    responses, labels, expected = _batch([], copies=3)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _check(pool.score(responses, labels), expected)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors


def test_dead_worker_is_replaced(pool: VerifyPool) -> None:
    victim = pool.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    fresh = [rf"\sqrt{{{n}}}" for n in range(101, 121)]  # not in the result cache
    results = pool.score([rf"\boxed{{{x}}}" for x in fresh], fresh)
    assert [r.reason for r in results] == [Reason.CORRECT] * len(fresh)
    deadline = time.monotonic() + 2
    while victim in pool.worker_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert victim not in pool.worker_pids()
    assert len(pool.worker_pids()) >= 2


def test_towers_are_rejected_without_waiting_for_the_timeout(pool: VerifyPool) -> None:
    towers = [
        r"\boxed{9^{9^{9^{9}}}}",
        r"\boxed{9^{9^{9}}}",
        r"\boxed{(10^{10})!}",
        r"\boxed{\binom{10^{12}}{10^{6}}}",
    ]
    started = time.monotonic()
    results = pool.score(towers, ["1"] * len(towers))
    assert [r.reason for r in results] == [Reason.TOO_COMPLEX] * len(towers)
    assert time.monotonic() - started < TIMEOUT / 2


def test_no_label_and_validation() -> None:
    with VerifyPool(processes=1, timeout=TIMEOUT) as p:
        results = p.score([r"\boxed{1}", r"\boxed{}"], [None, "1"])
        assert [r.reason for r in results] == [Reason.NO_LABEL, Reason.NO_ANSWER]
        with pytest.raises(ValueError, match="2 responses but 1 labels"):
            p.score(["a", "b"], ["1"])
    with pytest.raises(ValueError, match="timeout must be > 0"):
        VerifyPool(processes=1, timeout=0)


def test_close_kills_workers_even_mid_item() -> None:
    p = VerifyPool(processes=2, timeout=30)
    pids = p.worker_pids()
    response, label = _hang(20)
    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(p.score([response], [label]))
        except Exception as exc:  # noqa: BLE001 - what the caller got is the point
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    time.sleep(0.5)
    p.close()
    caller.join(5)
    assert not caller.is_alive(), "a caller waiting on a closed pool must return"
    # ... with an error, not a 0: the item never had a verdict (issue 31: no sample scored 0 for an outage)
    assert len(outcome) == 1 and isinstance(outcome[0], VerifyPoolError), outcome
    assert "it was closed" in str(outcome[0])
    assert _wait_gone(pids, 5) == []
    with pytest.raises(RuntimeError, match="closed"):
        p.verify([("1", "1")])
    p.close()  # idempotent


def test_workers_die_with_their_parent(tmp_path: Path) -> None:
    script = tmp_path / "owner.py"
    script.write_text(
        "import sys, threading, time\n"
        "from trainer.reward.pool import VerifyPool\n"
        "if __name__ == '__main__':\n"
        "    pool = VerifyPool(processes=2, timeout=60)\n"
        "    print(*pool.worker_pids(), flush=True)\n"
        "    threading.Thread(target=pool.score, args=([r'\\boxed{\\sqrt{10^{9999}+1}}'], ['1']), daemon=True).start()\n"
        "    time.sleep(60)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        pids = [int(x) for x in owner.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(pids) == 2
        time.sleep(1.0)  # one worker is now stuck in sympy, holding the GIL
    finally:
        owner.kill()
        owner.wait()
    # 15 s: the workers notice at once, but on a 2-core machine at a load of 20 (the test lanes and other work)
    # their exit can take several seconds to be scheduled; a worker that never exits still fails this
    assert _wait_gone(pids, 15) == [], "workers outlived the process that owned the pool"
