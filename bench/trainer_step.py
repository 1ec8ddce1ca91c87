"""Per-phase timings and iterations/s of the RL step, on whatever device is present.

Runs the real entry point (``python -m trainer.train_ppo_ray``, a private local Ray) on a tiny
random-init model twice in the same run and prints the median of each phase over the steps after the
first (start-up and compilation land in step 1):

- ``vllm``: the production path, vLLM rollout engine + bucketed broadcast weight sync;
- ``hf``: the baseline, HF ``generate`` on the actor + safetensors-bytes sync through Ray.

    python bench/trainer_step.py [--steps 12] [--hidden-size 256] [--layers 2] [--samples 64]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
PHASES = ("generate", "make_experience", "train", "sync")


def run_variant(name: str, work: Path, args: argparse.Namespace) -> dict[str, float]:
    out = work / name
    prompts = args.samples // args.n
    flags = ["--pretrain", str(work / "model"), "--prompt_data", str(work / "data.jsonl"), "--input_key", "message",
             "--label_key", "answer", "--apply_chat_template", "--reward_fn", "math_verify",
             "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1", "--ref_num_nodes", "1",
             "--ref_num_gpus_per_node", "1", "--advantage_estimator", "rloo", "--n_samples_per_prompt", str(args.n),
             "--rollout_batch_size", str(prompts), "--micro_rollout_batch_size", str(prompts),
             "--train_batch_size", str(args.samples), "--micro_train_batch_size", str(args.samples),
             "--generate_max_len", str(args.gen_len), "--prompt_max_len", "64", "--num_episodes", "1",
             "--max_samples", str(prompts * args.steps), "--zero_stage", "3", "--actor_learning_rate", "1e-4",
             "--init_kl_coef", "0.01", "--save_path", str(out), "--logging_steps", "1"]
    if name == "vllm":
        flags += ["--rollout_backend", "vllm", "--vllm_num_engines", "1", "--vllm_tensor_parallel_size", "1",
                  "--enable_prefix_caching", "--vllm_sync_backend", "nccl"]
    else:
        flags += ["--rollout_backend", "hf"]
    ray_tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    try:
        done = subprocess.run([sys.executable, "-m", "trainer.train_ppo_ray", *flags], cwd=PROJECT, env=env,
                              capture_output=True, text=True, timeout=1800)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    if done.returncode != 0:
        sys.exit(f"{name}: the trainer failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    if not rows:
        sys.exit(f"{name}: no steps after the first; raise --steps")
    result = {p: statistics.median(r[f"timing/{p}"] for r in rows) for p in PHASES}
    result["step"] = statistics.median(sum(r[f"timing/{p}"] for p in PHASES) for r in rows)
    result["reward"] = statistics.mean(r["reward/mean"] for r in rows)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--hidden-size", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--samples", type=int, default=64, help="samples per step (rollout x n)")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--gen-len", type=int, default=32)
    args = ap.parse_args()
    from trainer.tiny import make_math_dataset, make_model

    work = Path(tempfile.mkdtemp(prefix="rlrun-bench-"))
    try:
        make_model(work / "model", hidden_size=args.hidden_size, num_layers=args.layers, num_heads=args.hidden_size // 64)
        make_math_dataset(work / "data.jsonl", n=(args.samples // args.n) * args.steps, kind="add")
        results = {name: run_variant(name, work, args) for name in ("hf", "vllm")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"trainer step, tiny Llama hidden {args.hidden_size} x {args.layers} layers, {args.samples} samples x "
          f"<= {args.gen_len} new tokens per step, medians of steps 2..{args.steps}")
    print(f"{'phase (s)':<18}{'hf (baseline)':>14}{'vllm':>10}{'speed-up':>10}")
    for key in (*PHASES, "step"):
        hf, vl = results["hf"][key], results["vllm"][key]
        print(f"{key:<18}{hf:>14.3f}{vl:>10.3f}{hf / vl if vl else float('inf'):>9.2f}x")
    for name in ("hf", "vllm"):
        print(f"{name}: {1 / results[name]['step']:.2f} iterations/s, "
              f"{args.samples / results[name]['step']:.1f} samples/s")


if __name__ == "__main__":
    main()
