"""`rlrun plot JOB [JOB...]`: the panels a researcher reads a run by, one PNG, several runs overlaid.

The data are the ``@metrics {json}`` lines the trainer prints per step and its ``@plan`` line
(``trainer.metrics``), read through Ray's Jobs API (``get_job_logs``), so it works from any machine that
reaches the dashboard, unlike the metrics.jsonl on the head's disk. Drawn with matplotlib's Agg canvas
(no display, no pyplot state).

Panels (a panel without data is left out; a series that is 0 at every step of every run is left out and
named in the footer): reward and accuracy (with the reward's +-std band), evaluation (``eval/greedy``,
``eval/pass@K``, ``eval/mean@K`` at the evaluation steps, step 0 before training), KL, policy loss, critic loss,
response length, clip fractions, learning rate, phase timings, tokens per step, and the rest. Each has its
own axis, so a learning rate never shares a scale with token counts. Lines are smoothed (TensorBoard's
debiased exponential moving average) over the faint raw values. The warm-up is marked: the supervised
warm-up that ran before step 1 (from ``@plan``'s ``sft_warmup_steps``) and the learning-rate warm-up
(the steps while ``lr/*`` still climbs), shaded. One run: a colour per metric; several: a colour per run
and a line style per metric.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.metrics import parse_log_line


@dataclass
class Run:
    """One job's metrics: `label` (job id or log file), its preset (or name), @plan and @metrics rows."""

    label: str
    preset: str | None
    plan: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    # the supervised warm-up before step 1: (warm-up step, loss/sft), from the trainer's "warm-up step" lines
    warmup: list[tuple[int, float]] = field(default_factory=list)

    @property
    def warmup_steps(self) -> int:
        return int(self.plan.get("sft_warmup_steps") or 0) or len(self.warmup)

    @property
    def title(self) -> str:
        steps = f"{len(self.rows)}/{self.plan['total_steps']}" if "total_steps" in self.plan else str(len(self.rows))
        algo = f", {self.plan['algorithm']}" if self.plan.get("algorithm") else ""
        return f"{self.preset + ' · ' if self.preset else ''}{self.label} ({steps} steps{algo})"


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    wants: Callable[[str], bool]
    ylim01: bool = False  # a fraction: 0..1
    sci: bool = False  # tiny numbers (learning rates): scientific tick labels


PANELS: tuple[Panel, ...] = (
    Panel("reward", "reward", lambda k: k == "reward/mean"),
    Panel("accuracy", "fraction correct", lambda k: k == "reward/accuracy", ylim01=True),
    # trainer.rollout.evaluate's headline metrics (logged on evaluation steps; step 0: before training)
    Panel("evaluation", "reward on --eval_data", lambda k: bool(re.match(r"^eval/(greedy|pass@\d+|mean@\d+)$", k))),
    Panel("tools", "fraction of samples (calls)", lambda k: k in ("search/rate", "tools/rate", "tools/errors",
                                                                  "reward/exact_match"), ylim01=True),
    Panel("KL to the reference", "KL", lambda k: k.startswith("kl/") or k == "loss/kl"),
    Panel("policy loss", "loss", lambda k: k == "loss/policy"),
    Panel("critic", "loss / value", lambda k: k == "loss/critic" or k.startswith("critic/") and "clip" not in k),
    Panel("response length", "tokens", lambda k: k.startswith("response_length/") or k == "eval/response_length"),
    Panel("clip fraction", "fraction of tokens clipped", lambda k: k.endswith("clip_frac")),
    Panel("learning rate", "lr", lambda k: k.startswith("lr/"), sci=True),
    Panel("phase timings", "seconds per step", lambda k: k.startswith("timing/")),
    Panel("tokens per step", "tokens", lambda k: k.startswith("tokens/")),
    Panel("other", "", lambda k: k != "reward/std"),
)
LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 3)))


