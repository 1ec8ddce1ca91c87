"""Learning parity of --async_train on CPU (issue 30's target): tiny-rloo synchronous against tiny-rloo-async
(one-step-off, truncated IS), same task, model, warm-up, batches and seed, one after the other on a private
one-machine Ray, rewards from the local math-verify function (the presets' remote service swapped for it, so
the bench needs no cluster).

It prints each run's reward curve and the steps each took to first reach the target over a trailing window
(default: mean reward >= 0.85 over 16 steps); the async run passes when it gets there within 10 % more steps
than the synchronous run. Wall time per run is printed too: on 2 cores the engine and the trainer share the
CPUs, so overlap buys little time here (the GPU runs measure that).

    python bench/async_parity.py [--steps 128] [--target 0.85] [--window 16] [--set seed=7]
        [--async-set is_correction=icepop] [--sync-reached STEP]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))


def command(preset: str, workdir: Path, steps: int, metrics: Path, sets: list[str] = ()) -> list[str]:
    from rlrun import presets as P
    from rlrun.trainer_command import flag_args

    cfg = P.build_config(P.load_preset(preset, P.preset_dirs()),
                         P.parse_sets([f"max_steps={steps}", "reward_fn=math_verify", "remote_rm_url=", *sets]),
                         {"workdir": str(workdir), "reward_url": ""})
    return [sys.executable, "-m", "trainer.train_ppo_ray", *flag_args(cfg), "--metrics_path", str(metrics)]


def first_reaching(rewards: list[float], target: float, window: int) -> int | None:
    """The first step (1-based) at which the mean reward of the ``window`` steps ending there is >= target."""
    for end in range(window, len(rewards) + 1):
        if sum(rewards[end - window:end]) / window >= target:
            return end
    return None


def curve(rewards: list[float], points: int = 8) -> str:
    width = max(1, -(-len(rewards) // points))
    return " | ".join(f"{i + 1}-{min(i + width, len(rewards))}: {sum(rewards[i:i + width]) / len(rewards[i:i + width]):.2f}"
                      for i in range(0, len(rewards), width))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--out", default=None, help="a JSON summary here")
    p.add_argument("--async-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a flag of the async run only (e.g. is_correction=icepop), as rlrun's --set")
    p.add_argument("--set", dest="both_set", action="append", default=[], metavar="KEY=VALUE",
                   help="a flag of both runs (e.g. seed=7: the spread between seeds), as rlrun's --set")
    p.add_argument("--sync-reached", type=int, default=None,
                   help="the synchronous run's step (from an earlier run of this bench): skip that run")
    args = p.parse_args(argv)
    from rlrun import presets as P

    work = Path(tempfile.mkdtemp(prefix="rlrun-parity-"))
    todo = P.missing_artifacts(P.load_preset("tiny-rloo", P.preset_dirs()), {"workdir": str(work)})
    P.make_artifacts(todo)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)  # a private local Ray per run
    results = {}
    if args.sync_reached is not None:
        results["tiny-rloo"] = {"reached": args.sync_reached, "given": True}
    for preset in ("tiny-rloo", "tiny-rloo-async"):
        if preset in results:
            continue
        metrics = work / f"{preset}.jsonl"
        t0 = time.monotonic()
        sets = [*args.both_set, *(args.async_set if preset.endswith("async") else [])]
        done = subprocess.run(command(preset, work, args.steps, metrics, sets), cwd=PROJECT, env=env,
                              capture_output=True, text=True)
        secs = time.monotonic() - t0
        if done.returncode != 0:
            print(f"{preset}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
            return 1
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        rewards = [r["reward/mean"] for r in rows]
        reached = first_reaching(rewards, args.target, args.window)
        final = sum(rewards[-args.window:]) / min(args.window, len(rewards))
        stale = [r.get("async/staleness", 0.0) for r in rows]
        mismatch = [r.get("rollout/logprob_mismatch", 0.0) for r in rows]
        results[preset] = {"seconds": secs, "reached": reached, "final": final, "curve": curve(rewards),
                           "mean_staleness": sum(stale) / len(stale), "mean_mismatch": sum(mismatch) / len(mismatch)}
        print(f"{preset}: {len(rows)} steps in {secs:.0f} s; reward/mean >= {args.target} over {args.window} steps "
              f"first at step {reached}; last {args.window} steps {final:.3f}; staleness {results[preset]['mean_staleness']:.2f}, "
              f"logprob mismatch {results[preset]['mean_mismatch']:.4f}\n  {curve(rewards)}", flush=True)
    sync, asyn = results["tiny-rloo"]["reached"], results["tiny-rloo-async"]["reached"]
    ok = sync is not None and asyn is not None and asyn <= 1.1 * sync
    print(f"async reached the target at step {asyn} vs synchronous {sync}: "
          f"{'within' if ok else 'NOT within'} 10 % more steps")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0 if ok else 2


if __name__ == "__main__":
    raise SystemExit(main())
