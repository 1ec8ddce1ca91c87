"""Weight-sync benchmark: per-tensor vs bucketed broadcast vs one raw broadcast, between 2 processes.

A sender (group rank 0, "the trainer") pushes the parameters of a synthetic decoder-only model to a receiver
(rank 1, "an engine worker") over a dedicated group made by ``trainer.weights.broadcast.make_sync_group``: NCCL between
two GPUs when there are two, else gloo on CPU over loopback. Measured, each as the median of ``--repeats``
runs after one warm-up:

- ``raw``: one broadcast of a flat buffer with the same total bytes (the link's ceiling, the baseline);
- ``per-tensor``: one broadcast per parameter, the receiver's tensors pre-allocated (metadata known);
- ``bucketed``: ``trainer.weights.broadcast.broadcast_buckets`` streaming ``iter_buckets`` (packing copy, per-bucket JSON
  header, receiver allocation included): what a weight push costs with this module;
- ``bucketed-prepacked``: the same with buckets packed before the clock starts.

Not included: the ZeRO-3 gather and the engine-side load. The model shape follows Qwen2.5-0.5B (24 layers,
q/k/v biases, intermediate = 4 x hidden, 12 tensors per layer) with the hidden size solved for ``--params``.

    python bench/weight_sync.py                  # ~100M params on CPU, ~0.5B on CUDA
    python bench/weight_sync.py --params 2e7 --bucket-mb 32 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.weights.broadcast import (  # noqa: E402
    SyncGroup,
    broadcast_buckets,
    broadcast_tensor,
    close_sync_group,
    iter_received_buckets,
    iter_received_tensors,
    make_sync_group,
)
from trainer.weights.buckets import iter_buckets, pack_buckets  # noqa: E402

VOCAB = 32000


def model_shapes(params: float, layers: int = 24) -> list[tuple[str, tuple[int, ...]]]:
    """Parameter names and shapes of a Qwen2-like model with about ``params`` parameters."""
    # per layer: q, k, v, o (h x h) + gate, up, down (4h x h) = 16 h^2; embed + lm_head = 2 V h
    a, b = 16 * layers, 2 * VOCAB
    h = max(64, int(round((-b + math.sqrt(b * b + 4 * a * params)) / (2 * a) / 64)) * 64)
    i = 4 * h
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, h))]
    for n in range(layers):
        p = f"model.layers.{n}."
        shapes += [(p + "input_layernorm.weight", (h,))]
        for x in "qkv":
            shapes += [(f"{p}self_attn.{x}_proj.weight", (h, h)), (f"{p}self_attn.{x}_proj.bias", (h,))]
        shapes += [(p + "self_attn.o_proj.weight", (h, h)), (p + "post_attention_layernorm.weight", (h,))]
        shapes += [(p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h))]
        shapes += [(p + "mlp.down_proj.weight", (h, i))]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (VOCAB, h))]
    return shapes


def make_tensors(shapes: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype, device: torch.device,
                 seed: int = 0) -> dict[str, torch.Tensor]:  # fmt: skip
    g = torch.Generator(device=device).manual_seed(seed)
    return {n: torch.randn(s, generator=g, device=device, dtype=torch.float32).to(dtype) for n, s in shapes}


def _sync_point(group: SyncGroup, src: int) -> None:
    """A tiny broadcast from ``src``: orders both ranks (used as barrier and as the receiver's ack)."""
    flag = torch.zeros(1, dtype=torch.int64, device=group.device)
    broadcast_tensor(group, flag, src)
    if group.device.type == "cuda":
        torch.cuda.synchronize(group.device)


def _worker(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    device = torch.device("cuda", rank) if args.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if args.threads or device.type == "cpu":  # 2 processes share the cores: oversubscription costs ~5x
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 2) // 2))
    dtype = getattr(torch, args.dtype)
    group = make_sync_group("127.0.0.1", port, rank, 2, backend=args.backend, device=device)
    shapes = model_shapes(args.params, args.layers)
    tensors = make_tensors(shapes, dtype, device) if rank == 0 else None
    recv = {n: torch.empty(s, dtype=dtype, device=device) for n, s in shapes} if rank == 1 else None
    total = sum(math.prod(s) for _, s in shapes) * torch.empty((), dtype=dtype).element_size()
    bucket_bytes = int(args.bucket_mb * 2**20)
    flat = torch.zeros(total, dtype=torch.uint8, device=device)
    prepacked = pack_buckets(tensors, bucket_bytes) if rank == 0 else None

    def raw() -> None:
        broadcast_tensor(group, flat, 0)

    def per_tensor() -> None:
        for n, _ in shapes:
            broadcast_tensor(group, tensors[n] if rank == 0 else recv[n], 0)

    def bucketed() -> None:
        if rank == 0:
            broadcast_buckets(group, iter_buckets(tensors, bucket_bytes))
        else:
            for bucket in iter_received_buckets(group):
                bucket.tensors()

    def bucketed_prepacked() -> None:
        if rank == 0:
            broadcast_buckets(group, prepacked)
        else:
            for bucket in iter_received_buckets(group):
                bucket.tensors()

    methods = {"raw": raw, "per-tensor": per_tensor, "bucketed": bucketed, "bucketed-prepacked": bucketed_prepacked}
    results: dict[str, list[float]] = {}
    for name, fn in methods.items():
        times = []
        for rep in range(args.repeats + 1):
            _sync_point(group, 0)
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            _sync_point(group, 1)  # the receiver's ack: the data has arrived
            if rep:
                times.append(time.perf_counter() - t0)
        results[name] = times

    verified = None
    if args.verify:  # once, bucketed: the receiver checks every byte against the sender's tensors
        if rank == 0:
            broadcast_buckets(group, iter_buckets(tensors, bucket_bytes))
        else:
            got = dict(iter_received_tensors(group))
            want = make_tensors(shapes, dtype, device)
            verified = sorted(got) == sorted(want) and all(
                torch.equal(got[n].view(torch.uint8), want[n].view(torch.uint8)) for n in want
            )
    close_sync_group(group)
    if rank == 1:
        Path(out + ".rank1").write_text(json.dumps({"verified": verified}))
    if rank == 0:
        dev = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)"
        Path(out).write_text(json.dumps({
            "results": results, "bytes": total, "tensors": len(shapes), "device": dev, "buckets": len(prepacked),
            "params": total // torch.empty((), dtype=dtype).element_size(), "hidden": shapes[0][1][1],
        }))  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    cuda2 = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=float, default=None, help="model size (default: 1e8 on CPU, 5e8 on CUDA)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--bucket-mb", type=float, default=None, help="bucket size in MiB (default: 64 CPU, 256 CUDA)")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl" if cuda2 else "gloo")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads per process (default: half the cores on CPU)")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="skip the bit-exact check")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    if args.backend == "nccl" and not cuda2:
        p.error("--backend nccl needs 2 CUDA devices (one per process)")
    args.params = args.params or (5e8 if args.backend == "nccl" else 1e8)
    args.bucket_mb = args.bucket_mb or (256 if args.backend == "nccl" else 64)
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"weight_sync_{os.getpid()}.json")
    t0 = time.perf_counter()
    mp.start_processes(_worker, args=(args, _free_port(), out), nprocs=2, join=True, start_method="spawn")
    res = json.loads(Path(out).read_text())
    verified = json.loads(Path(out + ".rank1").read_text())["verified"]
    os.remove(out)
    os.remove(out + ".rank1")
    gb = res["bytes"] / 1e9
    print(f"device: {res['device']}; backend {args.backend}; {res['params'] / 1e6:.0f}M params {args.dtype} "
          f"(hidden {res['hidden']}, {res['tensors']} tensors, {res['bytes'] / 2**20:.0f} MiB); "
          f"buckets of {args.bucket_mb:g} MiB: {res['buckets']}")  # fmt: skip
    figures = {}
    raw_gbps = gb / statistics.median(res["results"]["raw"])
    for name, times in res["results"].items():
        med = statistics.median(times)
        figures[name] = {"seconds": med, "GBps": gb / med, "vs_raw": gb / med / raw_gbps}
        print(f"  {name:20s} {med * 1e3:9.1f} ms  {gb / med:7.2f} GB/s  {gb / med / raw_gbps:6.2f} x raw")
    print(f"  bit-exact check: {'passed' if verified else 'skipped' if verified is None else 'FAILED'}; "
          f"wall {time.perf_counter() - t0:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **res, "figures": figures,
                                               "verified": verified}, indent=1))  # fmt: skip
    return 0 if verified is not False else 1


if __name__ == "__main__":
    raise SystemExit(main())