def read_log(lines: Iterable[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the @plan payload, the @metrics rows by step; a step logged twice keeps its last row)."""
    plan: dict[str, Any] = {}
    rows: dict[int, dict[str, Any]] = {}
    for line in lines:
        parsed = parse_log_line(line.rstrip("\r"))
        if parsed is None:
            continue
        kind, payload = parsed
        if kind == "plan":
            plan = payload
        elif isinstance(payload.get("step"), int):
            rows[payload["step"]] = payload
    return plan, [rows[s] for s in sorted(rows)]


WARMUP_LINE = re.compile(r"^warm-up step (\d+)/(\d+): loss/sft=([-+0-9.eE]+|nan|inf)")


def read_run(lines: Iterable[str], label: str, preset: str | None = None) -> Run:
    """A job log as a Run: @plan, @metrics and the supervised warm-up's loss lines."""
    lines = list(lines)
    plan, rows = read_log(lines)
    warmup = {}
    for line in lines:
        match = WARMUP_LINE.match(line)
        if match:
            warmup[int(match.group(1))] = float(match.group(3))
            plan.setdefault("sft_warmup_steps", int(match.group(2)))
    return Run(label, preset, plan, rows, sorted(warmup.items()))


def series(rows: list[dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """metric name -> (steps, values), finite numbers only."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key in ("step", "time") or not isinstance(value, int | float) or isinstance(value, bool):
                continue
            if not math.isfinite(value):
                continue
            steps, values = out.setdefault(key, ([], []))
            steps.append(row["step"])
            values.append(float(value))
    return out


def smooth(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased so the first points are not
    pulled towards 0. weight 0 returns the values unchanged."""
    if weight <= 0:
        return list(values)
    out, last, norm = [], 0.0, 0.0
    for v in values:
        last = last * weight + (1 - weight) * v
        norm = norm * weight + (1 - weight)
        out.append(last / norm)
    return out


def auto_smoothing(n_points: int) -> float:
    """No smoothing for short runs (every point matters), 0.6 (TensorBoard's default) from 20 steps on."""
    return 0.0 if n_points < 20 else 0.6


def lr_warmup_end(steps: list[int], lrs: list[float]) -> int | None:
    """The last step of the learning-rate warm-up (the rate rises until it first reaches its peak), or
    None when the rate never rises."""
    if len(lrs) < 2 or lrs[1] <= lrs[0]:
        return None
    peak = max(lrs)
    for step, lr in zip(steps, lrs, strict=True):
        if lr >= peak * (1 - 1e-9):
            return step
    return None


def layout(runs: list[Run]) -> tuple[list[tuple[Panel, list[str]]], list[str]]:
    """([(panel, metric names)] for the panels that have data, [metrics left out as 0 at every step])."""
    data = [series(r.rows) for r in runs]
    keys = sorted({k for d in data for k in d})
    zero = [k for k in keys if all(v == 0.0 for d in data for v in d.get(k, ([], []))[1])]
    keys = [k for k in keys if k not in zero]
    panels, claimed = [], set()
    for panel in PANELS:
        mine = [k for k in keys if k not in claimed and panel.wants(k)]
        claimed.update(mine)
        if mine:
            panels.append((panel, mine))
    return panels, [k for k in zero if k != "reward/std"]


def figure(runs: list[Run], smooth_weight: float | None = None):
    """(the matplotlib Figure, {panel title: [metric names plotted]})."""
    # matplotlib takes seconds to import: only `rlrun plot` pays for it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels, zero = layout(runs)
    warm_runs = [r for r in runs if r.warmup]
    n = len(panels) + (1 if warm_runs else 0)
    cols = 3 if n > 4 else 2 if n > 1 else 1
    nrows = max(1, math.ceil(n / cols))
    fig = Figure(figsize=(5.6 * cols, 3.5 * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    several = len(runs) > 1
    if not several:  # several: the runs' titles are the figure legend, on top
        fig.suptitle(runs[0].title, fontsize=12)
    data = [series(r.rows) for r in runs]
    weights = [auto_smoothing(len(r.rows)) if smooth_weight is None else smooth_weight for r in runs]

    def color(ri: int, ki: int) -> str:
        return f"C{(ri if several else ki) % 10}"

    plotted: dict[str, list[str]] = {}
    for i, (panel, keys) in enumerate(panels):
        ax = fig.add_subplot(nrows, cols, i + 1)
        for ri, (d, weight) in enumerate(zip(data, weights, strict=True)):
            for ki, key in enumerate(keys):
                if key not in d:
                    continue
                steps, values = d[key]
                c, style = color(ri, ki), LINESTYLES[ki % len(LINESTYLES)] if several else "-"
                if key == "reward/mean" and "reward/std" in d and not several:
                    std = dict(zip(*d["reward/std"], strict=True))
                    lo = [v - std.get(s, 0.0) for s, v in zip(steps, values, strict=True)]
                    hi = [v + std.get(s, 0.0) for s, v in zip(steps, values, strict=True)]
                    ax.fill_between(steps, smooth(lo, weight), smooth(hi, weight), color=c, alpha=0.10,
                                    linewidth=0, label="± std over samples")
                if weight > 0:
                    ax.plot(steps, values, color=c, linestyle=style, alpha=0.25, linewidth=0.8)
                ax.plot(steps, smooth(values, weight), color=c, linestyle=style, linewidth=1.6,
                        label=None if several else key, marker="o" if len(steps) < 20 else None, markersize=3)
            lrs = d.get("lr/actor")
            end = lr_warmup_end(*lrs) if lrs else None
            if end is not None:
                ax.axvspan(lrs[0][0], end, color=color(ri, 0) if several else "0.5", alpha=0.08,
                           label="lr warm-up" if ri == 0 else None)
        if several and len(keys) > 1:  # colours are runs (figure legend); line styles are metrics
            for ki, key in enumerate(keys):
                ax.plot([], [], color="0.3", linestyle=LINESTYLES[ki % len(LINESTYLES)], label=key)
        if i == 0 and warm_runs:
            counts = {r.warmup_steps for r in warm_runs}
            text = (f"{counts.pop()} supervised warm-up steps" if len(counts) == 1 else
                    "; ".join(f"{r.warmup_steps} supervised warm-up steps ({r.label})" for r in warm_runs))
            text += " before step 1"
            ax.annotate(text, xy=(0.01, 0.98), xycoords="axes fraction", va="top", fontsize=8, color="0.3")
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel)
        if panel.ylim01 or (panel.title == "reward" and _bounded01(data)):
            ax.set_ylim(-0.02, 1.02)
        elif panel.sci:
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small", loc="lower right" if panel.title in ("reward", "accuracy") else "best")
        plotted[panel.title] = keys
    if warm_runs:
        ax = fig.add_subplot(nrows, cols, len(panels) + 1)
        for run in warm_runs:
            steps = [s for s, _ in run.warmup]
            ax.plot(steps, [v for _, v in run.warmup], color=color(runs.index(run), 0),
                    marker="o" if len(steps) < 40 else None, markersize=3,
                    label=None if several else "loss/sft")
        ax.set_title("supervised warm-up (before RL step 1)", fontsize=10)
        ax.set_xlabel("warm-up step")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        if not several:
            ax.legend(fontsize="x-small")
        plotted["supervised warm-up"] = ["loss/sft"]
    if several:
        from matplotlib.lines import Line2D  # (see figure(): matplotlib only when plotting)

        fig.legend([Line2D([], [], color=color(ri, 0), linewidth=2) for ri in range(len(runs))],
                   [r.title for r in runs], loc="outside upper center", ncols=min(len(runs), 3), fontsize=9)
    foot = [f"smoothing {', '.join(sorted({f'{w:g}' for w in weights}))} (EMA; raw values faint)"]
    if zero:
        foot.append(f"0 at every step, not drawn: {', '.join(zero)}")
    fig.supxlabel(" | ".join(foot), fontsize=8, color="0.35")
    return fig, plotted


def _bounded01(data: list[dict]) -> bool:
    """Rewards within [0, 1] (math verification): draw the reward panel on 0..1 so runs compare."""
    values = [v for d in data for k in ("reward/mean", "reward/accuracy") for v in d.get(k, ([], []))[1]]
    return bool(values) and min(values) >= 0.0 and max(values) <= 1.0


def write_png(runs: list[Run], out: Path, smooth: float | None = None) -> dict[str, list[str]]:
    """Draw the runs into the PNG ``out``; returns what was plotted (panel -> metric names)."""
    fig, plotted = figure(runs, smooth)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=110)
    return plotted
