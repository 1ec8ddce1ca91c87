"""`rlrun plot JOB`: a PNG of a job's reward, KL, losses and phase timings, from its log.

The data are the ``@metrics {json}`` lines the trainer prints per step (``trainer.metrics``), read
through Ray's Jobs API (``get_job_logs``), so it works from any machine that reaches the dashboard,
unlike the metrics.jsonl on the head's disk. Drawn with matplotlib's Agg canvas (no display, no
pyplot state). Panels group metrics by namespace; a panel without data is left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainer.metrics import parse_log_line

# (title, y label, which metric names go there); the first panel that claims a name gets it.
PANELS: tuple[tuple[str, str, Any], ...] = (
    ("reward", "reward", lambda k: k.startswith("reward/")),
    ("KL", "KL", lambda k: k.startswith("kl/") or k == "loss/kl"),
    ("losses", "loss", lambda k: k.startswith("loss/")),
    ("phase timings", "seconds", lambda k: k.startswith("timing/")),
    ("other", "", lambda k: k not in ("step", "time")),
)


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


def series(rows: list[dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """metric name -> (steps, values), numbers only."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key in ("step", "time") or not isinstance(value, int | float) or isinstance(value, bool):
                continue
            steps, values = out.setdefault(key, ([], []))
            steps.append(row["step"])
            values.append(float(value))
    return out


def figure(rows: list[dict[str, Any]], title: str):
    """(the matplotlib Figure, {panel title: [metric names plotted]})."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = series(rows)
    panels: list[tuple[str, str, list[str]]] = []
    claimed: set[str] = set()
    for name, ylabel, wants in PANELS:
        keys = sorted(k for k in data if k not in claimed and wants(k))
        claimed.update(keys)
        if keys:
            panels.append((name, ylabel, keys))
    cols = 2 if len(panels) > 1 else 1
    nrows = (len(panels) + cols - 1) // cols
    fig = Figure(figsize=(6.5 * cols, 3.6 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title)
    for i, (name, ylabel, keys) in enumerate(panels):
        ax = fig.add_subplot(nrows, cols, i + 1)
        for key in keys:
            steps, values = data[key]
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=key)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return fig, {name: keys for name, _, keys in panels}


def write_png(rows: list[dict[str, Any]], out: Path, title: str) -> dict[str, list[str]]:
    """Draw the rows into the PNG ``out``; returns what was plotted (panel -> metric names)."""
    fig, plotted = figure(rows, title)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return plotted
