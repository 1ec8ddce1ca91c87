"""`ansible-playbook -i INVENTORY PLAYBOOK` for many inventories from one process: Ansible and rlrun are
imported once, then each run is a fork that calls what the `ansible-playbook` script calls
(ansible.cli.playbook.main) with its own inventory, its output in files of its own. The runs are the
script's, less its ~0.5 s of imports each (test_validate_inventory's 125 bad inventories).

    python -m tests.integration.playbook_forks PLAYBOOK OUT_DIR JOBS INVENTORY...

writes OUT_DIR/N.stdout, N.stderr and N.rc for the Nth inventory; at most JOBS runs at a time. Run it with
the environment ansible-playbook would get (ANSIBLE_CONFIG...: Ansible reads it when imported)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _run(playbook: str, inventory: str, out: Path) -> int:
    """In the forked child: the script's main() with stdout and stderr in files; its exit code."""
    from ansible.cli.playbook import main

    for fd, name in ((1, "stdout"), (2, "stderr")):
        f = os.open(out.with_suffix(f".{name}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    code = 1
    try:
        main(["ansible-playbook", "-i", inventory, playbook])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def main(argv: list[str]) -> int:
    playbook, out_dir, jobs, *inventories = argv
    out, jobs = Path(out_dir), int(jobs)
    import ansible.cli.playbook  # noqa: F401  (what every run imports: once, before the forks)
    import ansible.executor.playbook_executor  # noqa: F401

    import rlrun.validate  # noqa: F401  (the validate play's lookup)

    running: dict[int, int] = {}

    def reap() -> None:
        pid, status = os.wait()
        (out / f"{running.pop(pid)}.rc").write_text(str(os.waitstatus_to_exitcode(status)))

    for i, inventory in enumerate(inventories):
        while len(running) >= jobs:
            reap()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(_run(playbook, inventory, out / str(i)))
        running[pid] = i
    while running:
        reap()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
