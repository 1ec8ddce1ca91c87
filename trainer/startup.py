"""Where a job's start-up goes: each process of the job marks the moments of its own start (its process
began, its imports were done, its model was loaded, it was ready) as wall-clock times; the driver reads them
back once step 1 is done, prints them as seconds after its own process began, and logs them with step 1
(``startup/<who>/<mark>_s``). Step 1 of a 7B job took ~117 s, most of it before the engines' weights were
loaded (docs/benchmarks.md, seventh loan), and vLLM's log does not say which process waited for what.

A process's start is read from ``/proc/self/stat`` (its start in clock ticks after boot, against
``CLOCK_BOOTTIME`` now), so a Ray worker's time in Ray's hands before any of its Python ran is counted too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping


def process_start() -> float | None:
    """This process's start as a wall-clock time (seconds since the epoch); None where /proc has no answer."""
    try:
        stat = open("/proc/self/stat").read()  # noqa: SIM115 (one short read)
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, starttime: after the ")" it is the 20th
        since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - since_start


class Marks:
    """The moments of one process's start, by name, in the order they were made (``process`` first)."""

    def __init__(self) -> None:
        began = process_start()
        self.marks: dict[str, float] = {"process": began} if began is not None else {}

    def mark(self, name: str, at: float | None = None) -> None:
        """Mark ``name`` now, or at the wall-clock time ``at`` (a moment another process reported)."""
        self.marks[name] = time.time() if at is None else at

    def __contains__(self, name: str) -> bool:
        return name in self.marks

    def get(self) -> dict[str, float]:
        return dict(self.marks)


def latest(per_rank: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """One group's marks: each the latest of its ranks (the last rank to get there is the one waited for)."""
    out: dict[str, float] = {}
    for marks in per_rank:
        for name, t in marks.items():
            out[name] = max(out.get(name, t), t)
    return out


def render(rows: Mapping[str, Mapping[str, float]], origin: float) -> str:
    """``rows`` (who -> its marks) as seconds after ``origin``, one ``who: mark t, ...`` part per row, in
    order of each row's first mark; rows without marks are left out."""
    ordered = sorted(((who, marks) for who, marks in rows.items() if marks), key=lambda kv: min(kv[1].values()))
    return "; ".join(f"{who}: " + ", ".join(f"{name} {t - origin:.1f}" for name, t in marks.items())
                     for who, marks in ordered)


def report(rows: Mapping[str, Mapping[str, float]], origin: float) -> tuple[str, dict[str, float]]:
    """:func:`render`'s line to print, and the metrics (``startup/<who>/<mark>_s``; a ``who`` with spaces gets
    underscores), read back by :func:`from_metrics`."""
    metrics = {f"startup/{who.replace(' ', '_')}/{name}_s": t - origin
               for who, marks in rows.items() for name, t in marks.items()}
    return "start-up, seconds after the driver's process began: " + render(rows, origin), metrics


def from_metrics(row: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """The rows :func:`report`'s metrics came from (who with underscores), as seconds after the driver began."""
    rows: dict[str, dict[str, float]] = {}
    for key, value in row.items():
        if key.startswith("startup/") and key.endswith("_s") and key.count("/") == 2:
            _, who, mark = key.split("/")
            rows.setdefault(who, {})[mark[:-2]] = value
    return rows
