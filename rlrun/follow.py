"""Follow a job: its log lines as they come, and a progress bar of training steps with the reward.

The trainer prints ``@plan {"total_steps": N, ...}`` once and ``@metrics {"step": k, ...}`` per step
(``trainer.metrics``); those tool lines drive the bar and are not echoed. Every other line goes to
stdout. On a terminal the bar is drawn on stderr (rich); elsewhere (CI, pipes) a plain
``[k/N] reward/mean=...`` line per step goes to stderr instead.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from trainer.metrics import parse_log_line

REWARD_KEY = "reward/mean"


class LogFollower:
    """Feed it log chunks (``write``); it splits lines, echoes people's lines and tracks the steps."""

    def __init__(self, err: Console, out=None, live: bool | None = None):
        self.err = err
        self.out = out or sys.stdout
        self.live = err.is_terminal if live is None else live
        self.buffer = ""
        self.total: int | None = None
        self.step = 0
        self.last: dict[str, Any] = {}
        self.rewards: dict[int, float] = {}  # step -> reward/mean, for the curve at the end
        self.progress: Progress | None = None
        self.task = None

    # --- lines ------------------------------------------------------------------------------------------
    def write(self, chunk: str) -> None:
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            self.line(line)

    def flush(self) -> None:
        if self.buffer:
            self.line(self.buffer)
            self.buffer = ""

    def line(self, line: str) -> None:
        parsed = parse_log_line(line)
        if parsed is None:
            self.echo(line)
        elif parsed[0] == "plan":
            self.plan(parsed[1])
        else:
            self.metrics(parsed[1])

    def echo(self, line: str) -> None:
        if self.progress is not None and self.out.isatty():
            self.progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            self.out.write(line + "\n")
            self.out.flush()

    # --- steps ------------------------------------------------------------------------------------------
    def plan(self, plan: dict[str, Any]) -> None:
        total = plan.get("total_steps")
        self.total = int(total) if isinstance(total, int | float) else None
        self.step = int(plan.get("start_step") or 0)
        if self.live and self.progress is None:
            self.progress = Progress(TextColumn("[bold]steps"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.description}"), TimeElapsedColumn(), TextColumn("eta"),
                                     TimeRemainingColumn(), console=self.err, redirect_stdout=False,
                                     redirect_stderr=False)
            self.progress.start()
            self.task = self.progress.add_task("", total=self.total, completed=self.step)
        elif not self.live:
            self.err.print(f"plan: {self.total} steps" + (f", resuming at {self.step}" if self.step else ""),
                           highlight=False, soft_wrap=True)

    def metrics(self, row: dict[str, Any]) -> None:
        self.step = int(row.get("step", self.step + 1))
        self.last = row
        if isinstance(row.get(REWARD_KEY), int | float):
            self.rewards[self.step] = float(row[REWARD_KEY])
        text = self.summary()
        if self.progress is not None:
            self.progress.update(self.task, completed=self.step, description=text)
        else:
            self.err.print(f"[{self.step}/{self.total if self.total is not None else '?'}] {text}",
                           highlight=False, markup=False, soft_wrap=True)

    def summary(self) -> str:
        parts = []
        for key in (REWARD_KEY, "kl/mean"):
            if isinstance(self.last.get(key), int | float):
                parts.append(f"{key}={self.last[key]:.4g}")
        return " ".join(parts)

    def curve(self, points: int = 8) -> str:
        """The reward curve as text: the mean reward over ~`points` equal runs of steps."""
        steps = sorted(self.rewards)
        if not steps:
            return ""
        width = max(1, -(-len(steps) // points))
        parts = []
        for i in range(0, len(steps), width):
            run = steps[i:i + width]
            mean = sum(self.rewards[s] for s in run) / len(run)
            parts.append(f"{run[0]}-{run[-1]}: {mean:.2f}" if len(run) > 1 else f"{run[0]}: {mean:.2f}")
        return f"{REWARD_KEY} by step  " + " | ".join(parts)

    def close(self) -> None:
        self.flush()
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def follow(jobs, job_id: str, err: Console) -> tuple[str, LogFollower]:
    """Stream ``job_id``'s log through a :class:`LogFollower` until the job ends; (final status, follower)."""
    follower = LogFollower(err)
    try:
        final = jobs.follow(job_id, write=follower.write)
    finally:
        follower.close()
    return final, follower
