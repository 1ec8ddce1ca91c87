"""The rollout engine on a GPU, against bare vLLM and HF generate on the same batch, in one run.

    python3 bench/gpu/vllm_bench.py all --model M --data D.jsonl [--out OUT] [--prompts 16 --n 4 --max-tokens 256]

Each variant runs in a process of its own (one GPU, nothing else on it), on the same prompts (``--data``'s
first ``--prompts`` messages through the model's chat template), ``--n`` samples each, ``--max-tokens`` new
tokens, temperature 1, ``--repeat`` timed calls after a warm-up:

- ``bare``: ``vllm.LLM(model)`` with vLLM's defaults and the same memory share, ``LLM.generate`` on text
  prompts: the baseline the engine wrapper is held to;
- ``engine``: :class:`trainer.rollout.vllm_engine.VllmEngine` as the trainer makes it (worker extension,
  sleep mode on), its ``generate`` (and ``engine.llm.generate`` on the same instance, which isolates the
  wrapper); then the colocated path: sleep level 2 (device memory before / after, against the bytes of its
  weights and KV cache), ``wake_up(["weights"])``, an in-place push of a perturbed copy of the weights from
  another process through CUDA IPC (:mod:`trainer.weights.shared`), its bytes checked against what vLLM
  computes with, the original pushed back and the greedy output checked equal to the first;
- ``hf``: :class:`trainer.rollout.hf_engine.HfEngine` (HF ``generate``), the fallback.

Prints one table (tokens/s, ratios from this run) and writes ``OUT/vllm_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from isolated import (  # run as a script: its own directory is on the path
    PROJECT,
    nvidia_smi_used_mib,
    run_isolated,
)

sys.path.insert(0, str(PROJECT))

GPU_ENV = {"VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_USE_FLASHINFER_SAMPLER": "0", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1", "TOKENIZERS_PARALLELISM": "false"}


def prompts(model: str, data: str, count: int) -> list[str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    rows = [json.loads(line) for line in Path(data).read_text().splitlines() if line.strip()][:count]
    return [tok.apply_chat_template(r["message"], tokenize=False, add_generation_prompt=True) for r in rows]


def timed(fn, repeat: int) -> tuple[float, list[float], object]:
    fn()  # warm-up: first-call allocations, sampler compilation
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def run_bare(args) -> dict:
    from vllm import LLM, SamplingParams

    texts = prompts(args.model, args.data, args.prompts)
    memory = {"gpu_memory_utilization": args.gpu_util} if on_gpu() else {"kv_cache_memory_bytes": 512 << 20}
    llm = LLM(model=args.model, dtype=args.dtype, seed=0, **memory)
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=1)
    med, times, outs = timed(lambda: llm.generate(texts, params, use_tqdm=False), args.repeat)
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return {"seconds": med, "all": times, "tokens": tokens, "tok_s": tokens / med}


def _fuse(tensors: dict) -> dict:
    """HF Qwen2/Llama names -> vLLM's fused ones (q/k/v -> qkv_proj, gate/up -> gate_up_proj), rows stacked."""
    import torch

    out = dict(tensors)
    for name in [n for n in tensors if ".q_proj." in n]:
        suffix = name.split(".q_proj.")[1]
        prefix = name.split(".q_proj.")[0]
        out[f"{prefix}.qkv_proj.{suffix}"] = torch.cat([out.pop(f"{prefix}.{x}_proj.{suffix}") for x in "qkv"])
    for name in [n for n in tensors if ".gate_proj." in n]:
        prefix, suffix = name.split(".gate_proj.")
        out[f"{prefix}.gate_up_proj.{suffix}"] = torch.cat(
            [out.pop(f"{prefix}.gate_proj.{suffix}"), out.pop(f"{prefix}.up_proj.{suffix}")])
    return out


def _sender(model: str, perturb: bool, bucket_mib: int, handles, acks) -> None:
    """Another process, as a colocated policy rank: the model on the GPU (CPU: /dev/shm), published bucket
    by bucket."""
    import torch
    from safetensors.torch import load_file

    from trainer.weights.buckets import iter_buckets
    from trainer.weights.shared import Publisher, kind_for

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tensors = {}
    for f in sorted(Path(model).glob("*.safetensors")):
        tensors.update(load_file(str(f), device=device))
    if perturb:
        g = torch.Generator(device=device).manual_seed(7)
        tensors = {k: (v.float() + 1e-2 * torch.randn(v.shape, generator=g, device=device)).to(v.dtype)
                   for k, v in tensors.items()}
    pub = Publisher(kind_for(torch.device(device)))
    for bucket in iter_buckets(tensors, bucket_mib << 20):
        handles.put(vars(pub.publish(bucket)))
        acks.get()  # loaded: keep going (GPU engines load each bucket when it arrives)
    handles.put(None)
    acks.get()
    if perturb:  # what the engine must now compute with, for the bit-exact check
        torch.save({k: v.cpu() for k, v in tensors.items()}, "/tmp/vllm_bench_pushed.pt")
    handles.put("saved")
    pub.release()


