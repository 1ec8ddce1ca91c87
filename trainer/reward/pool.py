r"""A process pool that verifies answers with a hard per-item CPU-time budget.

sympy can run for minutes on hostile answers (exact arithmetic on huge integers:
``9^{9^{9}}``, ``\sqrt{10^{9999}+1}``), in code that holds the GIL and ignores
signals. The digit guard (trainer.reward.guard) rejects the tower/factorial kind up
front; everything else is bounded here: verification runs in worker processes that
the pool kills when an item has used ``timeout`` seconds of *CPU time*: the item
scores 0 with reason "timeout", the worker is replaced, and its queued items go to
other workers.

CPU time, not wall time: on a busy machine an item waits for a CPU without using
its budget, so load cannot turn a correct answer into a timeout. The parent reads a
busy worker's CPU time from /proc (the worker reports its own after each item); a
wall-clock backstop (``wall_timeout``) still bounds an item that never gets a CPU:
it is retried once in a fresh worker before it scores "timeout". Timeouts are never
cached (a later, quieter attempt may succeed). Without /proc (not Linux) the budget
falls back to wall time.

Design, in one thread per pool (the dispatcher):

* workers get small chunks and answer each item as soon as it is done, so the
  pool knows when every item started and can time it individually;
* a worker busy on one item for ``demote_after`` CPU seconds is *demoted*: its
  queued items are handed back, a replacement is started (up to ``max_processes``
  workers in all), and it is retired once its item finishes or times out. So a
  batch with a few pathological items costs about ``timeout`` CPU seconds each, in
  parallel, not one after the other, as long as stuck items do not fill all
  ``max_processes`` slots (then new ones queue for a free slot). A demoted worker
  keeps its priority: its CPU use is bounded by the budget, and a lower priority
  would only stretch the batch's wall time on a busy machine;
* workers come from the ``forkserver`` start method with math-verify preloaded, so
  a replacement costs a fork, not an interpreter start; they die with their parent
  (PR_SET_PDEATHSIG plus an owner watchdog) and on :meth:`VerifyPool.close`.

Answers are extracted, fast-pathed and looked up in a result cache in the calling
thread; only what needs sympy crosses to a worker.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import math
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait

from trainer.procs import stat_fields
from trainer.reward._pool_state import Job, LruCache, Task, Worker
from trainer.reward.extract import extract_answer
from trainer.reward.math import (
    MathRewardConfig,
    Reason,
    RewardResult,
    normalize_answer,
    normalize_label,
    quick_check,
)

__all__ = ["VerifyPool", "VerifyPoolError", "default_processes"]


class VerifyPoolError(RuntimeError):
    """The pool itself failed (its dispatcher died, or it was closed) before an item had its verdict. Raised,
    never scored: a broken pool is not a wrong answer."""

log = logging.getLogger(__name__)

# Deterministic verdicts only: a timeout or an error may not repeat.
_CACHEABLE = frozenset({Reason.CORRECT, Reason.WRONG, Reason.PARSE_ERROR, Reason.BAD_LABEL, Reason.TOO_COMPLEX})
_PRELOAD = ["trainer.reward._worker", "trainer.reward._warm"]  # imported once, in the fork server
_READY = "ready"  # first message of a worker, once its imports are done
_START_TIMEOUT = 120.0  # seconds for the first workers to import sympy & co.
_MIN_POLL = 0.005  # seconds between two looks at a busy worker's CPU time, at least
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc), None when unknown."""
    fields = stat_fields(pid)
    try:
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK if fields is not None else None  # utime + stime
    except (IndexError, ValueError):
        return None


def default_processes() -> int:
    """CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _forkserver_lacks_preload() -> bool:
    """Whether this process's fork server already runs without our preload (it is then fixed)."""
    try:
        from multiprocessing import forkserver

        server = forkserver._forkserver
        return server._forkserver_pid is not None and not set(_PRELOAD) <= set(server._preload_modules)
    except (AttributeError, TypeError):
        return False


