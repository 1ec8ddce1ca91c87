"""The jobs' commands after submit: list, logs, stop, and one job's status or progress view
(`rlrun status [-f] JOB`, `rlrun submit --follow`)."""

from __future__ import annotations

import fnmatch
import sys

import click

from rlrun import follow as progress_view
from rlrun.commands.context import Context, pass_ctx
from rlrun.commands.output import (
    columns,
    emit_json,
    err_console,
    fmt_duration,
    fmt_time,
    say,
)
from rlrun.errors import RlrunError
from rlrun.jobs import Jobs, log_tail, short_message
from rlrun.probe import PROBE_JOB_PREFIX

STATUSES = ["PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"]


def follow_job(obj: Context, jobs: Jobs, job_id: str) -> None:
    """The progress view until the job ends; its end, and the log's last lines when it did not succeed."""
    inv = obj.inv_flag
    try:
        final, follower = progress_view.follow(jobs, job_id, err_console)
    except KeyboardInterrupt:
        say(f"\nstopped following; the job keeps running: rlrun{inv} stop {job_id}")
        raise SystemExit(130) from None
    steps = f" after {follower.step}/{follower.total} steps" if follower.total is not None else ""
    summary = f"; last {follower.summary()}" if follower.summary() else ""
    say(f"job {job_id}: {final}{steps}{summary}")
    if follower.curve():
        say(follower.curve())
    if final != "SUCCEEDED":
        info = jobs.info(job_id)
        message = short_message(info.message)
        tail = follower.failure_tail(jobs.logs(job_id), 30)
        if tail.strip():
            say(f"the last lines of the log the view left out (all of it: rlrun{inv} logs {job_id}):\n{tail.rstrip()}")
        raise RlrunError(f"job {job_id} ended {final}" + (f": {message}" if message else ""))


def job_status(obj: Context, job_id: str, as_json: bool, follow: bool) -> None:
    """`rlrun status JOB`: one line (or JSON), or with --follow the progress view."""
    jobs = obj.jobs()
    if follow:
        follow_job(obj, jobs, job_id)
        return
    info = jobs.info(job_id)
    message = short_message(info.message)
    if as_json:
        emit_json({"job_id": job_id, "status": str(info.status.value), "message": message})
    else:
        click.echo(f"{job_id}: {info.status.value}" + (f" ({message})" if message else ""))


@click.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every field, full ids).")
@click.option("--status", "statuses", multiple=True, metavar="STATUS",
              type=click.Choice(STATUSES, case_sensitive=False), help="Only jobs in this state (repeatable).")
@click.option("--name", "name_glob", metavar="PATTERN", help="Only jobs whose name or preset matches (glob).")
@click.option("-n", "--last", "last", type=click.IntRange(min=0), default=20, show_default=True,
              help="The most recent N jobs (0 = all).")
@click.option("--drivers/--no-drivers", default=True, show_default=True,
              help="Include drivers that connected without the Jobs API.")
@click.option("--all", "show_all", is_flag=True, help="Also rlrun's own probe jobs (the pre-submit checks).")
@pass_ctx
def list_(obj, as_json, statuses, name_glob, last, drivers, show_all):
    """List the cluster's jobs: id, name or preset, status, step, start and duration."""
    jobs = obj.jobs()
    rows = jobs.rows()
    if not show_all:
        rows = [r for r in rows if not r.job_id.startswith(PROBE_JOB_PREFIX)]
    if statuses:
        wanted = {s.upper() for s in statuses}
        rows = [r for r in rows if r.status in wanted]
    if name_glob:
        rows = [r for r in rows if fnmatch.fnmatch(r.name, name_glob) or (r.preset and fnmatch.fnmatch(r.preset, name_glob))]
    if not drivers:
        rows = [r for r in rows if r.kind != "DRIVER"]
    if last:
        rows = rows[-last:]
    jobs.add_progress(rows)
    if as_json:
        emit_json([r.to_json() for r in rows])
        return
    say(f"jobs on cluster {obj.cluster.name} ({obj.cluster.dashboard_url})")
    lines = [("JOB", "NAME", "STATUS", "STEP", "STARTED", "TOOK")]
    for r in rows:
        step = f"{r.step}/{r.total_steps}" if r.step is not None else (f"0/{r.total_steps}" if r.total_steps else "-")
        name = r.name if len(r.name) <= 28 else r.name[:27] + "…"
        lines.append((r.job_id, name, r.status + (" (driver)" if r.kind == "DRIVER" else ""), step,
                      fmt_time(r.start_time), fmt_duration(r.duration)))
    if rows:
        click.echo(columns(lines))
    else:
        say("no jobs" + (" match" if statuses or name_glob else ""))


@click.command()
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the job ends.")
@click.option("--tail", "tail", type=click.IntRange(min=1), default=None, metavar="N",
              help="Only the last N lines (with -f: then stream what comes).")
@pass_ctx
def logs(obj, job_id, follow, tail):
    """Print a job's whole log (library warnings included; `rlrun status -f JOB` shows the progress view)."""
    jobs = obj.jobs()
    if not follow:
        text = jobs.logs(job_id)
        sys.stdout.write(log_tail(text, tail) if tail else text)
        return
    skip = 0
    if tail:
        text = jobs.logs(job_id)
        sys.stdout.write(log_tail(text, tail))
        skip = len(text)

    def write(chunk: str) -> None:
        nonlocal skip
        if skip:
            cut = min(skip, len(chunk))
            chunk, skip = chunk[cut:], skip - cut
        sys.stdout.write(chunk)
        sys.stdout.flush()

    try:
        final = jobs.follow(job_id, write=write)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    say(f"job {job_id}: {final}")


@click.command()
@click.argument("job_id")
@pass_ctx
def stop(obj, job_id):
    """Stop a running job."""
    jobs = obj.jobs()
    stopped = jobs.stop(job_id)
    click.echo(f"{job_id}: {'stop requested' if stopped else 'not running (' + jobs.status(job_id) + ')'}")


COMMANDS = (list_, logs, stop)
