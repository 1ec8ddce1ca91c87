"""One step under torch.profiler, on one rank (``--profile_step N``): where a train phase's time goes.

The loop asks rank 0 of each model group (the policy, the reference, the critic) to profile the step's
make_experience forwards and its train phase. What comes out, in ``<save_path>/profile/``:

- ``<group>_step<N>.txt``: the wall time of the window, the device (or, on a CPU rank, the operators') time
  by kind, and the top operators and kernels by self time;
- ``<group>_step<N>.json``: the same summary as numbers;
- with ``--profile_trace``, a Chrome trace (``.json.gz``; tens of MB for a 7B step).

The kinds sum self times, so kernels that overlap on two streams (NCCL beside a GEMM) are both counted:
``busy`` can exceed the wall time; ``wall - compute`` is a lower bound on the time the GPU waited.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

# a kernel's (or a CPU operator's) kind, first match wins; anything else is "other"
KINDS: list[tuple[str, re.Pattern[str]]] = [
    ("nccl", re.compile(r"nccl|all_gather|allgather|reduce_scatter|all_reduce|allreduce|broadcast", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy_|Memcpy|Memset|to_copy|\bto\b|contiguous", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|scaled_dot_product", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|matmul|\bmm\b|addmm|linear|bmm", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach", re.I)),
]


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


class StepProfiler:
    """torch.profiler around a window of work on this rank; ``begin`` then ``end`` writes the summary."""

    def __init__(self) -> None:
        self._prof: Any = None
        self._path: Path | None = None
        self._trace = False
        self._t0 = 0.0

    @property
    def active(self) -> bool:
        return self._prof is not None

    def begin(self, path: str, trace: bool = False) -> None:
        """Start profiling; the files go to ``path`` + ``.txt`` / ``.json`` (/ ``.trace.json.gz``)."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        if self._prof is not None:
            raise RuntimeError(f"a profile is already running (to {self._path}); end it first")
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        self._path, self._trace = Path(path), trace
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._prof = profile(activities=activities)
        self._prof.__enter__()
        self._t0 = time.perf_counter()

    def end(self) -> dict[str, Any]:
        """Stop, write the files, return the summary (``{}`` when no profile was running)."""
        import torch

        if self._prof is None:
            return {}
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - self._t0
        prof, path = self._prof, self._path
        self._prof = None
        prof.__exit__(None, None, None)
        assert path is not None
        summary, table = summarize(prof, wall)
        path.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
        path.with_suffix(".txt").write_text(render(summary) + "\n\n" + table + "\n")
        if self._trace:
            raw = path.with_suffix(".trace.json")
            prof.export_chrome_trace(str(raw))
            with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            raw.unlink()
        return summary


def summarize(prof: Any, wall: float, top: int = 25) -> tuple[dict[str, Any], str]:
    """(summary, table): seconds by kind of the device's kernels (a CPU rank: of its operators' self time),
    and the top ``top`` rows by self time."""
    averages = prof.key_averages()
    # on a GPU the kernels' own rows: not the CPU operators that launched them, nor the annotations on the
    # device's timeline (``nccl:_all_gather_base``, ``gpu_user_annotation``), whose device time is the
    # kernels' again (the first 7B profile counted NCCL twice, 2026-11-27)
    kernels = [e for e in averages if not str(getattr(e, "device_type", "CPU")).endswith("CPU")
               and not getattr(e, "is_user_annotation", False) and not e.key.startswith("nccl:")]
    on_device = any(getattr(e, "self_device_time_total", 0) > 0 for e in kernels)
    attr = "self_device_time_total" if on_device else "self_cpu_time_total"
    by_kind: dict[str, float] = {}
    rows = []
    for e in kernels if on_device else averages:
        us = float(getattr(e, attr, 0.0) or 0.0)
        if us <= 0:
            continue
        kind = kind_of(e.key)
        by_kind[kind] = by_kind.get(kind, 0.0) + us / 1e6
        rows.append({"name": e.key, "kind": kind, "s": us / 1e6, "calls": int(e.count)})
    rows.sort(key=lambda r: -r["s"])
    busy = sum(by_kind.values())
    compute = sum(v for k, v in by_kind.items() if k not in ("nccl", "copy"))
    summary = {"wall_s": wall, "clock": "device" if on_device else "cpu", "busy_s": busy, "compute_s": compute,
               "by_kind_s": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])), "top": rows[:top]}
    sort_by = "self_device_time_total" if on_device else "self_cpu_time_total"
    return summary, averages.table(sort_by=sort_by, row_limit=top, max_name_column_width=70)


def render(summary: dict[str, Any]) -> str:
    """The summary as the few lines a job log shows."""
    wall, clock = summary["wall_s"], summary["clock"]
    kinds = ", ".join(f"{k} {v:.3f} s" for k, v in summary["by_kind_s"].items())
    lines = [f"profile: {wall:.3f} s wall; {clock} self time {summary['busy_s']:.3f} s ({kinds}); "
             f"compute {summary['compute_s']:.3f} s = {100 * summary['compute_s'] / max(wall, 1e-9):.0f} % of the wall"]
    for r in summary["top"][:10]:
        lines.append(f"  {r['s']:8.3f} s  {r['calls']:6d} x  {r['kind']:9s} {r['name'][:90]}")
    return "\n".join(lines)
