"""trainer/procs.py: the one answer to "does process PID still run" (the Slurm job's wait, the labs, the benchmarks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from trainer import procs
from trainer.procs import alive, stat_field


def _zombie() -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while (procs.stat_fields(child.pid) or ["?"])[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.02)
    return child


def test_a_running_process_is_alive_an_exited_one_is_not():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert alive(child.pid) and alive(os.getpid())
        assert stat_field(child.pid, 4) == os.getpid()  # its parent
    finally:
        child.kill()
        child.wait()
    assert not alive(child.pid)


def test_a_zombie_is_not_alive():
    child = _zombie()
    try:
        assert procs.stat_fields(child.pid)[0] == "Z" and not alive(child.pid)
    finally:
        child.wait()


def test_where_proc_cannot_be_read_a_process_signal_0_finds_is_alive(monkeypatch):
    """No /proc (or hidepid): the process exists, only whether it is a zombie is unknown; calling it gone would fail
    a Slurm job whose node step still starts, or remove a lab under the test that holds it."""
    monkeypatch.setattr(procs, "stat_fields", lambda pid: None)
    assert alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: signal 0 finds nothing, /proc or not
    assert not alive(child.pid)


def test_a_process_reaped_between_the_signal_and_the_read_is_gone(monkeypatch):
    child = _zombie()  # signal 0 still finds it
    monkeypatch.setattr(procs, "stat_fields", lambda pid: (child.wait(), None)[1])  # reaped while /proc is read
    assert not alive(child.pid)
