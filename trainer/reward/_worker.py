"""Code that runs inside a VerifyPool worker process.

Light on purpose: the serving process imports it too (to name ``worker_main`` as the
process target). math-verify and sympy are loaded, and the LaTeX parser warmed, once
by the fork server through trainer.reward._warm, so replacing a killed worker costs
a fork, not a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
import time
from multiprocessing.connection import Connection

from trainer.procs import alive, exit_when_gone
from trainer.reward.math import MathRewardConfig, Reason, RewardResult, verify_answer

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent process exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def release_forkserver_alive_fd() -> None:
    """Close this worker's copy of the fork server's "alive" pipe.

    The fork server exits when every holder of that pipe is gone, and each forked
    child inherits one copy; a hung worker would thus keep the fork server alive
    after the pool's owner died, and PR_SET_PDEATHSIG (tied to the fork server)
    would never fire. Private API of multiprocessing.forkserver, hence the guards.
    """
    try:
        from multiprocessing import forkserver

        server = forkserver._forkserver
        fd = server._forkserver_alive_fd
        if fd is not None:
            os.close(fd)
            server._forkserver_alive_fd = None
    except (AttributeError, OSError):
        pass


def worker_main(
    conn: Connection, config: MathRewardConfig, owner_pid: int, memory_limit_mb: int | None
) -> None:
    """Serve verification chunks from ``conn`` until EOF or ``None``.

    Receives ``[(seq, answer, label), ...]`` and answers ``(seq, score, reason, cpu)``
    once per item, as soon as that item is done, where ``cpu`` is this process's CPU
    seconds so far: the parent budgets each item's CPU time from these readings.
    """
    die_with_parent()
    release_forkserver_alive_fd()
    if not alive(owner_pid):  # owner died before PDEATHSIG was armed
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    if memory_limit_mb:
        limit = memory_limit_mb * 1024 * 1024
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    exit_when_gone(owner_pid)  # the owner gone while this worker's parent (the fork server) lives on
    try:
        conn.send(("ready", time.process_time()))  # the pool times items from here on, not our imports
    except (EOFError, OSError):
        return
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for seq, answer, label in chunk:
            try:
                result = verify_answer(answer, label, config)
            except Exception:  # noqa: BLE001 - one bad item must not kill the worker
                result = RewardResult(0.0, Reason.ERROR, answer)
            try:
                conn.send((seq, result.score, result.reason, time.process_time()))
            except (EOFError, OSError):
                return