def push_in_place(engine, model: str, perturb: bool, bucket_mib: int) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    handles, acks = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_sender, args=(model, perturb, bucket_mib, handles, acks))
    proc.start()
    first = handles.get(timeout=300)  # the sender has loaded the model: time the push from here
    t0 = time.perf_counter()
    buckets = 0
    wire = first
    deferred = False
    while wire is not None:
        deferred = engine.load_shared_bucket(wire)
        buckets += 1
        acks.put("ok")  # a sender of deferred buckets keeps them all until "done" (the CPU build)
        wire = handles.get(timeout=300)
    loaded = engine.finish_weight_update()
    seconds = time.perf_counter() - t0
    acks.put("done")
    assert handles.get(timeout=300) == "saved"
    proc.join(120)
    return {"seconds": seconds, "buckets": buckets, "tensors": loaded, "exitcode": proc.exitcode, "deferred": deferred}


def run_engine(args) -> dict:
    import torch
    from vllm import SamplingParams

    from trainer.rollout.vllm_engine import VllmEngine

    texts = prompts(args.model, args.data, args.prompts)
    used0 = nvidia_smi_used_mib()
    t0 = time.perf_counter()
    engine = VllmEngine(args.model, gpu_memory_utilization=args.gpu_util, enable_sleep=on_gpu(), sleep_level=2,
                        dtype=args.dtype, seed=0)
    start_s = time.perf_counter() - t0
    used1 = nvidia_smi_used_mib()
    out = {"start_s": start_s, "smi_before_mib": used0, "smi_engine_mib": used1}

    med, times, samples = timed(lambda: engine.generate(texts, n=args.n, temperature=1.0,
                                                        max_new_tokens=args.max_tokens, seed=1, logprobs=False),
                                args.repeat)
    tokens = sum(len(s.response_token_ids) for s in samples)
    out["wrapper"] = {"seconds": med, "all": times, "tokens": tokens, "tok_s": tokens / med}
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=1)
    med, times, outs = timed(lambda: engine.llm.generate(texts, params, use_tqdm=False), args.repeat)
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    out["same_instance_bare"] = {"seconds": med, "all": times, "tokens": tokens, "tok_s": tokens / med}

    greedy = [s.response_token_ids for s in engine.generate(texts[:4], n=1, temperature=0, max_new_tokens=64)]
    mem = engine.device_memory()[0]
    t0 = time.perf_counter()
    freed = sum(engine.sleep().values())
    sleep_s = time.perf_counter() - t0
    used2 = nvidia_smi_used_mib()
    out["sleep"] = {"seconds": sleep_s, "freed_bytes": freed, "weights_bytes": mem["weights"],
                    "kv_bytes": mem["kv_cache"], "freed_share": freed / max(mem["weights"] + mem["kv_cache"], 1),
                    "smi_asleep_mib": used2, "smi_freed_mib": used1 - used2}

    t0 = time.perf_counter()
    engine.wake_up(["weights"])
    wake_w = time.perf_counter() - t0
    push = push_in_place(engine, args.model, True, args.bucket_mib)  # also wakes the KV cache (finish)
    pushed = torch.load("/tmp/vllm_bench_pushed.pt")
    got = engine.read_weights()
    want = _fuse(pushed)
    mismatched = [k for k in want if k in got and not torch.equal(got[k].view(torch.uint8), want[k].contiguous().view(torch.uint8))]
    missing = sorted(set(want) - set(got))
    out["push_perturbed"] = {**push, "wake_weights_s": wake_w, "bit_exact": not mismatched and not missing,
                             "mismatched": mismatched[:5], "missing": missing[:5]}
    # And back: a sleep / wake / push cycle of the original weights gives the first greedy output again.
    engine.sleep()
    t0 = time.perf_counter()
    engine.wake_up(["weights"])
    wake_w = time.perf_counter() - t0
    push = push_in_place(engine, args.model, False, args.bucket_mib)
    again = [s.response_token_ids for s in engine.generate(texts[:4], n=1, temperature=0, max_new_tokens=64)]
    out["push_original"] = {**push, "wake_weights_s": wake_w, "greedy_equal": again == greedy,
                            "sync_total_s": wake_w + push["seconds"]}
    engine.shutdown()
    return out


