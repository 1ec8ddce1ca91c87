r"""A realistic *cold* mix of reward items: every item unique, real-looking responses.

Used by ``bench/reward_server.py --mix cold``. The shares follow what RL math datasets hold
(MATH-500 / DAPO / OpenR1-style labels: about three in ten answers are not plain numbers)
and what a policy mid-training writes:

* answers (label kinds): integer 55 %, fraction 12 %, decimal 5 %, then symbolic 28 %:
  radical 8 %, polynomial 5 %, multiple of pi 4 %, interval 4 %, tuple / set 3 %,
  vector 2 %, equation 2 %;
* responses: 3 to 12 reasoning steps with inline math (300 to 3000 characters), ending in
  ``\boxed{}`` (60 %), "The answer is ..." (10 %), ``#### ...`` (10 %), no marker (10 %),
  truncated mid-step (5 %) or an empty / broken box (5 %); most end with ``<|im_end|>``
  as OpenRLHF sends them (special tokens kept);
* verdicts: 45 % right (a third of those spelled differently from the label; ``--respelled``
  changes that share), 55 % wrong.

Every label and every answer is new (the index is part of each value), so no cache (the
service's result cache, math-verify's parse caches) can answer an item it saw before.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_SQUAREFREE = (2, 3, 5, 6, 7, 10, 11, 13, 14, 15, 17, 19, 21, 22, 23, 26, 29, 30)


@dataclass(frozen=True)
class Item:
    response: str
    label: str
    kind: str  # answer kind
    form: str  # how the response ends
    correct: bool  # by construction


def _answer(rng: random.Random, i: int) -> tuple[str, str, str, str]:
    """(kind, label, an equivalent spelling, a wrong answer) for item ``i`` (values grow with i)."""
    big = 1000 + i
    roll = rng.random()
    if roll < 0.55:
        n = 10 * big + rng.randint(0, 9)
        return "integer", str(n), f"{n:,}" if abs(n) >= 1000 else f"{n}.0", str(n + rng.choice((-1, 1, 10, -10, 2)))
    if roll < 0.67:
        den = rng.randint(2, 97)
        num = big * den + rng.randint(1, den - 1)
        return ("fraction", rf"\frac{{{num}}}{{{den}}}", f"{num}/{den}" if rng.random() < 0.5 else rf"\dfrac{{{num}}}{{{den}}}",
                rf"\frac{{{num + 1}}}{{{den}}}")  # fmt: skip
    if roll < 0.72:
        x = big + rng.randint(1, 99) / 100
        return "decimal", f"{x:.2f}", f"{x:.3f}", f"{x + 0.1:.2f}"
    if roll < 0.80:
        k, r = i + 2, rng.choice(_SQUAREFREE)
        return "radical", rf"{k}\sqrt{{{r}}}", rf"\sqrt{{{k * k * r}}}", rf"{k + 1}\sqrt{{{r}}}"
    if roll < 0.85:
        c = i + 2
        return "polynomial", f"x^2+{2 * c}x+{c * c}", f"(x+{c})^2", f"(x+{c + 1})^2"
    if roll < 0.89:
        k, m = 12 * i + 1, rng.randint(2, 12)
        return "pi", rf"\frac{{{k}\pi}}{{{m}}}", rf"\frac{{{k}}}{{{m}}}\pi", rf"\frac{{{k + 2}\pi}}{{{m}}}"
    if roll < 0.93:
        lo, hi = -rng.randint(0, 500), big
        return "interval", f"({lo}, {hi}]", f"({lo},{hi}]", f"[{lo}, {hi}]"
    if roll < 0.96:
        a, b = rng.randint(0, 99), big
        return "tuple", f"({a}, {b})", f"({a},{b})", f"({b}, {a})"
    if roll < 0.98:
        a, b = rng.randint(1, 99), -big
        vec = rf"\begin{{pmatrix}} {a} \\ {b} \end{{pmatrix}}"
        return "vector", vec, vec.replace("pmatrix", "bmatrix"), rf"\begin{{pmatrix}} {b} \\ {a} \end{{pmatrix}}"
    m, c = rng.randint(2, 40), big
    return "equation", f"y = {m}x + {c}", f"y = {c} + {m}x", f"y = {m}x - {c}"


def _step(rng: random.Random) -> str:
    a, b = rng.randint(2, 999), rng.randint(2, 99)
    return rng.choice(
        [
            f"Multiplying, $ {a} \\times {b} = {a * b} $, so the total is {a * b}.",
            f"Next we subtract: {a} - {b} = {a - b}, which we keep for later.",
            f"The ratio is $\\frac{{{a}}}{{{b}}}$, which does not simplify further here.",
            f"Let $x$ be the unknown; then $x + {b} = {a + b}$ gives $x = {a}$ in this step.",
            f"Checking the units again, {a} items at {b} each make {a * b} in all.",
            f"Squaring both sides, $(x - {b})^2 = {a}$ has to hold as well.",
        ]
    )


def make_items(n: int, seed: int = 0, respelled: float = 1 / 3) -> list[Item]:
    """``n`` unique items of the cold mix (deterministic for a seed).

    ``respelled``: share of the right answers written differently from the label.
    """
    rng = random.Random(seed)
    items = []
    for i in range(n):
        kind, label, equivalent, wrong = _answer(rng, i)
        correct = rng.random() < 0.45
        answer = (equivalent if rng.random() < respelled else label) if correct else wrong
        body = " ".join(_step(rng) for _ in range(rng.randint(3, 12)))
        end = "<|im_end|>" if rng.random() < 0.9 else ""
        roll = rng.random()
        if roll < 0.60:
            form, text = "boxed", f"{body}\nTherefore the answer is $\\boxed{{{answer}}}$.{end}"
        elif roll < 0.70:
            form, text = "answer_is", f"{body}\nThe answer is ${answer}$.{end}"
        elif roll < 0.80:
            form, text = "hash", f"{body}\n#### {answer}{end}"
        elif roll < 0.90:
            form, text = "no_marker", f"{body}\nSo we end up with ${answer}$.{end}"
        elif roll < 0.95:
            form, text, correct = "truncated", body[: rng.randint(len(body) // 2, len(body))], False
        else:
            form, text, correct = "broken_box", f"{body}\nTherefore $\\boxed{{}}$ {end}", False
        items.append(Item(text, label, kind, form, correct))
    return items


# ---------------------------------------------------------------- measuring a server on the mix


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used by process ``pid`` and all its descendants, reaped ones included (/proc)."""
    import os

    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        # utime + stime of the process, cutime + cstime of its children that it has reaped
        times[int(entry)] = sum(int(f) for f in fields[11:15]) / tick
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo += [child for child, parent in parents.items() if parent == current]
    return total