class VerifyPool:
    """Verify (response, label) pairs in worker processes, each item bounded by ``timeout``.

    Thread-safe: many threads may call :meth:`score` / :meth:`verify` at once.
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        processes: int | None = None,
        timeout: float = 3.0,
        config: MathRewardConfig | None = None,
        *,
        max_processes: int | None = None,
        demote_after: float | None = None,
        chunk_size: int = 4,
        memory_limit_mb: int | None = 1024,
        cache_size: int = 65536,
        wall_timeout: float | None = None,
    ) -> None:
        """Start ``processes`` workers (default: CPUs available).

        timeout: CPU seconds one item may use; wall_timeout: wall-clock seconds after which an
        item that did not get its CPU time is retried once in a fresh worker, then scores
        "timeout" (default 10 * timeout + 30); demote_after: CPU seconds before a busy worker
        is demoted (default min(0.15, timeout / 4); 0 or less disables demotion; a demotion costs
        one fork, so it can be eager);
        max_processes: cap on workers including demoted ones (default 4 * processes + 4; a stuck
        worker costs ~15 MB of private memory and at most ``timeout`` CPU seconds);
        memory_limit_mb: address-space limit per worker (None: unlimited).
        """
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.size = processes if processes is not None else default_processes()
        if self.size < 1:
            raise ValueError(f"processes must be >= 1, got {self.size}")
        self.timeout = float(timeout)
        self.wall_timeout = float(wall_timeout) if wall_timeout is not None else 10 * self.timeout + 30
        if self.wall_timeout < self.timeout:
            raise ValueError(f"wall_timeout ({wall_timeout}) must be >= timeout ({timeout})")
        self.config = config or MathRewardConfig()
        self.max_processes = max(self.size, max_processes or 4 * self.size + 4)
        self.demote_after = min(0.15, self.timeout / 4) if demote_after is None else demote_after
        self._chunk_size = max(1, chunk_size)
        self._memory_limit_mb = memory_limit_mb
        self._cache = LruCache(cache_size)
        self._ctx = multiprocessing.get_context("forkserver")
        if _forkserver_lacks_preload():
            log.warning(
                "the multiprocessing fork server was started before this VerifyPool: its workers will "
                "import math-verify themselves, so replacing a killed worker takes seconds, not milliseconds"
            )
        self._ctx.set_forkserver_preload(_PRELOAD)
        self._lock = threading.RLock()  # _assign() may _retire() while holding it
        self._pending: deque[Task] = deque()
        self._seq = itertools.count()
        self._closing = False
        self.failure: str | None = None  # why the dispatcher stopped serving (None while it works)
        self._workers: list[Worker] = []
        self.stats = {
            "items": 0,  # score() items
            "decided_inline": 0,  # no answer / fast path, without a worker
            "cache_hits": 0,
            "verified": 0,  # answered by a worker (or timed out there)
            "timeouts": 0,
            "starved_retries": 0,  # items retried after the wall-clock backstop, budget unused
            "crashes": 0,
            "spawned": 0,
            "demoted": 0,
        }
        self._stats_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        try:
            for _ in range(self.size):
                self._workers.append(self._spawn())
            self._await_ready(time.monotonic() + _START_TIMEOUT)
        except BaseException:
            self._kill_all()
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            raise
        self._thread = threading.Thread(target=self._run, name="verify-pool", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # ------------------------------------------------------------ public API

    def score(self, responses: Sequence[str], labels: Sequence[str | None]) -> list[RewardResult]:
        """Extract answers from ``responses`` and verify them against ``labels``.

        A ``None`` label scores 0 with reason "no_label".
        """
        if len(responses) != len(labels):
            raise ValueError(f"{len(responses)} responses but {len(labels)} labels; expected equal lengths")
        results: list[RewardResult | None] = [None] * len(responses)
        paths: list[str | None] = [None] * len(responses)
        todo: dict[tuple[str, str], list[int]] = {}
        inline = hits = 0
        for i, (response, label) in enumerate(zip(responses, labels, strict=True)):
            if label is None:
                results[i] = RewardResult(0.0, Reason.NO_LABEL, None)
                continue
            answer, paths[i] = extract_answer(response, self.config.strategies, units="units" in self.config.lenient)
            answer = None if answer is None else normalize_answer(answer, self.config, cleaned=True)
            norm_label = normalize_label(label, self.config)
            quick = quick_check(answer, norm_label, self.config)
            if quick is not None:
                results[i] = quick.on_path(paths[i])
                inline += 1
                continue
            assert answer is not None
            key = (answer, norm_label)
            cached = self._cache.get(key)
            if cached is not None:
                results[i] = cached.on_path(paths[i])
                hits += 1
            else:
                todo.setdefault(key, []).append(i)  # identical samples are verified once
        with self._stats_lock:
            self.stats["items"] += len(responses)
            self.stats["decided_inline"] += inline
            self.stats["cache_hits"] += hits
        if todo:
            keys = list(todo)
            for key, result in zip(keys, self.verify(keys), strict=True):
                for i in todo[key]:
                    results[i] = result.on_path(paths[i])
        return results  # type: ignore[return-value]  # every slot is filled above

    def verify(self, pairs: Sequence[tuple[str, str]]) -> list[RewardResult]:
        """Verify extracted ``(answer, label)`` pairs in the workers (no fast path, no cache)."""
        job = Job(len(pairs))
        tasks = [Task(next(self._seq), job, i, a, lbl) for i, (a, lbl) in enumerate(pairs)]
        with self._lock:
            if self._closing:
                raise VerifyPoolError(f"VerifyPool is closed ({self.failure or 'close() was called'})")
            self._pending.extend(tasks)
        self._wake()
        while not job.done.wait(1.0):
            if not self._thread.is_alive():  # dispatcher died: never leave callers hanging
                job.fail(self.failure or "the verify pool's dispatcher is gone")
        if job.failure is not None:
            raise VerifyPoolError(f"verify pool failed before {job.remaining} of {len(pairs)} items had a verdict: "
                                  f"{job.failure}")
        return job.results  # type: ignore[return-value]  # all resolved

    def worker_pids(self) -> list[int]:
        """PIDs of the current worker processes (demoted ones included)."""
        pids = []
        for worker in list(self._workers):
            with contextlib.suppress(ValueError):  # retired (closed) meanwhile by the dispatcher
                if worker.proc.pid is not None:
                    pids.append(worker.proc.pid)
        return pids

    def info(self) -> dict[str, int | float]:
        """Counters and sizes, for health checks and logs."""
        workers = list(self._workers)
        alive = 0
        for worker in workers:
            with contextlib.suppress(ValueError):  # retired (closed) meanwhile by the dispatcher
                alive += worker.proc.is_alive()
        return {
            "processes": self.size,
            "max_processes": self.max_processes,
            "alive": alive,
            "busy": sum(bool(w.tasks) for w in workers),
            "queued": len(self._pending),
            "timeout_cpu_s": self.timeout,
            "wall_timeout_s": self.wall_timeout,
            **self.stats,
        }

    def close(self) -> None:
        """Kill all workers; callers still waiting raise :class:`VerifyPoolError` (no item is scored by a
        closing pool). Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        self._kill_all()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        atexit.unregister(self.close)

    def __enter__(self) -> VerifyPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ dispatcher

    def _wake(self) -> None:
        # BlockingIOError: the pipe is full, so a wake-up is pending anyway; OSError: closed.
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _spawn(self) -> Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        from trainer.reward._worker import worker_main

        proc = self._ctx.Process(
            target=worker_main,
            args=(child_conn, self.config, os.getpid(), self._memory_limit_mb),
            name="verify-worker",
            daemon=True,
        )
        proc.start()
        child_conn.close()
        self.stats["spawned"] += 1
        return Worker(proc, parent_conn)

    def _await_ready(self, deadline: float) -> None:
        """Block until the initial workers have imported everything (before the dispatcher runs)."""
        for worker in self._workers:
            left = deadline - time.monotonic()
            if left <= 0 or not worker.conn.poll(left):
                raise RuntimeError(f"verify worker did not start within {_START_TIMEOUT:.0f}s")
            try:
                message = worker.conn.recv()
            except EOFError:
                raise RuntimeError(
                    "verify worker died while starting (its traceback is on stderr); note that "
                    "multiprocessing needs an importable __main__ (a file or -m module, not stdin)"
                ) from None
            if not (isinstance(message, tuple) and message[0] == _READY):
                raise RuntimeError(f"verify worker sent {message!r} first; expected {_READY!r}")
            worker.ready = True
            worker.cpu_seen = message[1]

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closing:
                        break
                    self._assign()
                workers = list(self._workers)  # idle ones too: notice a dead worker at once
                busy = [w for w in workers if w.tasks]
                ready = wait([w.conn for w in workers] + [self._wake_r], self._next_wakeup(busy))
                if self._wake_r in ready:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except (BlockingIOError, OSError):
                        pass
                by_conn = {w.conn: w for w in workers}
                for conn in ready:
                    if conn in by_conn:
                        self._receive(by_conn[conn])
                self._check_deadlines()
                self._ensure_capacity()
        except Exception as exc:
            log.exception("verify pool dispatcher crashed; failing pending items")
            self.failure = f"its dispatcher crashed: {type(exc).__name__}: {exc}"
        finally:
            self._fail_everything()

    def _assign(self) -> None:
        """Hand pending tasks to idle healthy workers (called with the lock held)."""
        idle = [w for w in self._workers if w.ready and not w.tasks and not w.demoted]
        while self._pending and idle:
            size = min(self._chunk_size, max(1, math.ceil(len(self._pending) / len(idle))))
            worker = idle.pop()
            chunk = [self._pending.popleft() for _ in range(min(size, len(self._pending)))]
            try:
                worker.conn.send([(t.seq, t.answer, t.label) for t in chunk])
            except (OSError, ValueError):
                self._pending.extendleft(reversed(chunk))
                self.stats["crashes"] += 1
                self._retire(worker)
                continue
            worker.tasks.extend(chunk)
            self._start_item(worker, time.monotonic(), worker.cpu_seen)

    def _next_wakeup(self, busy: list[Worker]) -> float | None:
        if not busy:
            return None
        return max(0.0, min(w.next_check for w in busy) - time.monotonic())

    def _start_item(self, worker: Worker, now: float, cpu: float) -> None:
        """tasks[0] of ``worker`` starts now; first look at it when it could reach a budget.

        One process uses CPU time no faster than wall time, so no budget can be reached
        before that many wall seconds have passed.
        """
        worker.started = now
        worker.cpu_start = cpu
        first = self.timeout if self.demote_after <= 0 or worker.demoted else min(self.demote_after, self.timeout)
        worker.next_check = now + first

    def _receive(self, worker: Worker) -> None:
        try:
            while worker.conn.poll():  # also true at EOF, where recv() raises
                message = worker.conn.recv()
                if message[0] == _READY:
                    worker.ready = True
                    worker.cpu_seen = message[1]
                    continue
                if not worker.tasks:  # cannot happen: answers come only for tasks sent
                    log.error("verify worker %s answered with nothing pending", worker.proc.pid)
                    continue
                seq, score, reason, cpu = message
                task = worker.tasks.popleft()
                if task.seq != seq:  # cannot happen with FIFO pipes; be loud if it does
                    raise RuntimeError(f"worker answered item {seq}, expected {task.seq}")
                self._finish(task, RewardResult(score, reason, task.answer))
                worker.cpu_seen = cpu
                self._start_item(worker, time.monotonic(), cpu)
                if worker.demoted:
                    self._retire(worker)
                    return
        except (EOFError, OSError):
            self.stats["crashes"] += 1
            if worker.tasks:
                task = worker.tasks[0]
                task.attempts += 1
                if task.attempts >= 2:  # crashed twice on it: blame the item, not bad luck
                    worker.tasks.popleft()
                    self._finish(task, RewardResult(0.0, Reason.ERROR, task.answer))
            self._retire(worker)  # requeues what is left

    def _finish(self, task: Task, result: RewardResult) -> None:
        self.stats["verified"] += 1
        if result.reason in _CACHEABLE:
            self._cache.put((task.answer, task.label), result)
        task.job.resolve(task.index, result)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for worker in [w for w in self._workers if w.tasks and w.next_check <= now]:
            wall = now - worker.started
            cpu_now = cpu_seconds(worker.proc.pid) if worker.proc.pid is not None else None
            used = wall if cpu_now is None else max(0.0, cpu_now - worker.cpu_start)
            if used >= self.timeout:
                self.stats["timeouts"] += 1
                task = worker.tasks.popleft()
                self._finish(task, RewardResult(0.0, Reason.TIMEOUT, task.answer))
                self._retire(worker)
                continue
            if wall >= self.wall_timeout:  # the item never got its CPU time: the machine is starved
                task = worker.tasks.popleft()
                if task.starved == 0:
                    task.starved += 1
                    self.stats["starved_retries"] += 1
                    log.warning("verify item got %.2fs of CPU in %.0fs; retrying it in a fresh worker", used, wall)
                    with self._lock:
                        self._pending.appendleft(task)
                else:
                    self.stats["timeouts"] += 1
                    self._finish(task, RewardResult(0.0, Reason.TIMEOUT, task.answer))
                self._retire(worker)
                continue
            if self.demote_after > 0 and not worker.demoted and used >= self.demote_after:
                worker.demoted = True
                self.stats["demoted"] += 1
                self._requeue_queued(worker)
            budgets = [self.timeout - used]
            if self.demote_after > 0 and not worker.demoted:
                budgets.append(self.demote_after - used)
            worker.next_check = min(now + max(_MIN_POLL, min(budgets)), worker.started + self.wall_timeout)

    def _requeue_queued(self, worker: Worker) -> None:
        """Give a worker's not-yet-started tasks back to the queue (front)."""
        rest = list(worker.tasks)[1:]
        if rest:
            for _ in rest:
                worker.tasks.pop()
            with self._lock:
                self._pending.extendleft(reversed(rest))

    def _retire(self, worker: Worker) -> None:
        """Kill ``worker`` and requeue its unfinished tasks (the running one was resolved)."""
        if worker.tasks:
            with self._lock:
                self._pending.extendleft(reversed(worker.tasks))
            worker.tasks.clear()
        if worker in self._workers:
            self._workers.remove(worker)
        self._stop(worker)

    def _ensure_capacity(self) -> None:
        with self._lock:
            if self._closing:
                return
        healthy = sum(not w.demoted for w in self._workers)
        while healthy < self.size and len(self._workers) < self.max_processes:
            self._workers.append(self._spawn())
            healthy += 1

    @staticmethod
    def _stop(worker: Worker) -> None:
        with contextlib.suppress(OSError, ValueError):
            worker.proc.kill()
        worker.proc.join(timeout=5)
        worker.conn.close()
        with contextlib.suppress(ValueError):
            worker.proc.close()

    def _kill_all(self) -> None:
        workers, self._workers = list(self._workers), []
        for worker in workers:
            self._stop(worker)

    def _fail_everything(self) -> None:
        """The dispatcher ends (closed, or crashed): every job still waiting fails (its caller raises); none of
        its items is given a verdict."""
        with self._lock:
            self._closing = True
            pending = list(self._pending)
            self._pending.clear()
        for worker in self._workers:
            pending.extend(worker.tasks)
            worker.tasks.clear()
        why = self.failure or "it was closed"
        for task in pending:
            task.job.fail(why)
        self._kill_all()
