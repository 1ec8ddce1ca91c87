"""Bookkeeping types of VerifyPool (one pool call, one item, one worker process, the result cache)."""

from __future__ import annotations

import multiprocessing
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from trainer.reward.math import RewardResult

__all__ = ["Job", "LruCache", "Task", "Worker"]


class Job:
    """One verify() call: results filled in by the dispatcher."""

    __slots__ = ("results", "remaining", "done", "failure")

    def __init__(self, size: int) -> None:
        self.results: list[RewardResult | None] = [None] * size
        self.remaining = size
        self.done = threading.Event()
        self.failure: str | None = None  # the pool failed before every item had a verdict: no result is made up
        if size == 0:
            self.done.set()

    def fail(self, why: str) -> None:
        """The pool cannot finish this job: its caller raises ``why`` instead of getting results."""
        if self.failure is None:
            self.failure = why
        self.done.set()

    def resolve(self, index: int, result: RewardResult) -> None:
        if self.results[index] is None:
            self.results[index] = result
            self.remaining -= 1
            if self.remaining == 0:
                self.done.set()


@dataclass(slots=True)
class Task:
    """One (answer, label) pair of a Job, on its way to or inside a worker."""

    seq: int
    job: Job
    index: int
    answer: str
    label: str
    attempts: int = 0  # worker crashes while this task was running
    starved: int = 0  # times it reached the wall-clock backstop without using its CPU budget


@dataclass(slots=True, eq=False)
class Worker:
    """A verifier process, its pipe, and the tasks it was sent but has not answered."""

    proc: multiprocessing.process.BaseProcess
    conn: Connection
    tasks: deque[Task] = field(default_factory=deque)  # tasks[0] is running
    started: float = 0.0  # wall clock (monotonic) when tasks[0] started, as seen by the parent
    cpu_start: float = 0.0  # the worker's CPU seconds when tasks[0] started
    cpu_seen: float = 0.0  # the worker's CPU seconds in its last message
    next_check: float = 0.0  # when the dispatcher looks at tasks[0]'s budgets next
    demoted: bool = False
    ready: bool = False  # imports done: item timing starts only then


class LruCache:
    """Thread-safe LRU of (answer, label) -> RewardResult."""

    def __init__(self, maxsize: int) -> None:
        self._data: OrderedDict[tuple[str, str], RewardResult] = OrderedDict()
        self._maxsize = maxsize
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> RewardResult | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: tuple[str, str], value: RewardResult) -> None:
        if self._maxsize <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            if len(self._data) > self._maxsize:
                self._data.popitem(last=False)
