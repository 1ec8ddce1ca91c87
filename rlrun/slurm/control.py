"""sbatch / squeue / scontrol / scancel for `rlrun slurm submit|status|logs|cancel`.

A job's files live in its job root (shared by the nodes and the submit host):
``<id>.out`` (Slurm's output of the whole job: batch step and every node's step)
and ``<id>.json`` (the record the sbatch script keeps: state, head, dashboard,
port block, inventory, exit). Slurm's own view comes from ``squeue`` while the
job runs and ``scontrol show job`` after (as long as the controller keeps it,
MinJobAge).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rlrun.errors import RlrunError

JOB_ID_RE = re.compile(r"^\d+$")
# Slurm's states of a job that has ended.
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE"}


def _slurm(argv: list[str], what: str, timeout: float = 60) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise RlrunError(f"`{argv[0]}` not found: `rlrun slurm {what}` runs on a host with Slurm's client "
                         "commands (sbatch, squeue, scontrol, scancel) on PATH")
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RlrunError(f"`{' '.join(argv)}` did not answer in {timeout:.0f} s: is slurmctld up?") from None


def check_job_id(job_id: str) -> str:
    if not JOB_ID_RE.match(str(job_id)):
        raise RlrunError(f"job id {job_id!r}: expected a Slurm job id (digits), as `rlrun slurm submit` printed")
    return str(job_id)


def sbatch(script: Path) -> str:
    """Submit `script`; the job id."""
    proc = _slurm(["sbatch", "--parsable", str(script)], "submit")
    if proc.returncode != 0:
        raise RlrunError(f"sbatch refused {script}: {proc.stderr.strip() or proc.stdout.strip()}")
    job_id = proc.stdout.strip().split(";")[0]
    if not JOB_ID_RE.match(job_id):
        raise RlrunError(f"sbatch printed {proc.stdout.strip()!r}, expected a job id")
    return job_id


def slurm_state(job_id: str) -> tuple[str, str]:
    """(state, exit code 'N:S') of a job, '' where Slurm no longer knows it."""
    proc = _slurm(["squeue", "-h", "-j", job_id, "-o", "%T"], "status")
    state = proc.stdout.strip() if proc.returncode == 0 else ""
    if state and state not in ENDED:
        return state, ""
    proc = _slurm(["scontrol", "show", "job", "-o", job_id], "status")
    if proc.returncode != 0:
        return state, ""
    fields = dict(f.split("=", 1) for f in proc.stdout.split() if "=" in f)
    return fields.get("JobState", state), fields.get("ExitCode", "")


def record(job_root: Path, job_id: str) -> dict:
    """The job's record written by its sbatch script ({} before the script ran)."""
    try:
        return json.loads((job_root / f"{job_id}.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise RlrunError(f"cannot read the record {job_root / f'{job_id}.json'}: {exc}") from None


def known_jobs(job_root: Path) -> list[str]:
    """Job ids with a record or output in the job root, oldest first."""
    if not job_root.is_dir():
        return []
    ids = {p.stem for p in job_root.iterdir() if p.suffix in (".json", ".out") and JOB_ID_RE.match(p.stem)}
    return sorted(ids, key=int)


def status(job_root: Path, job_id: str) -> dict:
    state, exit_code = slurm_state(job_id)
    rec = record(job_root, job_id)
    if not state and not rec:
        raise RlrunError(f"no job {job_id}: Slurm does not know it and {job_root} holds no record of it")
    return {"job_id": job_id, "slurm_state": state or "unknown (ended; Slurm forgot it)",
            "slurm_exit": exit_code, **{k: v for k, v in rec.items() if k != "job_id"}}


def cancel(job_id: str) -> None:
    proc = _slurm(["scancel", job_id], "cancel")
    if proc.returncode != 0:
        raise RlrunError(f"scancel {job_id} failed: {proc.stderr.strip() or proc.stdout.strip()}")


def wait_ended(job_id: str, timeout: float, poll: float = 1.0) -> str:
    """Wait until Slurm shows the job ended; its final state."""
    deadline = time.monotonic() + timeout
    while True:
        state, _ = slurm_state(job_id)
        if not state or state in ENDED:
            return state or "ENDED"
        if time.monotonic() > deadline:
            raise RlrunError(f"job {job_id} is still {state} after {timeout:.0f} s")
        time.sleep(poll)


def follow(job_root: Path, job_id: str, write: Callable[[str], None], poll: float = 1.0) -> tuple[str, str]:
    """Stream the job's output until Slurm shows it ended; (state, exit code)."""
    out = job_root / f"{job_id}.out"
    pos = 0

    def drain() -> None:
        nonlocal pos
        try:
            with open(out, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
        except FileNotFoundError:
            return
        if chunk:
            pos += len(chunk)
            write(chunk.decode("utf-8", errors="replace"))

    while True:
        drain()
        state, exit_code = slurm_state(job_id)
        if not state or state in ENDED:
            # The output file is written by the nodes over a shared filesystem: a last read after the end.
            time.sleep(poll)
            drain()
            return state or "ENDED", exit_code
        time.sleep(poll)


def write_script(job_root: Path, text: str, name: str) -> Path:
    """The rendered script, kept next to the job's output (0700 dir, 0600 file)."""
    job_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = job_root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sbatch"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path