def run_hf(args) -> dict:
    from trainer.rollout.hf_engine import HfEngine

    texts = prompts(args.model, args.data, args.prompts)
    engine = HfEngine(args.model, dtype=args.dtype, batch_size=len(texts) * args.n)
    med, times, samples = timed(lambda: engine.generate(texts, n=args.n, temperature=1.0,
                                                        max_new_tokens=args.max_tokens, seed=1, logprobs=False),
                                args.repeat)
    tokens = sum(len(s.response_token_ids) for s in samples)
    return {"seconds": med, "all": times, "tokens": tokens, "tok_s": tokens / med}


def run_all(args) -> dict:
    results: dict[str, object] = {}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for variant in args.variants.split(","):
        path = out_dir / f"vllm_bench_{variant}.json"
        argv = [variant, "--model", args.model, "--data", args.data, "--json", str(path),
                "--prompts", str(args.prompts), "--n", str(args.n), "--max-tokens", str(args.max_tokens),
                "--repeat", str(args.repeat), "--gpu-util", str(args.gpu_util), "--bucket-mib", str(args.bucket_mib),
                "--dtype", args.dtype]
        t0 = time.perf_counter()
        result = run_isolated(__file__, argv, path, env=GPU_ENV, timeout=args.timeout,
                              log_path=out_dir / f"vllm_bench_{variant}.log", label=variant)
        if "error" in result:
            results[variant] = result
            continue
        results[variant] = {**result, "process_s": time.perf_counter() - t0}
        print(f"{variant}: done in {results[variant]['process_s']:.0f} s", flush=True)
    (out_dir / "vllm_bench.json").write_text(json.dumps(results, indent=1))
    print_table(results, args)
    return results


def print_table(r: dict, args) -> None:
    def tok(x):
        return f"{x['tok_s']:,.0f} tok/s ({x['seconds']:.2f} s)" if isinstance(x, dict) and "tok_s" in x else "-"

    print(f"\n{args.prompts} prompts x {args.n} samples x {args.max_tokens} new tokens, bf16, one GPU")
    bare, eng, hf = r.get("bare", {}), r.get("engine", {}), r.get("hf", {})
    print(f"bare vLLM LLM.generate:          {tok(bare)}")
    if "wrapper" in eng:
        print(f"VllmEngine.generate:             {tok(eng['wrapper'])}")
        print(f"same instance, LLM.generate:     {tok(eng['same_instance_bare'])}")
    print(f"HF engine (generate):            {tok(hf)}")
    if "wrapper" in eng and "tok_s" in bare:
        print(f"engine time / bare time:         {eng['wrapper']['seconds'] / bare['seconds']:.2f}x (target <= 1.25)")
    if "wrapper" in eng and "tok_s" in hf:
        print(f"engine tok/s / HF tok/s:         {eng['wrapper']['tok_s'] / hf['tok_s']:.1f}x (target >= 3)")
    if "sleep" in eng:
        s = eng["sleep"]
        print(f"sleep (level 2): {s['seconds']:.2f} s, freed {s['freed_bytes'] / 2**30:.2f} GiB of "
              f"{(s['weights_bytes'] + s['kv_bytes']) / 2**30:.2f} GiB weights + KV = {s['freed_share']:.1%} "
              f"(target >= 90%); nvidia-smi {eng['smi_engine_mib']} -> {s['smi_asleep_mib']} MiB")
        p, q = eng["push_perturbed"], eng["push_original"]
        print(f"in-place push ({'CUDA IPC' if not p.get('deferred') else '/dev/shm'}): wake weights {p['wake_weights_s']:.3f} s + {p['buckets']} buckets / "
              f"{p['tensors']} tensors loaded + KV wake {p['seconds']:.3f} s; bit-exact {p['bit_exact']}")
        print(f"round trip back to the original: sync {q['sync_total_s']:.3f} s (target <= 0.5 incl. gather); "
              f"greedy output equal {q['greedy_equal']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("variant", choices=["all", "bare", "engine", "hf"])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", default="/tmp/vllm_bench")
    p.add_argument("--json")
    p.add_argument("--variants", default="bare,engine,hf")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--gpu-util", type=float, default=0.5)
    p.add_argument("--bucket-mib", type=int, default=256)
    p.add_argument("--timeout", type=int, default=400)
    p.add_argument("--dtype", default="bfloat16", help="float32 for a CPU smoke run")
    args = p.parse_args(argv)
    os.environ.update(GPU_ENV)
    if args.variant == "all":
        run_all(args)
        return 0
    result = {"bare": run_bare, "engine": run_engine, "hf": run_hf}[args.variant](args)
    Path(args.json or f"/tmp/vllm_bench_{args.variant}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
