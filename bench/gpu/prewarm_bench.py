"""One engine's start on a cold Triton cache, with and without the kernel prewarm (``--vllm_prewarm_kernels``,
trainer/rollout/kernel_prewarm.py), each run in a process of its own with caches of its own:

  cold         the engine alone: it compiles its model runner's and sampler's Triton kernels at the end of its
               start (the baseline)
  child_first  the prewarm's child run to its end first, then the engine on the cache it filled: the most the
               prewarm can save, and how many kernels the engine still had to compile (the child's misses)
  beside       the engine with its prewarm beside it, as a job runs it: what it saves when both start at once
  warm         the engine again on cold's cache (every kernel there): the floor

Prints each run's seconds (process start to ready, its first and second generate), the Triton cache entries the
engine made itself, the prewarm's outcome, and the ratios against cold measured in the same run. The model is a
config and tokenizer only (``load_format="dummy"``: random weights made by vLLM), of a Qwen2 shape:

  python bench/gpu/prewarm_bench.py --shape 7b --out /tmp/prewarm    # on one GPU
  python bench/gpu/prewarm_bench.py --shape tiny --out /tmp/prewarm  # the mechanics on the CPU build
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "gpu")]

PROMPTS = [f"copy {1000 + 37 * i}=" for i in range(32)]


def make_model(out: Path, shape: str) -> Path:
    """config.json and the padded char tokenizer of ``shape`` (no weights)."""
    from model import QWEN25_7B, SHAPES, write_config

    tiny = {**QWEN25_7B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 1024}
    write_config(out, tiny if shape == "tiny" else SHAPES[shape][0], tied=False)
    return out


def engine_run(args: argparse.Namespace) -> int:
    """One engine's start and two generates in this process; its figures as JSON in ``args.result``."""
    import torch

    from trainer.rollout.vllm_engine import VllmEngine

    on_gpu = torch.cuda.is_available()
    sampling = {"n": 4, "temperature": 1.0, "top_p": 1.0}
    kwargs = dict(tensor_parallel_size=1, dtype="bfloat16" if on_gpu else "float32", seed=0, in_process=True,
                  load_format="dummy", max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                  prewarm_sampling=sampling if args.prewarm else None)
    if on_gpu:
        kwargs.update(gpu_memory_utilization=0.3, enable_sleep=True, compile_mode="none",
                      compilation_config={"max_cudagraph_capture_size": args.max_num_seqs})
    else:
        kwargs.update(kv_cache_memory_bytes=64 << 20)
    engine = VllmEngine(args.model, **kwargs)
    marks = engine.startup_marks.get()
    gens = []
    for seed in (1, 2):
        t = time.time()
        engine.generate(PROMPTS, max_new_tokens=64, seed=seed, **{k: sampling[k] for k in ("n", "temperature", "top_p")})
        gens.append(time.time() - t)
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    cache.mkdir(parents=True, exist_ok=True)  # the CPU build compiles no Triton kernel: none made it
    result = {"marks": {k: v - marks["process"] for k, v in marks.items()}, "generate_s": gens,
              "prewarm": engine.prewarm_outcome, "entries": sorted(p.name for p in cache.iterdir() if p.is_dir())}
    Path(args.result).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # no orderly vLLM shutdown needed: the GPU's memory goes with the process


def run_child(script: str, run_dir: Path, caches: dict[str, Path], argv: list[str], timeout: float) -> dict:
    """``script --engine-run --result run_dir/result.json ARGV`` in a process of its own, with ``caches`` (vLLM's,
    Inductor's and Triton's cache variables) and this checkout on its path; its log in ``run_dir/engine.log``,
    its result read back (a failed run ends the bench, naming the log)."""
    env = {**os.environ, **{k: str(v) for k, v in caches.items()},
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = run_dir / "result.json"
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "engine.log", "w") as log:
        rc = subprocess.run([sys.executable, script, "--engine-run", "--result", str(result), *argv], env=env,
                            stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
    if rc != 0 or not result.exists():
        raise SystemExit(f"{Path(script).stem}: the {run_dir.name} run failed (exit {rc}); see {run_dir / 'engine.log'}")
    return json.loads(result.read_text())


def run_engine(model: Path, out: Path, name: str, cache: Path, prewarm: bool, args: argparse.Namespace) -> dict:
    """One engine's run (:func:`engine_run`) on the Triton cache ``cache``, with vLLM's and Inductor's its own."""
    caches = {"TRITON_CACHE_DIR": cache, "VLLM_CACHE_ROOT": out / name / "vllm",
              "TORCHINDUCTOR_CACHE_DIR": out / name / "inductor"}
    argv = ["--model", str(model), "--max-model-len", str(args.max_model_len), "--max-num-seqs",
            str(args.max_num_seqs), *(["--prewarm"] if prewarm else [])]
    return run_child(__file__, out / name, caches, argv, args.timeout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="7b", choices=["tiny", "0.5b", "7b", "32b"])
    p.add_argument("--out", default="/tmp/prewarm_bench")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--timeout", type=float, default=400)
    p.add_argument("--runs", default="cold,child_first,beside,warm")
    p.add_argument("--engine-run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--prewarm", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.engine_run:
        return engine_run(args)
    from trainer.rollout import kernel_prewarm

    out = Path(args.out)
    model = make_model(out / "model", args.shape)
    rows: dict[str, dict] = {}
    runs = args.runs.split(",")
    for name in runs:
        cache = out / ("cold" if name == "warm" else name) / "triton"
        before: set[str] = set()
        if name == "child_first":
            import torch

            dtype = "bfloat16" if torch.cuda.is_available() else "float32"
            spec = kernel_prewarm.engine_spec(model, dtype, {"max_model_len": args.max_model_len, "max_num_seqs":
                                                             args.max_num_seqs}, False, 0,
                                              {"n": 4, "temperature": 1.0, "top_p": 1.0})
            child = kernel_prewarm.start(spec, {**os.environ, "TRITON_CACHE_DIR": str(cache)})
            if child is None:
                raise SystemExit("prewarm_bench: the prewarm's child did not start (see the warning above)")
            child.wait(args.timeout)  # its report: it then holds its memory until finish() stops it
            rows["child"] = {"prewarm": child.finish()}
            print(f"child alone: {rows['child']['prewarm']}", flush=True)
            before = {q.name for q in cache.iterdir() if q.is_dir()}
        elif name == "warm":
            before = set(rows["cold"]["entries"]) if "cold" in rows else set()
        rows[name] = run_engine(model, out, name, cache, name in ("child_first", "beside"), args)
        rows[name]["made"] = len(set(rows[name]["entries"]) - before)
        m = rows[name]["marks"]
        print(f"{name}: ready {m['ready']:.1f} s after its process began (imported {m.get('imported', 0):.1f}); "
              f"generate {rows[name]['generate_s'][0]:.2f} / {rows[name]['generate_s'][1]:.2f} s; Triton cache "
              f"entries it made {rows[name]['made']} of {len(rows[name]['entries'])}; prewarm "
              f"{rows[name]['prewarm']}", flush=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    if "cold" in rows:
        base = rows["cold"]["marks"]["ready"]
        print(f"\n{'run':<12} {'ready s':>8} {'vs cold':>8} {'1st gen s':>10} {'kernels made':>13}")
        for name in runs:
            r = rows[name]
            print(f"{name:<12} {r['marks']['ready']:>8.1f} {r['marks']['ready'] / base:>8.2f} "
                  f"{r['generate_s'][0]:>10.2f} {r['made']:>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
