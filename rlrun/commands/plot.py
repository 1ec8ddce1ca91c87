"""`rlrun plot JOB... | --log FILE...`: jobs' @metrics lines as one PNG, several runs overlaid."""

from __future__ import annotations

from pathlib import Path

import click

from rlrun.commands.context import pass_ctx
from rlrun.commands.output import echo
from rlrun.errors import RlrunError
from rlrun.plot import read_run, write_png


@click.command()
@click.argument("job_ids", nargs=-1, metavar="[JOB]...")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="PNG to write (default: JOB.png, or JOB1-vs-JOB2.png for several).")
@click.option("--log", "log_files", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Read a run's metrics from a saved job log instead of the cluster (repeatable).")
@click.option("--smooth", type=click.FloatRange(0, 0.999), default=None,
              help="Exponential smoothing weight in [0, 1) (TensorBoard's; default: by run length; 0 = off). "
              "The raw values stay as a faint line.")
@pass_ctx
def plot(obj, job_ids, output, log_files, smooth):
    """Plot jobs' metrics to a PNG: reward and accuracy, KL, losses, lengths, timings, learning rate; several
    jobs (or --log files) are overlaid, one colour each."""
    if not job_ids and not log_files:
        raise RlrunError("give one or more JOB ids (see `rlrun list`) or --log FILE")
    runs = []
    jobs = obj.jobs() if job_ids else None
    for job_id in job_ids:
        info = jobs.info(job_id)
        preset = (info.metadata or {}).get("preset") or (info.metadata or {}).get("name")
        runs.append(read_run(jobs.logs(job_id).splitlines(), job_id, preset))
    for path in log_files:
        runs.append(read_run(path.read_text(encoding="utf-8", errors="replace").splitlines(), path.stem))
    empty = [r.label for r in runs if not r.rows]
    if empty:
        raise RlrunError(f"no @metrics lines in the log of {', '.join(empty)} (has it finished a step yet? is it a "
                         "`python -m trainer.train_ppo_ray` job?)")
    out = output or Path("-vs-".join(r.label for r in runs)[:150] + ".png")
    plotted = write_png(runs, out, smooth=smooth)
    echo(f"wrote {out}: " + "; ".join(f"{panel}: {', '.join(keys)}" for panel, keys in plotted.items()))
