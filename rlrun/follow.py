"""Follow a job: a clean progress view of its log, and a progress bar of training steps with the reward.

The trainer prints ``@plan {"total_steps": N, ...}`` once and ``@metrics {"step": k, ...}`` per step
(``trainer.metrics``); those tool lines drive the bar and are not echoed. The trainer's own lines (its
``step k: ...`` metrics lines, data and sync notes) and errors (tracebacks, ERROR lines) go to stdout;
library chatter (Python warnings with their source line, INFO / WARNING log lines of vLLM, DeepSpeed, Ray
and torch, loading bars) is left out of the view: it stays in ``rlrun logs JOB``. On a terminal the bar
is drawn on stderr (rich); elsewhere (CI, pipes) a plain ``[k/N] reward/mean=...`` line per step goes to
stderr instead.
"""

from __future__ import annotations

import re
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
# What the progress line shows, when the step logged it (tool rollouts: the share of samples that called a tool
# (searched), turns per sample, the share of calls that failed, exact match).
SUMMARY_KEYS = (REWARD_KEY, "reward/exact_match", "search/rate", "search/turns", "tools/rate", "tools/turns",
                "tools/errors", "kl/mean", "async/staleness", "rollout/logprob_mismatch",
                "dynamic_filtering/filtered_share", "engines/restarts")
# Shown only when the first key is not there (the search tool's own names say the same).
SAME_AS = {"tools/rate": "search/rate", "tools/turns": "search/turns"}
# The evaluation's headline metrics (trainer.rollout.evaluate; K = --eval_n_samples): logged on evaluation steps only,
# shown from then on with the step they are from.
EVAL_KEYS = re.compile(r"^eval/(greedy|pass@\d+|mean@\d+)$")

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Ray's prefix of a worker's line, e.g. "(VllmEngine pid=20508, ip=10.0.0.2) ", possibly nested.
RAY_PREFIX = re.compile(r"^(\([\w.:<>-]+ pid=\d+(?:, ip=[\d.:a-f]+)?\) ?)+")
# A warning from the `warnings` module: "path/file.py:83: FutureWarning: text" (its source line follows).
PY_WARNING = re.compile(r"^\S.*?:\d+: [A-Z]\w*Warning: ")
NOISE = [re.compile(p) for p in (
    r"^(DEBUG|INFO|WARNING|WARN)\s+\d\d-\d\d \d\d:\d\d:\d\d",          # vLLM
    r"^\[\d{4}-\d\d-\d\d [\d:,.]+\] \[(DEBUG|INFO|WARNING)\]",       # DeepSpeed
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+\s+(DEBUG|INFO|WARNING)\s",  # Ray, Python logging
    r"^\[?[WI]\d{4} \d\d:\d\d:\d\d\.\d+",                              # torch / glog W and I lines
    r"^(DEBUG|INFO|WARNING|WARN):",                                  # logging.basicConfig style
    r"\d+%\|.*\|| Completed \| \d+/\d+ \[",                            # progress bars (tqdm)
    r"^\s*warnings\.warn\(",
    r"^Running entrypoint for job ",                                 # Ray's echo of the command
)]
# Ray's own lines about the job (the command echoed, the runtime env): never the cause of a failure.
RAY_BOILERPLATE = re.compile(r"^Running entrypoint for job |\sINFO job_manager\.py:\d+ -- ")
ERROR = re.compile(r"^(Traceback \(most recent call last\)|(\w+\.)*\w*(Error|Exception|Interrupt)(\(\w+\))?(: |$)|"
                   r"ERROR\b|CRITICAL\b|\[\d{4}-[^]]*\] \[ERROR\]|\d{4}-\d\d-\d\d [\d:,.]+\s+ERROR\s)")


def classify(line: str, after_warning: bool = False) -> str:
    """'noise' (library chatter: hidden from the view), 'error' or 'trainer' (shown). `after_warning`: the
    previous line of the same process was a Python warning, so an indented line is its source line."""
    text = RAY_PREFIX.sub("", ANSI.sub("", line))
    if not text.strip():
        return "noise"
    if ERROR.match(text):
        return "error"
    if PY_WARNING.match(text) or (after_warning and text.startswith("  ")):
        return "noise"
    if any(p.search(text) for p in NOISE):
        return "noise"
    return "trainer"


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
        self.evals: dict[str, float] = {}  # the last evaluation's headline metrics
        self.eval_step: int | None = None
        self.rewards: dict[int, float] = {}  # step -> reward/mean, for the curve at the end
        self.progress: Progress | None = None
        self.task = None
        self.lines = 0  # log lines seen
        self.hidden = 0  # of which left out of the view
        self.last_error = -1  # index of the last error line shown
        self.shown: set[int] = set()  # indices of the lines the view showed
        self._after_warning = False

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
        self.lines += 1
        parsed = parse_log_line(line)
        if parsed is not None:
            if parsed[0] == "plan":
                self.plan(parsed[1])
            else:
                self.metrics(parsed[1])
            return
        kind = classify(line, self._after_warning)
        self._after_warning = bool(PY_WARNING.match(RAY_PREFIX.sub("", ANSI.sub("", line)))) or (
            self._after_warning and kind == "noise")
        if kind == "noise":
            self.hidden += 1
            return
        if kind == "error":
            self.last_error = self.lines - 1
        self.shown.add(self.lines - 1)
        self.echo(ANSI.sub("", line))

    def failure_tail(self, log: str, lines: int = 30) -> str:
        """What to show once when the job failed: of the log's last `lines` lines, those the view left out
        (library lines that may hold the cause); nothing when the view has just shown an error, whose
        traceback is then on screen already."""
        if self.last_error >= 0 and self.last_error >= self.lines - lines:
            return ""
        all_lines = log.splitlines()
        first = len(all_lines) - min(lines, len(all_lines))
        hidden = [ANSI.sub("", line) for i, line in enumerate(all_lines[first:], start=first)
                  if i not in self.shown and parse_log_line(line) is None and not RAY_BOILERPLATE.search(line)]
        return "\n".join(hidden)

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
        evals = {k: float(v) for k, v in row.items() if EVAL_KEYS.match(k) and isinstance(v, int | float)}
        if evals:
            self.evals, self.eval_step = evals, self.step
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
        for key in SUMMARY_KEYS:
            value = self.last.get(key)
            if key in SAME_AS and SAME_AS[key] in self.last:
                continue
            if isinstance(value, int | float) and (value or key != "engines/restarts"):  # restarts: once there are
                parts.append(f"{key}={value:.4g}")
        if self.evals:
            parts += [f"{key}={value:.4g}" for key, value in sorted(self.evals.items())]
            if self.eval_step != self.step:
                parts.append(f"(eval of step {self.eval_step})")
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