@dataclass
class ColdRun:
    items: int
    wall: float
    server_cpu: float
    latencies: list[float]
    rewards: list[float]
    cache_hits: int
    inline: int
    verified: int
    errors: list[str]


def run_cold(url: str, token: str, server_pid: int, items: list[Item], batch: int, clients: int) -> ColdRun:
    """Send every item once (``clients`` concurrent senders, ``batch`` items a request)."""
    import json
    import threading
    import time

    import requests

    health = f"{url}/health_check"
    before = requests.get(health, timeout=10).json()["pool"]
    chunks = [list(range(lo, min(lo + batch, len(items)))) for lo in range(0, len(items), batch)]
    rewards = [float("nan")] * len(items)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def sender() -> None:
        session = requests.Session()
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        while True:
            with lock:
                if not chunks:
                    return
                chunk = chunks.pop()
            body = {"query": [items[i].response for i in chunk], "labels": [items[i].label for i in chunk]}
            t0 = time.perf_counter()
            resp = session.post(f"{url}/get_reward", data=json.dumps(body), headers=headers, timeout=600)
            with lock:
                latencies.append(time.perf_counter() - t0)
                if resp.status_code != 200:
                    errors.append(f"{resp.status_code}: {resp.text[:200]}")
                    continue
                for i, reward in zip(chunk, resp.json()["rewards"], strict=True):
                    rewards[i] = reward

    cpu0, t0 = tree_cpu_seconds(server_pid), time.monotonic()
    threads = [threading.Thread(target=sender) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.monotonic() - t0, tree_cpu_seconds(server_pid) - cpu0
    after = requests.get(health, timeout=10).json()["pool"]
    return ColdRun(
        len(items), wall, cpu, latencies, rewards, after["cache_hits"] - before["cache_hits"],
        after["decided_inline"] - before["decided_inline"], after["verified"] - before["verified"], errors,
    )  # fmt: skip


def inline_math_verify(items: list[Item]) -> tuple[float, list[int]]:
    """CPU seconds math-verify needs in-line (this process) for ``items``, and its verdicts."""
    import logging
    import time

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    verdicts = []
    started = time.process_time()
    for item in items:
        try:
            gold = parse("$" + item.label + "$", parsing_timeout=None)
            verdicts.append(int(bool(verify(gold, parse(item.response, parsing_timeout=None), timeout_seconds=None))))
        except Exception:  # noqa: BLE001 - as in a reward loop: a crash is a 0
            verdicts.append(0)
    return time.process_time() - started, verdicts
