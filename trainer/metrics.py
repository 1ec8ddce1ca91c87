"""Metrics: console, JSON lines, TensorBoard and Weights & Biases (when configured). Names are namespaced
(`reward/mean`, `loss/policy`, `timing/generate`).

The console gets, per logged step, a line for people and a line for tools (``rlrun submit
--follow``'s progress bar, ``rlrun plot``), which read the job's log through Ray's Jobs API::

    step 3: reward/mean=0.25 ... | generate=0.41s ...
    @metrics {"step": 3, "time": 1763712000.0, "reward/mean": 0.25, ...}

and once, before the first step, ``@plan {"total_steps": N, ...}``.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainer.files import replace_file

METRICS_TAG = "@metrics"
PLAN_TAG = "@plan"


def print_line(text: str, flush: bool = True) -> None:
    """``text`` and its newline to stdout in one write. ``print`` writes them in two, and in a Ray driver the
    thread that forwards the workers' log lines writes to the same stream: a worker's line landing between the
    two glued itself to the end of an ``@metrics`` line, whose JSON then no longer parsed, and ``rlrun submit``
    lost that step (CI, 2026-11-29: step 11 of 48)."""
    sys.stdout.write(text + "\n")
    if flush:
        sys.stdout.flush()


def parse_log_line(line: str) -> tuple[str, dict[str, Any]] | None:
    """``("metrics"|"plan", payload)`` for a tool line of a job log, else None."""
    for tag in (METRICS_TAG, PLAN_TAG):
        if line.startswith(tag + " "):
            try:
                payload = json.loads(line[len(tag) + 1:])
            except ValueError:
                return None
            return (tag[1:], payload) if isinstance(payload, dict) else None
    return None


class WandbLogger:
    """Weights & Biases (``--use_wandb``): one run per training job, metrics per step, config attached.

    ``key`` is an API key, or ``"env"`` for WANDB_API_KEY / a stored login; ``WANDB_MODE=offline`` writes the
    run under ``WANDB_DIR`` for a later ``wandb sync`` (clusters without internet)."""

    def __init__(self, key: str, project: str, run_name: str | None, config: dict[str, Any]):
        import os

        try:
            import wandb
        except ImportError:
            raise RuntimeError("--use_wandb needs the wandb package, which is not installed: pip install "
                               "'rlrun[wandb]' on the nodes, or drop --use_wandb") from None
        if key and key != "env":
            os.environ["WANDB_API_KEY"] = key  # this process and its children only; never logged
        self.run = wandb.init(project=project, name=run_name or time.strftime("ppo_%Y%m%dT%H%M%S"),
                              config=config)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MetricsLogger:
    def __init__(self, jsonl_path: str | None, tensorboard_dir: str | None = None, print_fn=print_line,
                 wandb: WandbLogger | None = None):
        self.jsonl = None
        self.jsonl_path = Path(jsonl_path) if jsonl_path else None
        self.tb = None
        if tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise RuntimeError(f"--use_tensorboard needs the tensorboard package ({exc}); "
                                   "pip install tensorboard or drop the flag") from None
            self.tb = SummaryWriter(tensorboard_dir)
        self.print = print_fn
        self.wandb = wandb

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        if self.jsonl_path and self.jsonl is None:
            self.begin(None)
        if self.jsonl:
            self.jsonl.write(json.dumps(row) + "\n")
            self.jsonl.flush()
        if self.tb:
            for key, value in metrics.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb:
            self.wandb.log(step, metrics)
        shown = " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if not k.startswith("timing/"))
        timing = " ".join(f"{k[7:]}={v:.2f}s" for k, v in sorted(metrics.items()) if k.startswith("timing/"))
        self.print(f"step {step}: {shown} | {timing}", flush=True)
        self.print(f"{METRICS_TAG} {json.dumps(row)}", flush=True)

    def begin(self, resumed_step: int | None) -> str | None:
        """Open the JSON-lines file, so that it holds one run's steps once each. A run resumed from the
        checkpoint of step k runs steps after k again: the file's rows of those steps (written after that
        checkpoint, before the run stopped) move to ``<file>.replaced``. A fresh run (None) finds an earlier
        run's file and renames it ``<file>.<n>`` (the first n free). Returns a line saying what moved, or None.
        Lines that are not rows of this logger stay where they are."""
        if self.jsonl_path is None or self.jsonl is not None:
            return None
        path, note = self.jsonl_path, None
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size:
            if resumed_step is None:
                n = 1
                while path.with_name(f"{path.name}.{n}").exists():
                    n += 1
                path.rename(path.with_name(f"{path.name}.{n}"))
                note = f"metrics: {path} held an earlier run's rows; it is now {path.name}.{n}"
            else:
                keep, replaced = [], []
                for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
                    try:
                        step = json.loads(line).get("step")
                    except (ValueError, AttributeError):
                        step = None
                    (replaced if isinstance(step, int) and step > resumed_step else keep).append(line)
                if replaced:
                    with open(path.with_name(path.name + ".replaced"), "a", encoding="utf-8") as out:
                        out.writelines(replaced)
                    replace_file(path, "".join(keep))
                    note = (f"metrics: {len(replaced)} rows of steps after {resumed_step} (run again now) moved "
                            f"from {path} to {path.name}.replaced")
        self.jsonl = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        return note

    def plan(self, **info: Any) -> None:
        """Announce the run's shape (``total_steps`` at least) for progress displays."""
        self.print(f"{PLAN_TAG} {json.dumps(info)}", flush=True)

    def close(self) -> None:
        if self.jsonl:
            self.jsonl.close()
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.close()


class Timer:
    """`with timer("generate"):` adds `timing/generate` seconds to `timer.times`."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Any:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[f"timing/{name}"] = self.times.get(f"timing/{name}", 0.0) + time.perf_counter() - start
