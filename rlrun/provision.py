"""Run the project's playbooks through ansible-runner and report per host."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rlrun.errors import RlrunError
from rlrun.inventory import PROJECT_DIR

PLAYBOOKS = {
    "up": PROJECT_DIR / "site.yml",
    "down": PROJECT_DIR / "playbooks" / "teardown.yml",
    "status": PROJECT_DIR / "playbooks" / "status.yml",
    "preflight": PROJECT_DIR / "playbooks" / "preflight.yml",
}


@dataclass
class HostResult:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class RunResult:
    rc: int
    hosts: dict[str, HostResult]
    # What the playbook's debug tasks printed (e.g. the preflight's verdict).
    messages: list[str] = field(default_factory=list)
    # The run was stopped at its time limit (ansible-runner's timeout).
    timed_out: bool = False
    # Ansible's own error text when the run stopped before or outside any host's task (a play-level error:
    # a failed lookup, a syntax error, an undefined variable in a play keyword); '' otherwise.
    error: str = ""


def play_error(stdout: str) -> str:
    """The ``[ERROR]: ...`` block of Ansible's output (up to the next blank line), without the source excerpt
    and ANSI colours; '' when there is none."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", stdout)
    match = re.search(r"^\[?ERROR\]?!?:? ?(.*?)(?:\n\s*\n|\nOrigin:|\Z)", text, re.M | re.S)
    return match.group(1).strip() if match else ""


def run_playbook(name: str, inventory: Path, verbose: bool = False, extravars: dict | None = None,
                 progress=None, vault_password_file: str | None = None, timeout: float | None = None) -> RunResult:
    """Run playbook `name` (up | down | status | preflight) against `inventory`; stopped after `timeout` s."""
    import ansible_runner  # Ansible's import takes ~0.5 s: only the commands that run a playbook pay it

    playbook = PLAYBOOKS[name]
    if not inventory.exists():
        raise RlrunError(f"inventory {inventory} does not exist")
    private = Path(tempfile.mkdtemp(prefix="rlrun-runner-"))
    seen_tasks: set[str] = set()

    def on_event(event: dict) -> bool:
        data = event.get("event_data", {})
        if progress and event.get("event") == "playbook_on_task_start":
            task = data.get("task", "")
            if task and task not in seen_tasks:
                seen_tasks.add(task)
                progress(task)
        return True  # keep the event: stats and errors are read from it

    bin_dir = str(Path(sys.executable).parent)
    try:
        runner = ansible_runner.run(
            private_data_dir=str(private),
            project_dir=str(PROJECT_DIR),
            playbook=str(playbook),
            inventory=str(inventory.resolve()),
            extravars=extravars or {},
            envvars={"ANSIBLE_CONFIG": str(PROJECT_DIR / "ansible.cfg"),
                     "ANSIBLE_ROLES_PATH": str(PROJECT_DIR / "roles"),
                     "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
            cmdline=f"--vault-password-file {Path(vault_password_file).resolve()}" if vault_password_file else None,
            quiet=not verbose,
            event_handler=on_event,
            timeout=int(timeout) if timeout else None,
        )
        hosts: dict[str, HostResult] = {}
        stats = runner.stats or {}
        for key, attr in [("ok", "ok"), ("changed", "changed"), ("failures", "failed"),
                          ("dark", "unreachable"), ("skipped", "skipped")]:
            for host, count in (stats.get(key) or {}).items():
                setattr(hosts.setdefault(host, HostResult()), attr, count)
        messages = []
        for event in runner.events:
            data = event.get("event_data", {})
            if event.get("event") == "runner_on_ok" and data.get("task_action") in ("ansible.builtin.debug", "debug"):
                msg = data.get("res", {}).get("msg")
                if isinstance(msg, str):
                    messages.append(msg)
            if event.get("event") in ("runner_on_failed", "runner_on_unreachable"):
                data = event.get("event_data", {})
                if data.get("ignore_errors"):
                    continue
                res = data.get("res", {})
                msg = res.get("stderr") or res.get("msg") or "failed"
                if res.get("results"):  # a loop: the failed items' messages
                    msg = "; ".join(str(r.get("msg")) for r in res["results"] if r.get("failed")) or msg
                hosts.setdefault(data.get("host", "?"), HostResult()).errors.append(
                    f"{data.get('task', '?')}: {str(msg).strip()}")
        error = ""
        if runner.rc != 0 and not any(r.errors for r in hosts.values()):
            error = play_error(runner.stdout.read())
        return RunResult(rc=runner.rc, hosts=hosts, messages=messages, timed_out=runner.status == "timeout",
                         error=error)
    finally:
        shutil.rmtree(private, ignore_errors=True)
