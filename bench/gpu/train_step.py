"""The RL step's train phase on one rank, for DeepSpeed ZeRO-3 settings, in one run.

    python3 bench/gpu/train_step.py --model M [--micro 8 --micro-batches 8 --prompt 25 --response 256]

One process, one GPU (or CPU with gloo): the policy's own :class:`trainer.learn.model_worker.ModelWorker`
(ZeRO-3, bf16 on GPUs, gradient clipping) runs ``train_policy`` on ``--micro-batches`` micro-batches of
``--micro`` RL-shaped sequences (a prompt and a response of the given lengths, PPO loss on the response),
one optimizer step, as the loop's train phase does for one train batch. Each variant is a fresh worker in
a process of its own; median of ``--repeats`` steps after ``--warmup``:

- ``threshold=0``: every parameter partitioned and gathered at every module (the loop's setting before);
- ``threshold=100000``: DeepSpeed's default, small parameters (biases, norms) stay whole.

``--variants`` names them as ``zSTAGE[/PERSISTENCE[/GRANULARITY]]``: ``z3/100000/2000000`` adds
``stage3_module_granularity_threshold`` (modules below it are fetched as one unit, one hook instead of one
per child; one that makes the whole model a unit is refused: its gradients are never reduced, which is why it
"measured" 2.6x faster on 2026-11-24), ``z2`` and ``z0`` are ZeRO-2 and a plain DeepSpeed step (no
partitioning) for comparison.

Prints seconds per train phase and per micro-batch, and the ratio to the first variant.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from pathlib import Path

from isolated import PROJECT, run_isolated  # run as a script: its own directory is on the path

sys.path.insert(0, str(PROJECT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_variant(text: str) -> tuple[int, int, int]:
    """``z3/100000/0`` -> (3, 100000, 0); a clear error for anything else."""
    parts = text.split("/")
    try:
        if not parts[0].startswith("z") or len(parts) > 3:
            raise ValueError
        stage, *rest = int(parts[0][1:]), *(int(float(x)) for x in parts[1:])
    except ValueError:
        raise SystemExit(f"--variants: {text!r} is not zSTAGE[/PERSISTENCE[/GRANULARITY]] (e.g. z3/100000/0)") from None
    if stage not in (0, 1, 2, 3):
        raise SystemExit(f"--variants: {text!r}: ZeRO stage {stage} is not 0-3")
    rest += [100_000, 0][len(rest):]
    return stage, rest[0], rest[1]


def run_variant(args) -> dict:
    import torch

    from trainer.learn.losses import PolicyObjective
    from trainer.learn.model_worker import ModelWorker

    cuda = torch.cuda.is_available()
    worker = ModelWorker(0, 1)
    worker.init_process_group("127.0.0.1", _free_port(), "nccl" if cuda else "gloo")
    stage, threshold, granularity = parse_variant(args.variant)
    worker.init_model(args.model, zero_stage=stage, bf16=cuda, micro_batch=args.micro,
                      grad_accum=args.micro_batches, learning_rate=1e-6, persistence_threshold=threshold,
                      granularity_threshold=granularity)
    vocab = worker.engine.module.config.vocab_size
    g = torch.Generator().manual_seed(0)
    length = args.prompt + args.response

    def micro() -> dict:
        ids = torch.randint(0, vocab, (args.micro, length), generator=g)
        mask = torch.ones(args.micro, length, dtype=torch.long)
        act = torch.ones(args.micro, args.response)
        return {"input_ids": ids, "attention_mask": mask, "action_mask": act,
                "old_logprobs": -torch.rand(args.micro, args.response, generator=g) * 5,
                "advantages": torch.randn(args.micro, args.response, generator=g)}

    batches = [[micro() for _ in range(args.micro_batches)] for _ in range(args.warmup + args.repeats)]
    times, norms = [], []
    for i, mbs in enumerate(batches):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        metrics = worker.train_policy(mbs, PolicyObjective(), lr=1e-6)
        if cuda:
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            norms.append(metrics["policy/grad_norm"])
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    # a step is only a train step if a gradient reached the optimizer (2026-11-24: one that did not was 2.6x "faster")
    return {"variant": args.variant, "train_s": statistics.median(times), "all": times, "peak_gib": peak,
            "grad_norm": statistics.median(norms)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--prompt", type=int, default=25)
    p.add_argument("--response", type=int, default=256)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", default="z3/0,z3/100000", help="zSTAGE[/PERSISTENCE[/GRANULARITY]],...")
    p.add_argument("--variant", help=argparse.SUPPRESS)  # one variant, in its own process
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.variant is not None:
        Path(args.json).write_text(json.dumps(run_variant(args)))
        return 0
    results = []
    variants = args.variants.split(",")
    for v in variants:
        parse_variant(v)  # every name checked before the first run
    for variant in variants:
        out = Path(f"/tmp/train_step_{variant.replace('/', '_')}.json")
        argv = ["--model", args.model, "--micro", str(args.micro), "--micro-batches", str(args.micro_batches),
                "--prompt", str(args.prompt), "--response", str(args.response), "--warmup", str(args.warmup),
                "--repeats", str(args.repeats), "--variant", variant, "--json", str(out)]
        result = run_isolated(__file__, argv, out, label=variant)
        if "error" not in result:
            results.append(result)
    print(f"train phase: {args.micro_batches} micro-batches of {args.micro} x ({args.prompt} + {args.response}) "
          f"tokens, one optimizer step, one rank")
    for r in results:
        ratio = r["train_s"] / results[0]["train_s"]
        print(f"{r['variant']:>20}: {r['train_s']:.3f} s ({r['train_s'] / args.micro_batches:.3f} "
              f"s a micro-batch), {ratio:.2f}x of the first, peak {r['peak_gib']:.1f} GiB, gradient norm "
              f"{r['grad_norm']:.3g}{' (NO GRADIENT: nothing was trained)' if r['grad_norm'] == 0 else ''}; "
              f"all {r['all']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
