"""On a GPU machine: engine faults in a real training job with vLLM engines on GPUs of their own and the NCCL
weight broadcast (issue 31), the GPU twin of tests/integration/test_resilience.py.

A tiny RLOO job (policy + reference sharing GPU 0, ``--engines`` vLLM engines of TP 1 on GPUs 1..N, bf16, eager)
runs 6 steps on a private local Ray. After step 1 the last engine's process is killed (SIGKILL: the next call on
it is step 2's generate); after step 3 it is frozen (SIGSTOP, ``--generate_timeout 60``: step 4's generate
misses its deadline). Checks, each printed OK or FAILED (exit 1 on any failure):

1. the job succeeds with 6 steps and ``engines/restarts`` 2;
2. both faults were replaced, and the NCCL broadcast group formed again after each (policy rank 0 and the
   surviving engines abort the old group);
3. every step has its 16 samples;
4. the replaced engine's process is gone (vLLM's engine core process too: its GPU memory came back, or the
   replacement could not have started).

    PYTHONPATH=/tmp/site:. python3 bench/gpu/chaos.py [--engines 2] [--out /tmp/chaos]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer.procs import alive

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--out", default="/tmp/chaos")
    args = parser.parse_args()
    from trainer.tiny import make_math_dataset, make_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "model").exists():
        make_model(out / "model")
    make_math_dataset(out / "data.jsonl", n=16, kind="copy")
    label = "vLLM engine (TP 1) " + str(args.engines - 1)
    flags = ["--pretrain", str(out / "model"), "--prompt_data", str(out / "data.jsonl"), "--input_key", "message",
             "--label_key", "answer", "--apply_chat_template", "--reward_fn", "tests.integration.loop_rewards:has_one",
             "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1", "--ref_num_nodes", "1",
             "--ref_num_gpus_per_node", "1", "--colocate_actor_ref", "--vllm_num_engines", str(args.engines),
             "--vllm_tensor_parallel_size", "1", "--enforce_eager", "--bf16", "--vllm_gpu_memory_utilization", "0.5",
             "--advantage_estimator", "rloo", "--n_samples_per_prompt", "4", "--rollout_batch_size", "4",
             "--micro_rollout_batch_size", "4", "--train_batch_size", "16", "--micro_train_batch_size", "4",
             "--generate_max_len", "32", "--prompt_max_len", "64", "--num_episodes", "3", "--max_samples", "8",
             "--zero_stage", "3", "--actor_learning_rate", "1e-4", "--generate_timeout", "60",
             "--save_path", str(out / "run"), "--ckpt_path", str(out / "run" / "ckpt")]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a private Ray of the job's own
    proc = subprocess.Popen([sys.executable, "-m", "trainer.train_ppo_ray", *flags], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: list[str] = []
    faults: list[tuple[int, str, int]] = []
    started = time.monotonic()

    def pid_of(text: str) -> int:
        return int(re.findall(rf"{re.escape(label)} on node \S+ \(pid (\d+)\)", text)[-1])

    def read() -> None:
        with open(out / "job.log", "w") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                lines.append(line.rstrip("\n"))
                m = re.match(r'^@metrics \{"step": (\d+),', line)
                if m and int(m.group(1)) in (1, 3):
                    sig = signal.SIGKILL if m.group(1) == "1" else signal.SIGSTOP
                    pid = pid_of("\n".join(lines))
                    os.kill(pid, sig)
                    faults.append((int(m.group(1)), sig.name, pid))
                    print(f"[{time.monotonic() - started:.0f} s] step {m.group(1)}: {sig.name} to {label} "
                          f"(pid {pid})", flush=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    code = proc.wait(timeout=1800)
    reader.join(timeout=30)
    text = "\n".join(lines)
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()] \
        if (out / "run" / "metrics.jsonl").exists() else []
    print(f"job exit {code} after {time.monotonic() - started:.0f} s; faults {faults}")
    for line in lines:
        if re.search(r"failed:|replaced:|re-forming|broadcast group of|ready:", line):
            print("  " + line[:300])
    for r in rows:
        print(f"  step {r['step']}: restarts {r.get('engines/restarts')} samples {r.get('rollout/samples')} "
              f"generate {r.get('timing/generate', 0):.2f} s sync {r.get('timing/sync', 0):.2f} s")
    checks = {
        "the job succeeded with 6 steps and engines/restarts 2":
            code == 0 and [r["step"] for r in rows] == list(range(1, 7)) and rows[-1]["engines/restarts"] == 2,
        "both faults replaced, the NCCL group formed again after each":
            text.count("replaced: ") == 2 and text.count("weight sync: re-forming the nccl group") == 2,
        "every step has its 16 samples": bool(rows) and all(r["rollout/samples"] == 16 for r in rows),
        "the faulted engines' processes are gone": all(not alive(pid) for _, _, pid in faults) and len(faults) == 2,
    }
    for what, ok in checks.items():
        print(f"{'OK' if ok else 'FAILED'}: {what}")
    if code != 0:
        print("\n".join(lines[-60:]))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
