"""Following a job's log (progress from @plan / @metrics lines) and plotting its metrics, on log text
written by the trainer's own MetricsLogger."""

from __future__ import annotations

import io

from rich.console import Console

from rlrun.follow import LogFollower
from rlrun.plot import figure, read_log, write_png
from trainer.metrics import MetricsLogger


def trainer_log(steps: int = 4) -> tuple[str, list[dict]]:
    """A job log as the trainer prints it: people's lines, one @plan line, per step a line and @metrics."""
    out = io.StringIO()
    logger = MetricsLogger(None, print_fn=lambda text, flush=False: out.write(text + "\n"))
    out.write("data: {'prompts': 32}\n")
    logger.plan(total_steps=steps, start_step=0, algorithm="rloo")
    rows = []
    for step in range(1, steps + 1):
        metrics = {"reward/mean": 0.1 * step, "reward/std": 0.5, "kl/mean": 0.01 * step, "loss/policy": -0.2 / step,
                   "loss/kl": 0.001 * step, "policy/clip_frac": 0.0, "timing/generate": 1.5, "timing/train": 2.0 + step}
        logger.log(step, metrics)
        rows.append(metrics)
    out.write("saved the model\n")
    return out.getvalue(), rows


def test_follower_tracks_steps_and_reward_and_echoes_only_peoples_lines():
    text, _ = trainer_log()
    err, out = io.StringIO(), io.StringIO()
    follower = LogFollower(Console(file=err, width=200), out=out, live=False)
    for i in range(0, len(text), 37):  # chunks that cut lines in the middle, as a stream does
        follower.write(text[i:i + 37])
    follower.close()
    assert (follower.total, follower.step) == (4, 4)
    assert follower.summary() == "reward/mean=0.4 kl/mean=0.04"
    assert err.getvalue().splitlines() == [
        "plan: 4 steps", "[1/4] reward/mean=0.1 kl/mean=0.01", "[2/4] reward/mean=0.2 kl/mean=0.02",
        "[3/4] reward/mean=0.3 kl/mean=0.03", "[4/4] reward/mean=0.4 kl/mean=0.04"]
    shown = out.getvalue()
    assert "@metrics" not in shown and "@plan" not in shown
    assert shown.startswith("data: {'prompts': 32}\nstep 1: ") and shown.endswith("saved the model\n")


def test_follower_draws_a_rich_bar_on_a_terminal():
    text, _ = trainer_log(2)
    err = io.StringIO()
    follower = LogFollower(Console(file=err, width=120, force_terminal=True), out=io.StringIO(), live=True)
    follower.write(text)
    task = follower.progress.tasks[0]
    assert (task.total, task.completed, task.description) == (2, 2, "reward/mean=0.2 kl/mean=0.02")
    follower.close()
    assert "2/2" in err.getvalue()


def test_plot_has_a_curve_per_metric_with_the_logged_values(tmp_path):
    text, rows = trainer_log()
    plan, parsed = read_log(text.splitlines())
    assert plan["total_steps"] == 4 and [r["step"] for r in parsed] == [1, 2, 3, 4]
    fig, plotted = figure(parsed, "job x")
    assert plotted == {"reward": ["reward/mean", "reward/std"], "KL": ["kl/mean", "loss/kl"],
                       "losses": ["loss/policy"], "phase timings": ["timing/generate", "timing/train"],
                       "other": ["policy/clip_frac"]}
    curves = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
              for ax in fig.axes for line in ax.get_lines()}
    assert curves["reward/mean"] == ([1, 2, 3, 4], [r["reward/mean"] for r in rows])
    assert curves["timing/train"] == ([1, 2, 3, 4], [3.0, 4.0, 5.0, 6.0])
    assert [ax.get_title() for ax in fig.axes] == ["reward", "KL", "losses", "phase timings", "other"]
    png = tmp_path / "out" / "job.png"
    assert write_png(parsed, png, "job x") == plotted
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_a_step_logged_twice_keeps_its_last_row_and_other_lines_are_ignored():
    lines = ['@metrics {"step": 1, "reward/mean": 0.0}', "@metrics not json", "step 1: reward/mean=0",
             '@metrics {"step": 1, "reward/mean": 0.5}', '@metrics {"step": 2, "reward/mean": 1.0}']
    plan, rows = read_log(lines)
    assert plan == {} and [r["reward/mean"] for r in rows] == [0.5, 1.0]


def test_curve_averages_the_reward_over_runs_of_steps():
    text, _ = trainer_log(steps=10)
    follower = LogFollower(Console(file=io.StringIO()), out=io.StringIO(), live=False)
    follower.write(text)
    follower.close()
    # rewards 0.1 .. 1.0; 10 steps in runs of 2 at points=5
    assert follower.curve(points=5) == ("reward/mean by step  1-2: 0.15 | 3-4: 0.35 | 5-6: 0.55 | 7-8: 0.75 | "
                                        "9-10: 0.95")
    assert LogFollower(Console(file=io.StringIO()), out=io.StringIO(), live=False).curve() == ""
