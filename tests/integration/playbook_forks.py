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
    try:  # the script is `sys.exit(main())`; main() itself ends in sys.exit(exit_code)
        status = main(["ansible-playbook", "-i", inventory, playbook])
    except SystemExit as exc:
        status = exc.code
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    # what the interpreter makes of sys.exit(status): None is 0, a number itself, anything else 1
    return 0 if status is None else int(status) if isinstance(status, int) else 1


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
        if pid == 0:  # the child ends here whatever happens: never back in this loop, forking runs of its own
            code = 70
            try:
                code = _run(playbook, inventory, out / str(i))
            except BaseException:  # noqa: BLE001 - written where the test reads the run's stderr
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        running[pid] = i
    while running:
        reap()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
