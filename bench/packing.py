"""Sample packing (``--packing_samples``) against the padded layout, on whatever device is present.

One training micro-batch of RL-shaped sequences (prompt and response lengths drawn at random, so rows
are ragged as rollouts are) goes through the policy's own code path, ``ModelWorker._action_logprobs``,
then the PPO loss, backward and an AdamW step, padded (the default) and packed (the flag), on the same
model and the same batch. Prints real tokens/s for each and the ratio (packed / padded, same run), and
checks the two layouts' log-probs agree on the action tokens.

    python bench/packing.py                                  # CPU: a small Llama, 8 rows of up to 256 tokens
    python bench/packing.py --model PATH --rows 8 --max-len 1024 --bf16   # a GPU, a real-sized model
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's trainer, not an installed one


def ragged_batch(rows: int, max_len: int, vocab: int, seed: int):
    """Prompts of 1/8..1/4 of max_len, responses of 1/16..3/4 (as RL rollouts: most rows end early)."""
    from trainer.experience import build_experience

    gen = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(rows):
        p = int(torch.randint(max_len // 8, max_len // 4 + 1, (1,), generator=gen))
        r = int(torch.randint(max_len // 16, 3 * max_len // 4 + 1, (1,), generator=gen))
        prompts.append(torch.randint(3, vocab, (p,), generator=gen).tolist())
        responses.append(torch.randint(3, vocab, (r,), generator=gen).tolist())
    return build_experience(prompts, responses, pad_id=0)


def make_worker(model_path: str, packing: bool, dtype: torch.dtype, device: torch.device, attn: str):
    from transformers import AutoModelForCausalLM

    from trainer.learn.model_worker import ModelWorker

    worker = ModelWorker(0, 1)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, attn_implementation=attn).to(device)
    worker.engine, worker.temperature, worker.packing, worker.attn = model, 1.0, packing, attn
    return worker, torch.optim.AdamW(model.parameters(), lr=1e-6)


def step(worker, opt, exp, device) -> torch.Tensor:
    from trainer.learn.losses import policy_loss

    mask = exp.action_mask.to(device)
    logp = worker._action_logprobs(exp.input_ids, exp.attention_mask, exp.num_actions)
    loss, _ = policy_loss(logp, logp.detach() - 0.01, torch.ones_like(mask), mask, 0.2)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return logp.detach()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a model directory (default: a tiny Llama made here)")
    ap.add_argument("--rows", type=int, default=8, help="sequences in the micro-batch")
    ap.add_argument("--max-len", type=int, default=256, help="longest prompt + response the draw allows")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager", "flash_attention_2"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model
        if path is None:
            from trainer.tiny import make_model

            path = str(make_model(f"{tmp}/m", hidden_size=256, num_layers=4, num_heads=4,
                                  max_position_embeddings=max(512, args.max_len)))
        results, logps = {}, {}
        exp = None
        for name, packing in (("padded", False), ("packed", True)):
            torch.manual_seed(args.seed)
            worker, opt = make_worker(path, packing, dtype, device, args.attn)
            if exp is None:
                exp = ragged_batch(args.rows, args.max_len, worker.engine.config.vocab_size, args.seed)
            logps[name] = step(worker, opt, exp, device)  # warm-up; also the log-probs before any update
            times = []
            for _ in range(args.repeats):
                sync(device)
                t0 = time.perf_counter()
                step(worker, opt, exp, device)
                sync(device)
                times.append(time.perf_counter() - t0)
            results[name] = statistics.median(times)
            del worker, opt
            if device.type == "cuda":
                torch.cuda.empty_cache()
    from trainer.learn.packing import pack

    real = int(exp.attention_mask.sum())
    slots = exp.attention_mask.numel()
    packed_shape = tuple(pack(exp.input_ids, exp.attention_mask, exp.num_actions, attn=args.attn).input_ids.shape)
    on = exp.action_mask.bool().to(device)
    diff = (logps["packed"][on].float() - logps["padded"][on].float()).abs().max().item()
    print(f"device {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), dtype {dtype}, "
          f"attention {args.attn}; micro-batch {args.rows} rows, {real} real tokens in {slots} padded slots "
          f"({real / slots:.0%}); packed into {packed_shape[0]} x {packed_shape[1]} slots; median of "
          f"{args.repeats} steps (forward + backward + AdamW)")
    for name, sec in results.items():
        print(f"  {name:7s} {sec * 1e3:9.1f} ms   {real / sec:12,.0f} real tokens/s")
    print(f"  packed / padded throughput: {results['padded'] / results['packed']:.2f}x   "
          f"(max |log-prob difference| on action tokens before the first update: {diff:.2e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
