"""Processes by PID: whether one still runs, the fields of its /proc/PID/stat, and ending with another.

One answer for every caller (the reward pool's CPU clock, trainer/reward/pool.py; the Slurm job's wait for its
node steps, rlrun/slurm/runtime.py; the test labs' holders and leftovers, tests/lab/; the benchmarks). Standard
library only.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name, the state first (proc(5) field 3 onwards); None where
    the file cannot be read (no such process, or no /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None


def stat_field(pid: int, field: int) -> int | None:
    """Field ``field`` of /proc/PID/stat, numbered as proc(5) numbers them (4 and up: the parent is 4, the start
    time 22), or None."""
    fields = stat_fields(pid)
    try:
        return int(fields[field - 3]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie.

    Where /proc/PID/stat cannot be read for a process that signal 0 found, the answer is True: the process
    exists, and only its zombie state is unknown (no /proc, or one mounted with hidepid). A wrong "gone" is the
    worse mistake for every caller: it fails a Slurm job whose node step still starts, or removes a lab under
    the test that still holds it; a wrong "running" costs one more poll or a wait until a deadline that names
    the PID. A process reaped between the two looks is asked again, and is gone.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    fields = stat_fields(pid)
    if fields is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return fields[0] != "Z"


def exit_when_gone(pid: int, interval: float = 1.0) -> None:
    """End this process (``os._exit(0)``, no clean-up) once process ``pid`` no longer runs (:func:`alive`),
    checked every ``interval`` seconds from a daemon thread: a helper process that must not outlive the one it
    works for (the reward pool's workers, their pool's owner; a GPU engine's kernel prewarm, the engine), where
    a signal from the kernel on its parent's death (PR_SET_PDEATHSIG) is not enough or not to be relied on."""
    def watch() -> None:
        while alive(pid):
            time.sleep(interval)
        os._exit(0)

    threading.Thread(target=watch, name=f"exit-when-{pid}-gone", daemon=True).start()
