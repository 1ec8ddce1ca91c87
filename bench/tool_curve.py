"""A multi-turn preset's learning curve on this machine, run directly (no cluster): tiny-search (with its
retrieval service started here on a free loopback port, over the preset's corpus) or tiny-python.

Each run is ``python -m trainer.train_ppo_ray`` with the preset's flags on a private one-machine Ray. It prints
the curve (exact match, tool-call rate, minutes since the start, as means of ``--every`` steps), and with
``--runs 2`` (one after the other) or ``--compare FILE`` (an earlier run's metrics.jsonl, e.g. from before a
change) whether every step's metrics but the clocks are equal, step by step.

    python bench/tool_curve.py tiny-search [--runs 2] [--set max_steps=40] [--compare OLD.jsonl] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from trainer.retrieval.local import local_service  # noqa: E402 (the project on the path first)

# Metrics that measure time, not what was learned: the rest must repeat exactly.
CLOCK_KEYS = ("time", "timing/", "rollout/generate_s", "rollout/tool_s", "rollout/other_s", "tools/time_s")


def strip_clocks(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(CLOCK_KEYS)} for r in rows]


def first_difference(a: list[dict], b: list[dict]) -> str | None:
    """None when every metric of run ``a`` (clocks left out) has the same value in run ``b``, step by step (``b``
    may log more: a newer trainer's metrics), else the first difference."""
    if len(a) != len(b):
        return f"{len(a)} steps against {len(b)}"
    for x, y in zip(strip_clocks(a), strip_clocks(b), strict=True):
        keys = sorted(k for k in x if x[k] != y.get(k))
        if keys:
            return f"step {x.get('step')}: " + ", ".join(f"{k} {x.get(k)} != {y.get(k)}" for k in keys[:6])
    return None


def added_keys(a: list[dict], b: list[dict]) -> list[str]:
    return sorted({k for r in strip_clocks(b) for k in r} - {k for r in strip_clocks(a) for k in r})


def curve(rows: list[dict], every: int, t0: float | None) -> str:
    """Mean exact match (or reward) and tool-call rate over ``every`` steps, and the minutes at each range's end;
    then each evaluation's exact match (--eval_data: a row of its own for --eval_at_start's step 0)."""
    evals = [r for r in rows if "eval/exact_match" in r]
    rows = [r for r in rows if "reward/mean" in r]
    if not rows:
        return "no training step logged"
    score = "reward/exact_match" if "reward/exact_match" in rows[0] else "reward/mean"
    rate = next((k for k in ("tools/rate", "search/rate") if k in rows[0]), None)
    lines = [f"{'steps':>9} {'minutes':>8} {score.split('/')[-1]:>11}" + (f" {rate:>11}" if rate else "")]
    for lo in range(0, len(rows), every):
        part = rows[lo:lo + every]
        mins = f"{(part[-1]['time'] - t0) / 60:8.1f}" if t0 is not None and "time" in part[-1] else f"{'-':>8}"
        line = f"{lo + 1:>4}-{lo + len(part):<4} {mins} {sum(r[score] for r in part) / len(part):11.3f}"
        if rate:
            line += f" {sum(r[rate] for r in part) / len(part):11.3f}"
        lines.append(line)
    lines += [f"eval after step {r['step']}: exact match {r['eval/exact_match']:.3f}, greedy "
              f"{r.get('eval/greedy_exact_match', float('nan')):.3f}" for r in evals]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("preset")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--every", type=int, default=10, help="steps per line of the curve")
    p.add_argument("--compare", type=Path, default=None, help="an earlier run's metrics.jsonl: equal step by step?")
    p.add_argument("--keep", type=Path, default=None, help="keep the work directory (metrics, logs) here")
    args = p.parse_args(argv)
    from rlrun import presets as P
    from rlrun.trainer_command import flag_args

    work = Path(tempfile.mkdtemp(prefix=f"rlrun-{args.preset}-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    preset = P.load_preset(args.preset, P.preset_dirs())
    context = {"workdir": str(work), "reward_url": "", "retriever_url": "http://127.0.0.1:1/retrieve"}
    P.make_artifacts(P.missing_artifacts(preset, context))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)  # a private local Ray per run
    with contextlib.ExitStack() as stack:
        if "retriever_url" in preset.values:
            draft = P.build_config(preset, P.parse_sets(args.sets), context)
            corpus = Path(draft.prompt_data).parent / "corpus.jsonl"
            context["retriever_url"] = stack.enter_context(local_service(corpus, work)).url
        runs = []
        for k in range(args.runs):
            out = work / f"run{k + 1}"
            cfg = P.build_config(preset, P.parse_sets([f"save_path={out}", f"ckpt_path={out}/ckpt", *args.sets]),
                                 context)
            t0 = time.time()
            with open(work / f"run{k + 1}.log", "w") as log:
                done = subprocess.run([sys.executable, "-m", "trainer.train_ppo_ray", *flag_args(cfg)], cwd=PROJECT,
                                      env=env, stdout=log, stderr=subprocess.STDOUT)
            secs = time.time() - t0
            if done.returncode != 0:
                print(f"run {k + 1}: exit {done.returncode}; log: {work}/run{k + 1}.log\n"
                      + (work / f"run{k + 1}.log").read_text()[-3000:])
                return 1
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
            runs.append(rows)
            print(f"run {k + 1}: {len(rows)} steps in {secs / 60:.1f} min (load average now "
                  f"{os.getloadavg()[0]:.1f}); metrics {out}/metrics.jsonl\n{curve(rows, args.every, t0)}", flush=True)
    status = 0
    for k in range(1, len(runs)):
        diff = first_difference(runs[0], runs[k]) or first_difference(runs[k], runs[0])
        print(f"run {k + 1} against run 1: " + ("equal step by step" if diff is None else f"DIFFERENT: {diff}"))
        status |= diff is not None
    if args.compare is not None:
        old = [json.loads(line) for line in args.compare.read_text().splitlines() if line.strip()]
        old = old[:len(runs[0])] if len(old) > len(runs[0]) else old
        diff = first_difference(old, runs[0])
        added = added_keys(old, runs[0])
        print(f"run 1 against {args.compare}: " + ("equal step by step, every metric it logged" if diff is None
                                                  else f"DIFFERENT: {diff}")
              + (f"; metrics it did not log: {', '.join(added)}" if added else ""))
        status |= diff is not None
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
