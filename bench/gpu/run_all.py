"""Every GPU measurement of docs/benchmarks.md in one go, within one device command's time.

Stages (``--stages``, in this order; each with its own time limit, skipped when the overall ``--deadline``
would not leave it enough time):

- ``env``: GPUs, links (``nvidia-smi topo -m``), package versions;
- ``model``: the Qwen2.5-0.5B-shaped random-init model (bench/gpu/model.py) and a toy prompt set;
- ``zero3``: bench/gpu/zero3_bench.py: ZeRO-3 train throughput/MFU and ZeRO-3 -> engine weight sync;
- ``wsync``: bench/weight_sync.py: raw / per-tensor / bucketed broadcast between two GPUs (no gather);
- ``samegpu``: can two processes on one GPU share an NCCL group (a colocated engine and trainer rank 0)?
- ``colocated`` / ``split``: ``python -m trainer.train_ppo_ray``, a few RLOO steps, HF rollout engine;
  colocated: policy and reference on both GPUs with a quarter GPU each and the engine beside them;
  split: policy on one GPU, the engine on the other (no reference model: a third GPU would be needed).
- ``nodes_up`` / ``colocated2n`` / ``split2n`` / ``nodes_down`` (4 GPUs): two Ray nodes of 2 GPUs each in
  network namespaces (bench/gpu/two_nodes.sh); colocated: policy and reference 2 nodes x 2 GPUs; split:
  policy on 2 GPUs, reference on 1, the engine on 1.

Writes ``OUT/summary.json`` (figures, commands, exit codes) and ``OUT/logs.tgz``; prints a summary last.

    python bench/gpu/run_all.py --out "$OUT" [--stages env,model,zero3,...] [--deadline 540]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEAK_BF16 = 989e12
STAGES = ["env", "model", "zero3", "wsync", "samegpu", "colocated", "split", "nodes_up", "colocated2n", "split2n",
          "nodes_down"]
# Seconds each stage is allowed (and needs, for the deadline check).
LIMITS = {"env": 60, "model": 120, "data": 60, "zero3": 200, "wsync": 120, "samegpu": 90, "colocated": 200,
          "split": 180, "nodes_up": 90, "colocated2n": 240, "split2n": 180, "nodes_down": 30}
NEED = {"env": 10, "model": 40, "zero3": 90, "wsync": 40, "samegpu": 20, "colocated": 120, "split": 100,
        "nodes_up": 20, "colocated2n": 120, "split2n": 100, "nodes_down": 0}


def loop_flags(work: Path, name: str, placement: str, steps: int, gen_len: int, gpus: int,
               nodes: int = 1) -> list[str]:
    """The trainer's flags for one benchmark run (RLOO, HF rollouts, bf16 ZeRO-3)."""
    rollout = 16  # prompts per step, x4 samples = 64 sequences
    flags = ["--pretrain", str(work / "model"), "--prompt_data", str(work / "data.jsonl"), "--input_key", "message",
             "--label_key", "answer", "--apply_chat_template", "--reward_fn", "bench.gpu.rewards:digit_share",
             "--rollout_backend", "hf", "--advantage_estimator", "rloo", "--n_samples_per_prompt", "4",
             "--rollout_batch_size", str(rollout), "--micro_rollout_batch_size", "16", "--train_batch_size", "64",
             "--micro_train_batch_size", "8", "--generate_max_len", str(gen_len), "--prompt_max_len", "128",
             "--num_episodes", "1", "--max_samples", str(rollout * steps), "--zero_stage", "3", "--bf16",
             "--actor_learning_rate", "1e-6", "--temperature", "1.0", "--seed", "1",
             "--save_path", str(work / name), "--ckpt_path", str(work / name / "ckpt")]
    if placement == "colocated":
        per_node = str(gpus // nodes)
        flags += ["--colocate_all_models", "--actor_num_nodes", str(nodes), "--actor_num_gpus_per_node", per_node,
                  "--ref_num_nodes", str(nodes), "--ref_num_gpus_per_node", per_node, "--init_kl_coef", "0.01"]
    elif placement == "split" and gpus >= 4:  # policy on half the GPUs, reference on one, the engine on one
        flags += ["--actor_num_nodes", "1", "--actor_num_gpus_per_node", str(gpus - 2), "--ref_num_nodes", "1",
                  "--ref_num_gpus_per_node", "1", "--init_kl_coef", "0.01"]
    elif placement == "split":  # policy on gpus-1 GPUs, the engine on the last one, no reference model
        flags += ["--actor_num_nodes", "1", "--actor_num_gpus_per_node", str(gpus - 1), "--init_kl_coef", "0"]
    else:
        raise ValueError(placement)
    return flags


def _is_phase(key: str) -> bool:
    """A phase's own timing (timing/generate, ...): not the step's total, nor a part inside a phase
    (timing/forward/<model>, within make_experience)."""
    return key.startswith("timing/") and key != "timing/step" and key.count("/") == 1


def loop_figures(metrics_path: Path, actor_world: int, n_params: int) -> dict:
    """Per-phase medians over the steps after the first, and train throughput from the loop's own counts."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    if not rows:
        return {"error": "no metrics rows"}
    steady = rows[1:] or rows
    out: dict = {"steps": len(rows), "first_step": {k: rows[0][k] for k in rows[0] if k.startswith("timing/")}}
    for key in sorted({k for r in steady for k in r if k.startswith("timing/")}):
        out[key] = statistics.median(r[key] for r in steady)
    out["step_s"] = statistics.median(sum(v for k, v in r.items() if _is_phase(k)) for r in steady)
    for key in ("tokens/real", "tokens/padded", "response_length/mean", "reward/mean", "kl/mean", "loss/policy"):
        if key in steady[0]:
            out[key] = statistics.median(r[key] for r in steady)
    if "tokens/padded" in out and out.get("timing/train"):
        per_gpu = out["tokens/padded"] / out["timing/train"] / actor_world
        out["train_tokens_per_s_per_gpu"] = per_gpu
        out["train_real_tokens_per_s_per_gpu"] = out["tokens/real"] / out["timing/train"] / actor_world
        out["train_mfu"] = 6 * n_params * per_gpu / PEAK_BF16
        out["generate_tokens_per_s"] = out["response_length/mean"] * 64 / out["timing/generate"]
    return out


class Runner:
    def __init__(self, out: Path, work: Path, deadline: float):
        self.out = out
        self.logs = work / "logs"  # $OUT takes at most 8 files: the logs come back as one tarball
        self.logs.mkdir(parents=True, exist_ok=True)
        self.end = time.monotonic() + deadline
        self.summary: dict = {"stages": {}}

    def left(self) -> float:
        return self.end - time.monotonic()

    def run(self, stage: str, cmd: list[str], env: dict | None = None, limit: float | None = None) -> int | None:
        limit = limit or LIMITS[stage]
        if stage != "nodes_down":  # the teardown (and its NCCL log grep) runs even past the deadline
            limit = min(limit, self.left())
        log = self.logs / f"{stage}.log"
        t0 = time.monotonic()
        print(f"== {stage}: {shlex.join(cmd)} (limit {limit:.0f} s)", flush=True)
        with log.open("a") as fh:
            fh.write(f"$ {shlex.join(cmd)}\n")
            fh.flush()
            proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=fh,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code: int | None = proc.wait(timeout=max(limit, 1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)  # the stage's own process group (we started it)
                proc.wait()
                code = None
        took = time.monotonic() - t0
        self.summary["stages"].setdefault(stage, {}).update(
            {"command": shlex.join(cmd), "exit": code, "seconds": round(took, 1)})
        print(f"   {stage}: exit {code} in {took:.0f} s; log tail:", flush=True)
        print("   " + "\n   ".join(log.read_text().splitlines()[-6:]), flush=True)
        self.save()
        return code

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    p.add_argument("--work", default="/tmp/rl7")
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--deadline", type=float, default=540, help="seconds for all stages together")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--steps", type=int, default=4, help="RL steps per loop run")
    p.add_argument("--gen-len", type=int, default=256)
    p.add_argument("--train-shapes", default="8x1024,16x1024,32x1024")
    p.add_argument("--model-args", default="", help="extra bench/gpu/model.py flags (smaller models for a smoke run)")
    p.add_argument("--receiver-gpu", default=None, help="zero3 receiver GPU (default: the last); 'cpu' on CPU")
    p.add_argument("--zero3-gpus", default=None, help="zero3 trainer GPUs, e.g. 0,1 (default: all)")
    p.add_argument("--ag-bucket-mb", default="", help="zero3: more bucket sizes for the all-gather push")
    args = p.parse_args(argv)
    out, work = Path(args.out), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    r = Runner(out, work, args.deadline)
    prev = out / "summary.json"
    if prev.exists():
        r.summary = json.loads(prev.read_text())
    py = sys.executable
    stages = [s for s in args.stages.split(",") if s]
    unknown = set(stages) - set(STAGES)
    if unknown:
        p.error(f"unknown stages {sorted(unknown)}; expected some of {STAGES}")
    for stage in stages:
        if r.left() < NEED[stage]:
            print(f"== {stage}: skipped, {r.left():.0f} s left < {NEED[stage]} s needed", flush=True)
            r.summary["stages"][stage] = {"skipped": f"{r.left():.0f} s left"}
            continue
        if stage == "env":
            script = ("nvidia-smi; nvidia-smi topo -m; nproc; free -g; python3 -c 'import torch, ray, deepspeed, "
                      "transformers; print(\"torch\", torch.__version__, \"nccl\", torch.cuda.nccl.version(), "
                      "\"ray\", ray.__version__, \"deepspeed\", deepspeed.__version__, \"transformers\", "
                      "transformers.__version__, \"gpus\", torch.cuda.device_count())'")
            r.run(stage, ["bash", "-c", script])
        elif stage == "model":
            if not (work / "model" / "config.json").exists():
                r.run(stage, [py, "bench/gpu/model.py", str(work / "model"), *shlex.split(args.model_args)])
            r.run("data", [py, "-m", "trainer.tiny", "dataset", str(work / "data.jsonl"), "--n", "256",
                          "--kind", "copy"])
        elif stage == "zero3":
            gpus = args.zero3_gpus or ",".join(str(i) for i in range(args.gpus))
            recv = args.receiver_gpu or gpus.split(",")[-1]
            code = r.run(stage, [py, "bench/gpu/zero3_bench.py", "--model", str(work / "model"), "--gpus", gpus,
                                 "--receiver-gpu", recv, "--train-shapes", args.train_shapes,
                                 "--ag-bucket-mb", args.ag_bucket_mb,
                                 "--json", str(out / "zero3.json"), "--logs", str(r.logs / "zero3")],
                         env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"})
            if code == 0:
                r.summary["zero3"] = json.loads((out / "zero3.json").read_text())
                via = set()
                for log in (r.logs / "zero3").glob("*.log"):
                    via |= {line.split("NCCL INFO", 1)[-1].strip() for line in log.read_text().splitlines()
                            if " via " in line}
                r.summary["zero3"]["nccl_via"] = sorted(via)[:20]
        elif stage == "wsync":
            code = r.run(stage, [py, "bench/weight_sync.py", "--json", str(out / "wsync.json")])
            if code == 0:
                r.summary["wsync"] = json.loads((out / "wsync.json").read_text())["figures"]
        elif stage == "samegpu":
            code = r.run(stage, [py, "bench/gpu/zero3_bench.py", "same-gpu", "--logs", str(r.logs / "samegpu")])
            r.summary["samegpu"] = {"ok": code == 0, "log": [
                line for f in sorted((r.logs / "samegpu").glob("*.log")) for line in f.read_text().splitlines()
                if "same-gpu" in line or "Error" in line or "WARN" in line][:10]}
        elif stage in ("nodes_up", "nodes_down"):
            code = r.run(stage, ["bash", "bench/gpu/two_nodes.sh", stage[6:], str(r.logs)])
            nccl = r.logs / "nccl_two_nodes.txt"
            if stage == "nodes_down" and nccl.exists():
                r.summary["nccl_two_nodes"] = nccl.read_text().splitlines()[:40]
        else:  # colocated / split, on one node or (2n) on the two of nodes_up
            two = stage.endswith("2n")
            placement = stage.removesuffix("2n")
            flags = loop_flags(work, stage, placement, args.steps, args.gen_len, args.gpus, 2 if two else 1)
            prefix = ["bash", "bench/gpu/two_nodes.sh", "exec"] if two else []
            env = {"RAY_memory_monitor_refresh_ms": "0"} if two else {
                "NCCL_DEBUG": "WARN", "RAY_memory_monitor_refresh_ms": "0"}
            code = r.run(stage, [*prefix, py, "-m", "trainer.train_ppo_ray", *flags], env=env)
            metrics = work / stage / "metrics.jsonl"
            if metrics.exists():
                (r.logs / f"{stage}_metrics.jsonl").write_text(metrics.read_text())
                params = json.loads((work / "model" / "params.json").read_text())["params"]
                if placement == "colocated":
                    world = args.gpus
                else:
                    world = args.gpus - 2 if args.gpus >= 4 else args.gpus - 1
                r.summary[stage] = loop_figures(metrics, world, params)
        r.save()
    with tarfile.open(out / "logs.tgz", "w:gz") as tar:
        tar.add(r.logs, arcname="logs")
    print(json.dumps({k: v for k, v in r.summary.items() if k != "stages"}, indent=1)[:6000])
    print(json.dumps(r.summary["stages"], indent=1)[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
