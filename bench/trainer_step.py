"""Per-phase timings and iterations/s of the RL step, for any placement, on whatever device is present.

Runs the real entry point (``python -m trainer.train_ppo_ray``, a private local Ray) on a tiny
random-init model (or ``--model DIR``) once per variant in the same run and prints the median of each
phase over the steps after the first (start-up and compilation land in step 1):

- ``hf``: the baseline, HF ``generate`` on its own actor + safetensors-bytes sync through Ray;
- ``vllm``: split placement: a vLLM engine on its own (GPU), weights by bucketed broadcast (NCCL; gloo
  without GPUs);
- ``colocated``: policy, reference and the vLLM engine on the same GPU(s) (``--colocate_all_models``,
  sleep on GPUs), weights in place (CUDA IPC; /dev/shm without GPUs).

    python bench/trainer_step.py [--variants hf,vllm,colocated] [--steps 12] [--hidden-size 256] [--layers 2]
                                 [--samples 64] [--gpus-per-group 1] [--model DIR --data FILE]
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
PHASES = ("generate", "sleep", "make_experience", "train", "sync")


def run_variant(name: str, work: Path, args: argparse.Namespace) -> dict[str, float]:
    out = work / name
    prompts = args.samples // args.n
    flags = ["--pretrain", str(work / "model"), "--prompt_data", str(work / "data.jsonl"), "--input_key", "message",
             "--label_key", "answer", "--apply_chat_template", "--reward_fn", "math_verify",
             "--actor_num_nodes", "1", "--actor_num_gpus_per_node", str(args.gpus_per_group), "--ref_num_nodes", "1",
             "--ref_num_gpus_per_node", str(args.gpus_per_group), "--advantage_estimator", "rloo",
             "--n_samples_per_prompt", str(args.n),
             "--rollout_batch_size", str(prompts), "--micro_rollout_batch_size", str(prompts),
             "--train_batch_size", str(args.samples), "--micro_train_batch_size", str(args.samples),
             "--generate_max_len", str(args.gen_len), "--prompt_max_len", "64", "--num_episodes", "1",
             "--max_samples", str(prompts * args.steps), "--zero_stage", "3", "--actor_learning_rate", "1e-4",
             "--init_kl_coef", "0.01", "--save_path", str(out), "--logging_steps", "1"]
    if name == "vllm":
        flags += ["--rollout_backend", "vllm", "--vllm_num_engines", "1", "--vllm_tensor_parallel_size", "1",
                  "--enable_prefix_caching", "--vllm_sync_backend", "nccl"]
    elif name == "colocated":  # engines x TP = actor GPUs
        flags += ["--rollout_backend", "vllm", "--vllm_num_engines", str(args.gpus_per_group),
                  "--vllm_tensor_parallel_size", "1", "--colocate_all_models", "--vllm_enable_sleep",
                  "--vllm_gpu_memory_utilization", "0.5"]
    else:
        flags += ["--rollout_backend", "hf"]
    if args.bf16:
        flags.append("--bf16")
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
    result = {p: statistics.median(r.get(f"timing/{p}", 0.0) for r in rows) for p in PHASES}
    result["step"] = statistics.median(sum(r.get(f"timing/{p}", 0.0) for p in PHASES) for r in rows)
    result["reward"] = statistics.mean(r["reward/mean"] for r in rows)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="hf,vllm,colocated")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--hidden-size", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--samples", type=int, default=64, help="samples per step (rollout x n)")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--gpus-per-group", type=int, default=1, help="policy and reference ranks (GPUs, or CPU ranks)")
    ap.add_argument("--model", help="an HF model directory instead of the tiny one (e.g. bench/gpu/model.py's)")
    ap.add_argument("--data", help="with --model: its prompts (trainer.tiny dataset format)")
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args()
    from trainer.tiny import make_math_dataset, make_model

    variants = args.variants.split(",")
    work = Path(tempfile.mkdtemp(prefix="rlrun-bench-"))
    try:
        if args.model:
            (work / "model").symlink_to(Path(args.model).resolve())
            (work / "data.jsonl").symlink_to(Path(args.data).resolve())
        else:
            make_model(work / "model", hidden_size=args.hidden_size, num_layers=args.layers,
                       num_heads=args.hidden_size // 64)
            make_math_dataset(work / "data.jsonl", n=(args.samples // args.n) * args.steps, kind="add")
        results = {name: run_variant(name, work, args) for name in variants}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    what = args.model or f"tiny Llama hidden {args.hidden_size} x {args.layers} layers"
    print(f"trainer step, {what}, {args.samples} samples x <= {args.gen_len} new tokens per step, "
          f"medians of steps 2..{args.steps}")
    base = variants[0]
    print(f"{'phase (s)':<18}" + "".join(f"{v:>12}" for v in variants) + f"   (x: {base} / variant)")
    for key in (*PHASES, "step"):
        row = "".join(f"{results[v][key]:>12.3f}" for v in variants)
        ratios = " ".join(f"{results[base][key] / results[v][key]:.2f}x" if results[v][key] else "-"
                          for v in variants[1:])
        print(f"{key:<18}{row}   {ratios}")
    for name in variants:
        print(f"{name}: {1 / results[name]['step']:.2f} iterations/s, {args.samples / results[name]['step']:.1f} "
              f"samples/s")


if __name__ == "__main__":
    main()
