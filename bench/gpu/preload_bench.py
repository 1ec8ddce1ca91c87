"""One vLLM engine's start through the Ray executor, with and without its TP workers preloaded
(``--vllm_preload_workers``, trainer/rollout/worker_preload.py), at TP 1 on one GPU or TP 2 on two.

An engine of TP > 1 runs vLLM's Ray executor, whose workers' processes start, and import vLLM, only once the
engine's own process has imported vLLM and built its configuration. With the flag, the engine's process starts
them first, and they import vLLM while it does. vLLM's Ray executor starts a worker for TP 1 too when it is
asked for (``distributed_executor_backend="ray"``), so what a worker's start costs an engine, and what the
preload takes off it, shows on one GPU; TP 2 adds NCCL and the custom all-reduce between the workers.

Every run is a process of its own with a local Ray of its own: a placement group of one bundle
({GPU: 1, CPU: 2}) per TP rank, the engine's actor on the first without a GPU (as a colocated engine of TP > 1
is), each worker asking the whole GPU of its bundle. The engine then generates once and sleeps and wakes (calls that reach the
worker through vLLM's message queues). A first run, not counted, fills vLLM's, Inductor's and Triton's caches
and the page cache; after it, the runs alternate (``plain``, ``preload``, ...), so that both kinds run on the
same warm caches. Prints each run's marks (seconds after the engine's process began) and the ratio of the
medians of the engine's start (its process began to ready), preload against plain, measured in this run:

  python bench/gpu/preload_bench.py --shape 0.5b --out /tmp/preload          # on one GPU
  python bench/gpu/preload_bench.py --shape 7b --tp 2 --out /tmp/preload2   # on two
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "gpu")]

PROMPTS = [f"copy {1000 + 37 * i}=" for i in range(32)]


def engine_run(args: argparse.Namespace) -> int:
    """One engine's start in a Ray of this process; its figures as JSON in ``args.result``."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from trainer.rollout.vllm_engine import VllmEngine

    began = time.time()
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a private throwaway cluster
    ray.init(num_cpus=2 * args.tp + 2, num_gpus=args.tp, include_dashboard=False, _node_ip_address="127.0.0.1")
    pg = placement_group([{"GPU": 1, "CPU": 2}] * args.tp, strategy="STRICT_PACK")
    ray.get(pg.ready(), timeout=120)
    engine = ray.remote(VllmEngine).options(
        num_cpus=1, num_gpus=0, runtime_env={"env_vars": {
            "VLLM_RAY_BUNDLE_INDICES": ",".join(map(str, range(args.tp))), "VLLM_RAY_PER_WORKER_GPUS": "1"}},
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0,
                                                             placement_group_capture_child_tasks=True),
    ).remote(args.model, tensor_parallel_size=args.tp, distributed_executor_backend="ray", preload_workers=args.preload,
             load_format="dummy", dtype="bfloat16", seed=0, in_process=True, gpu_memory_utilization=0.3,
             enable_sleep=True, compile_mode="none", max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
             compilation_config={"max_cudagraph_capture_size": args.max_num_seqs})
    ray.get(engine.ready.remote(), timeout=args.timeout)
    marks = ray.get(engine.startup.remote())
    t = time.time()
    samples = ray.get(engine.generate.remote(PROMPTS, n=4, max_new_tokens=64, seed=1), timeout=300)
    generate_s = time.time() - t
    ray.get(engine.sleep.remote(), timeout=120)
    ray.get(engine.wake_up.remote(), timeout=120)
    again = ray.get(engine.generate.remote(PROMPTS[:4], n=1, max_new_tokens=8, seed=2), timeout=300)
    result = {"marks": {k: v - marks["process"] for k, v in marks.items()}, "driver_to_engine_process":
              marks["process"] - began, "generate_s": generate_s, "samples": len(samples),
              "after_wake": len(again), "tokens": sum(len(s.response_token_ids) for s in samples)}
    Path(args.result).write_text(json.dumps(result))
    ray.get(engine.shutdown.remote(), timeout=120)
    ray.shutdown()
    return 0


def run_engine(out: Path, name: str, preload: bool, args: argparse.Namespace, model: Path) -> dict:
    """One engine's run (:func:`engine_run`) on the caches every run shares (warm after the first)."""
    from prewarm_bench import run_child

    caches = {"VLLM_CACHE_ROOT": out / "cache" / "vllm", "TORCHINDUCTOR_CACHE_DIR": out / "cache" / "inductor",
              "TRITON_CACHE_DIR": out / "cache" / "triton"}
    argv = ["--model", str(model), "--max-model-len", str(args.max_model_len), "--max-num-seqs",
            str(args.max_num_seqs), "--timeout", str(args.timeout), "--tp", str(args.tp),
            *(["--preload"] if preload else [])]
    return run_child(__file__, out / name, caches, argv, args.timeout + 120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="0.5b", choices=["tiny", "0.5b", "7b"])
    p.add_argument("--out", default="/tmp/preload_bench")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--pairs", type=int, default=2, help="plain/preload pairs after the first run")
    p.add_argument("--tp", type=int, default=1, help="the engine's TP size: one GPU each")
    p.add_argument("--engine-run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--preload", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.engine_run:
        return engine_run(args)
    from prewarm_bench import make_model

    out = Path(args.out)
    model = make_model(out / "model", args.shape)
    runs = [("first", False)] + [(f"{kind}{i}", kind == "preload") for i in range(1, args.pairs + 1)
                                 for kind in ("plain", "preload")]
    rows: dict[str, dict] = {}
    for name, preload in runs:
        rows[name] = r = run_engine(out, name, preload, args, model)
        m = r["marks"]
        print(f"{name}: " + ", ".join(f"{k} {v:.1f}" for k, v in m.items() if k != "process")
              + f"; generate {r['generate_s']:.2f} s ({r['tokens']} tokens), after a sleep and wake "
              f"{r['after_wake']} samples", flush=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    ready = {kind: [rows[n]["marks"]["ready"] for n, pre in runs[1:] if pre == (kind == "preload")]
             for kind in ("plain", "preload")}
    med = {k: statistics.median(v) for k, v in ready.items()}
    print(f"\nengine start (its process began to ready), s: plain {ready['plain']} (median {med['plain']:.1f}), "
          f"preload {ready['preload']} (median {med['preload']:.1f}); preload/plain {med['preload'] / med['plain']:.2f}, "
          f"{med['plain'] - med['preload']:.1f} s less")
    return 0


if __name__ == "__main__":
    sys.exit(main())
