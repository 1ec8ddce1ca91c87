"""A stop ends the service's processes together (roles/node_service, start-stop-daemon), as systemd's
KillMode=control-group does: SIGTERM to the supervisor and to every process of its session at once, then a wait
for exactly those processes (polled), SIGKILL for what outlives node_service__stop_timeout. Before, the processes
left in the session got their SIGTERM only once the command's own shutdown had ended (a Ray node's ended its
children one after another), and each round of the cleanup slept a fixed second."""

from __future__ import annotations

import os
import sys
import time

import pytest
import yaml

from tests.conftest import BIN, playbook

pytestmark = pytest.mark.integration

# The service: a command that takes SLOW s to shut down on SIGTERM, a child that exits on SIGTERM, and a child
# that ignores it. Each records its PID, and the moment SIGTERM reached it.
SERVICE = r'''
import os, signal, subprocess, sys, time
log = sys.argv[1]
def note(what):
    with open(log, "a") as fh:
        fh.write(f"{what} {os.getpid()} {time.time():.3f}\n")
if sys.argv[2:] == ["child"]:
    signal.signal(signal.SIGTERM, lambda *_: (note("child-term"), sys.exit(0)))
elif sys.argv[2:] == ["stubborn"]:
    signal.signal(signal.SIGTERM, lambda *_: note("stubborn-term"))
else:
    kids = [subprocess.Popen([sys.executable, __file__, log, k]) for k in ("child", "stubborn")]
    def on_term(*_):
        note("command-term")
        time.sleep(SLOW)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
note("started")
while True:
    time.sleep(1)
'''
SLOW = 3.0
STOP_TIMEOUT = 2


def _play(tmp_path, teardown: bool) -> dict:
    return {"name": "service", "hosts": "localhost", "gather_facts": True, "gather_subset": ["min"],
            "tasks": [{"ansible.builtin.include_role": {"name": "node_service"}, "vars": {
                "node_service__name": "rlrun-t-stop", "node_service__manager": "start-stop-daemon",
                "node_service__command": [sys.executable, str(tmp_path / "service.py"), str(tmp_path / "log")],
                "node_service__workdir": str(tmp_path), "node_service__run_dir": str(tmp_path / "run"),
                "node_service__stop_timeout": STOP_TIMEOUT, "node_service__teardown": teardown}}]}


def _events(tmp_path) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for line in (tmp_path / "log").read_text().splitlines():
        what, pid, at = line.split()
        out.setdefault(what, []).append((int(pid), float(at)))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_stop_ends_every_process_of_the_service_together(tmp_path):
    (tmp_path / "service.py").write_text(SERVICE.replace("SLOW", repr(SLOW)))
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": str(BIN / "python")}}}}))
    (tmp_path / "up.yml").write_text(yaml.safe_dump([_play(tmp_path, False)]))
    (tmp_path / "down.yml").write_text(yaml.safe_dump([_play(tmp_path, True)]))
    pids: list[int] = []
    try:
        up = playbook(inv, str(tmp_path / "up.yml"), timeout=300)
        assert up.returncode == 0, (up.stdout + up.stderr)[-3000:]
        deadline = time.monotonic() + 60
        while len(_events(tmp_path).get("started", []) if (tmp_path / "log").exists() else []) < 3:
            assert time.monotonic() < deadline, "the service's three processes did not start"
            time.sleep(0.2)
        pids = [pid for pid, _ in _events(tmp_path)["started"]]
        start = time.time()
        down = playbook(inv, str(tmp_path / "down.yml"), timeout=300)
        assert down.returncode == 0, (down.stdout + down.stderr)[-3000:]
        took = time.time() - start
        events = _events(tmp_path)
        (_, command_term), (_, child_term) = events["command-term"][0], events["child-term"][0]
        # Together: the child's SIGTERM did not wait for the command's SLOW s shutdown.
        assert abs(child_term - command_term) < SLOW / 2, events
        # The stubborn child got its SIGTERM too, outlived the grace and was killed; nothing of the service is left.
        assert "stubborn-term" in events, events
        assert [p for p in pids if _alive(p)] == []
        assert took >= STOP_TIMEOUT, took  # the grace was waited for, not cut short
        assert not os.path.exists(tmp_path / "run" / "rlrun-t-stop.pid")
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, 9)
