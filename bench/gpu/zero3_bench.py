"""ZeRO-3 policy ranks on GPUs (no Ray): train throughput, and weight sync from the ranks to an engine process.

Processes, one GPU each through ``CUDA_VISIBLE_DEVICES``: ``W`` trainer ranks (the loop's own
``trainer.learn.model_worker.ModelWorker``: bf16 ZeRO-3, torch AdamW, NCCL) and one receiver, standing for
a rollout-engine worker, joined with trainer rank 0 in a dedicated group (``trainer.weights.broadcast.make_sync_group``).

Weight sync, each the median of ``--repeats`` after one warm-up, the clock on trainer rank 0 from a start
signal to the receiver's acknowledgement (so the receiver has every byte):

- ``raw``: one NCCL broadcast of a flat buffer of the model's bytes (no gather): the link's ceiling;
- ``per-tensor``: a ZeRO-3 gather (``GatheredParameters``) and a broadcast per parameter;
- ``bucketed``: ``gather_zero3_params`` + ``iter_buckets`` + ``broadcast_buckets`` (what a push costs
  with trainer.weights), the receiver unpacking views as an engine would;
- ``gather-pack``: the same gather and packing without sending (the sender's own cost);
- ``bucketed-ag`` / ``ag-pack``: the same two with ``iter_zero3_buckets`` (one all-gather of the ranks'
  partitions per bucket instead of ``GatheredParameters``);
- ``loop-blob``: what trainer/loop.py did at the time of writing: ``full_state()`` (a gather per parameter,
  copied to host) then ``to_safetensors_bytes`` on rank 0; not counted: the Ray transfer and the load.

Train: ``train_policy`` on one micro-batch of random tokens per optimizer step (PPO loss over every token),
for each ``--train-shapes`` BxT; tokens/s/GPU = B*T / step time; MFU = 6 * N * tokens/s / peak. Then
RL-shaped data, sequence lengths uniform in [128, 1024]: ``rl-padded`` (16 sequences a row each, padded to
1024, through ``train_policy``) against ``rl-packed`` (as many sequences as fill 4 rows of 4096 tokens,
block-diagonal causal mask, positions restarting per sequence); tokens/s counts real tokens only.

    python bench/gpu/zero3_bench.py --model DIR --gpus 0,1 --receiver-gpu 1 --json out.json
    python bench/gpu/zero3_bench.py --model DIR --gpus 0 --receiver-gpu cpu   # CPU smoke run (gloo)
    python bench/gpu/zero3_bench.py same-gpu          # can two processes on one GPU share an NCCL group?
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PEAK_BF16 = 989e12  # H100/H200 SXM dense bf16, FLOP/s
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cuda(device_spec: str) -> bool:
    return device_spec != "cpu"


# --- the processes -------------------------------------------------------------------------------------------
def _sync(group, src: int) -> None:
    """A one-element broadcast from ``src`` on the sync group: the start signal (0) or the ack (1)."""
    import torch

    from trainer.weights.broadcast import broadcast_tensor

    flag = torch.zeros(1, dtype=torch.int64, device=group.device)
    broadcast_tensor(group, flag, src)
    if group.device.type == "cuda":
        torch.cuda.synchronize(group.device)


def _manifest(engine) -> list[tuple[str, list[int], str]]:
    out = []
    for name, p in engine.module.named_parameters():
        shape = list(p.ds_shape) if hasattr(p, "ds_shape") else list(p.shape)
        out.append((name, shape, str(p.dtype).removeprefix("torch.")))
    return out


def run_trainer(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from trainer.learn.losses import PolicyObjective
    from trainer.learn.model_worker import ModelWorker
    from trainer.weights.broadcast import (
        broadcast_buckets,
        broadcast_tensor,
        close_sync_group,
        make_sync_group,
    )
    from trainer.weights.buckets import iter_buckets, to_safetensors_bytes
    from trainer.weights.gather import gather_zero3_params, iter_zero3_buckets

    rank, world = args.rank, len(args.gpus.split(","))
    backend = "nccl" if args.cuda else "gloo"
    worker = ModelWorker(rank, world)
    worker.init_process_group("127.0.0.1", args.port, backend)
    n_params = worker.init_model(args.model, zero_stage=3, bf16=args.cuda, micro_batch=1, grad_accum=1,
                                 learning_rate=1e-6)
    engine = worker.engine
    dev = engine.device
    results: dict = {"params": n_params, "world": world, "backend": backend,
                     "device": torch.cuda.get_device_name(dev) if args.cuda else "cpu"}
    bucket_bytes = int(args.bucket_mb * 2**20)

    group = None
    if rank == 0:
        group = make_sync_group("127.0.0.1", args.sync_port, 0, 2, backend=backend, device=dev)
        group.store.set("manifest", json.dumps(_manifest(engine)))
    total = sum(p.ds_numel * p.element_size() if hasattr(p, "ds_numel") else p.numel() * p.element_size()
                for p in engine.module.parameters())
    results["bytes"] = total

    def raw() -> None:
        if rank == 0:
            broadcast_tensor(group, flat, 0)

    def per_tensor() -> None:
        import deepspeed

        for _, p in engine.module.named_parameters():
            with deepspeed.zero.GatheredParameters([p], enabled=hasattr(p, "ds_id")):
                if rank == 0:
                    broadcast_tensor(group, p.data.contiguous(), 0)

    def bucketed() -> None:
        params = gather_zero3_params(engine, bucket_bytes)
        if rank == 0:
            broadcast_buckets(group, iter_buckets(params, bucket_bytes))
        else:
            for _ in params:
                pass

    def gather_pack() -> None:
        params = gather_zero3_params(engine, bucket_bytes)
        for _ in iter_buckets(params, bucket_bytes) if rank == 0 else params:
            pass

    def loop_blob() -> None:
        state = worker.full_state()
        if rank == 0:
            to_safetensors_bytes(state)

    def bucketed_ag(size: int = bucket_bytes) -> None:
        buckets = iter_zero3_buckets(engine, size)
        if rank == 0:
            broadcast_buckets(group, buckets)
        else:
            for _ in buckets:
                pass

    def ag_pack() -> None:
        for _ in iter_zero3_buckets(engine, bucket_bytes):
            pass

    flat = torch.zeros(total, dtype=torch.uint8, device=dev) if rank == 0 else None
    methods = {"raw": raw, "per-tensor": per_tensor, "bucketed": bucketed, "gather-pack": gather_pack,
               "loop-blob": loop_blob, "bucketed-ag": bucketed_ag, "ag-pack": ag_pack}
    for mb_size in _ag_sizes(args):
        methods[f"bucketed-ag@{mb_size:g}MiB"] = lambda n=int(mb_size * 2**20): bucketed_ag(n)
    sync_times: dict[str, list[float]] = {}
    for name, fn in methods.items():
        times = []
        for rep in range(args.repeats + 1):
            dist.barrier()
            if rank == 0:
                _sync(group, 0)
            t0 = time.perf_counter()
            fn()
            if args.cuda:
                torch.cuda.synchronize(dev)
            if rank == 0:
                _sync(group, 1)
                if rep:
                    times.append(time.perf_counter() - t0)
        sync_times[name] = times
    if rank == 0:
        verified = json.loads(group.store.get("verified").decode())  # both bucketed pushes, bit-exact
        results["sync"] = {k: {"seconds": statistics.median(v), "GBps": total / 1e9 / statistics.median(v)}
                           for k, v in sync_times.items()}
        results["sync_verified"] = verified
        close_sync_group(group)

    train: dict[str, dict] = {}
    gen = torch.Generator().manual_seed(rank)
    vocab = engine.module.config.vocab_size
    jobs = [(f"{shape}#{i}", shape) for i, shape in enumerate(args.train_shapes.split(","))]
    jobs += [("rl-padded", "rl-padded"), ("rl-packed", "rl-packed")]
    for key, shape in jobs:
        if shape == "rl-padded":
            mb, real = rl_padded(gen, vocab, args.rl_scale)
            step_fn = lambda mb=mb: worker.train_policy([mb], PolicyObjective())  # noqa: E731
        elif shape == "rl-packed":
            mb, real = rl_packed(gen, vocab, args.rl_scale)
            step_fn = lambda mb=mb: packed_step(worker, mb)  # noqa: E731
        else:
            b, t = (int(x) for x in shape.split("x"))
            real = b * t
            mb = {"input_ids": torch.randint(0, vocab, (b, t), generator=gen),
                  "attention_mask": torch.ones(b, t, dtype=torch.long), "action_mask": torch.ones(b, t - 1),
                  "old_logprobs": torch.full((b, t - 1), -12.0), "advantages": torch.randn(b, t - 1, generator=gen)}
            step_fn = lambda mb=mb: worker.train_policy([mb], PolicyObjective())  # noqa: E731
        times = []
        try:
            for step in range(args.warmup + args.steps):
                dist.barrier()
                t0 = time.perf_counter()
                step_fn()
                if args.cuda:
                    torch.cuda.synchronize(dev)
                if step >= args.warmup:
                    times.append(time.perf_counter() - t0)
        except torch.OutOfMemoryError as exc:  # report the shape that does not fit, keep the others
            train[key] = {"error": str(exc)[:200]}
            torch.cuda.empty_cache()
            continue
        step_s = statistics.median(times)
        tps = real / step_s
        train[key] = {"step_s": step_s, "tokens": real, "slots": mb["input_ids"].numel(),
                      "tokens_per_s_per_gpu": tps, "mfu": 6 * n_params * tps / PEAK_BF16,
                      "step_times": [round(x, 4) for x in times],
                      "max_mem_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if args.cuda else 0.0}
    results["train"] = train
    if rank == 0:
        Path(args.json).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


RL_MIN, RL_MAX = 128, 1024


def _ag_sizes(args: argparse.Namespace) -> list[float]:
    return [float(x) for x in args.ag_bucket_mb.split(",") if x]


def rl_padded(gen, vocab: int, scale: float = 1.0):
    """16 sequences of RL-like lengths, one per row, left-padded to 1024 (the loop's layout)."""
    import torch

    n, width = 16, int(RL_MAX * scale)
    lengths = torch.randint(int(RL_MIN * scale), width + 1, (n,), generator=gen)
    ids = torch.randint(0, vocab, (n, width), generator=gen)
    attn = torch.zeros(n, width, dtype=torch.long)
    for i, length in enumerate(lengths.tolist()):
        attn[i, width - length:] = 1
    mb = {"input_ids": ids, "attention_mask": attn, "action_mask": attn[:, 1:].float(),
          "old_logprobs": torch.full((n, width - 1), -12.0), "advantages": torch.randn(n, width - 1, generator=gen)}
    return mb, int(lengths.sum())


def rl_packed(gen, vocab: int, scale: float = 1.0):
    """RL-like sequences packed first-fit into 4 rows of 4096 tokens (same slots as rl_padded)."""
    import torch

    rows, width = 4, int(4 * RL_MAX * scale)
    seg = torch.full((rows, width), -1, dtype=torch.long)
    pos = torch.zeros(rows, width, dtype=torch.long)
    fill = [0] * rows
    for i in range(1000):
        length = int(torch.randint(int(RL_MIN * scale), int(RL_MAX * scale) + 1, (1,), generator=gen))
        row = next((r for r in range(rows) if fill[r] + length <= width), None)
        if row is None:
            break
        seg[row, fill[row]:fill[row] + length] = i  # one id per sequence
        pos[row, fill[row]:fill[row] + length] = torch.arange(length)
        fill[row] += length
    causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
    mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0) & causal
    mask |= torch.eye(width, dtype=torch.bool)  # padding rows attend to themselves (no NaN)
    action = ((seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] >= 0)).float()
    ids = torch.randint(0, vocab, (rows, width), generator=gen)
    mb = {"input_ids": ids, "attention_mask": mask[:, None], "position_ids": pos, "action_mask": action,
          "old_logprobs": torch.full((rows, width - 1), -12.0),
          "advantages": torch.randn(rows, width - 1, generator=gen)}
    return mb, int((seg >= 0).sum())


def packed_step(worker, mb) -> None:
    """One optimizer step of the PPO loss on a packed micro-batch (4-D block-diagonal mask)."""
    from trainer.learn.losses import log_probs_from_logits, policy_loss

    engine = worker.engine
    engine.train()
    mb = worker._to_device(mb)
    logits = engine(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                    position_ids=mb["position_ids"]).logits
    logp = log_probs_from_logits(logits[:, :-1], mb["input_ids"][:, 1:])
    loss, _ = policy_loss(logp, mb["old_logprobs"], mb["advantages"], mb["action_mask"], 0.2)
    engine.backward(loss)
    engine.step()


def run_receiver(args: argparse.Namespace) -> None:
    import torch

    from trainer.weights.broadcast import (
        broadcast_tensor,
        close_sync_group,
        iter_received_buckets,
        make_sync_group,
    )

    dev = torch.device("cuda", 0) if args.cuda else torch.device("cpu")
    if args.cuda:
        torch.cuda.set_device(dev)
    backend = "nccl" if args.cuda else "gloo"
    group = make_sync_group("127.0.0.1", args.sync_port, 1, 2, backend=backend, device=dev)
    manifest = json.loads(group.store.get("manifest").decode())
    recv = {n: torch.empty(s, dtype=getattr(torch, d), device=dev) for n, s, d in manifest}
    total = sum(t.numel() * t.element_size() for t in recv.values())
    flat = torch.empty(total, dtype=torch.uint8, device=dev)
    got: dict[str, torch.Tensor] = {}

    def raw() -> None:
        broadcast_tensor(group, flat, 0)

    def per_tensor() -> None:
        for n, _, _ in manifest:
            broadcast_tensor(group, recv[n], 0)

    def bucketed() -> None:
        got.clear()
        for bucket in iter_received_buckets(group):
            got.update(bucket.tensors())

    pushes = {}
    methods = {"raw": raw, "per-tensor": per_tensor, "bucketed": bucketed, "gather-pack": lambda: None,
               "loop-blob": lambda: None, "bucketed-ag": bucketed, "ag-pack": lambda: None}
    for mb_size in _ag_sizes(args):
        methods[f"bucketed-ag@{mb_size:g}MiB"] = bucketed
    for name, fn in methods.items():
        for _ in range(args.repeats + 1):
            _sync(group, 0)
            fn()
            _sync(group, 1)
        if name.startswith("bucketed"):
            pushes[name] = dict(got)
    # Bit-exact: the weights pushed (before any training) are the checkpoint's.
    from safetensors.torch import load_file

    files = sorted(Path(args.model).glob("*.safetensors"))
    want = {k: v for f in files for k, v in load_file(str(f)).items()}
    verified = all(sorted(got) == sorted(want) and all(
        torch.equal(got[k].cpu().view(torch.uint8), want[k].view(torch.uint8)) for k in want)
        for got in pushes.values())
    group.store.set("verified", json.dumps(verified))
    close_sync_group(group)


def run_same_gpu(args: argparse.Namespace) -> None:
    """Rank ``args.rank`` of a 2-process NCCL group whose processes share one GPU."""
    import torch

    from trainer.weights.broadcast import broadcast_tensor, close_sync_group, make_sync_group

    torch.cuda.set_device(0)
    group = make_sync_group("127.0.0.1", args.sync_port, args.rank, 2, backend="nccl", timeout_s=60)
    x = torch.full((1 << 20,), float(args.rank), device="cuda")
    broadcast_tensor(group, x, 0)
    torch.cuda.synchronize()
    print(f"same-gpu rank {args.rank}: broadcast ok, value {x[0].item()}", flush=True)
    close_sync_group(group)


# --- the parent ----------------------------------------------------------------------------------------------
def _spawn(role: str, visible: str, extra: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, **NCCL_ENV, "PYTHONUNBUFFERED": "1"}
    if visible == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["CUDA_VISIBLE_DEVICES"] = visible
    cmd = [sys.executable, str(Path(__file__).resolve()), "--role", role, *extra]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait(procs: list[subprocess.Popen], timeout: float) -> list[int | None]:
    end = time.monotonic() + timeout
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, end - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()  # our own child, by its handle
            codes.append(None)
    return codes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="bench", choices=["bench", "same-gpu"])
    p.add_argument("--model")
    p.add_argument("--gpus", default="0,1", help="comma-separated GPU ids of the trainer ranks")
    p.add_argument("--receiver-gpu", default="1", help="GPU id of the receiver, or 'cpu' for a CPU run (gloo)")
    p.add_argument("--bucket-mb", type=float, default=256)
    p.add_argument("--ag-bucket-mb", default="", help="more bucket sizes (MiB) for the bucketed-ag push, e.g. 64,1024")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--train-shapes", default="8x1024,16x1024", help="micro-batch shapes BxT")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rl-scale", type=float, default=1.0, help="scales the RL-shaped lengths (small on CPU)")
    p.add_argument("--json", default="zero3_bench.json")
    p.add_argument("--logs", default=".", help="folder for the processes' logs")
    p.add_argument("--timeout", type=float, default=400)
    # internal: the child processes
    p.add_argument("--role", choices=["trainer", "receiver", "same-gpu"])
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--port", type=int)
    p.add_argument("--sync-port", type=int)
    args = p.parse_args(argv)
    args.cuda = _cuda(args.receiver_gpu)
    if args.role == "trainer":
        run_trainer(args)
        return 0
    if args.role == "receiver":
        run_receiver(args)
        return 0
    if args.role == "same-gpu":
        run_same_gpu(args)
        return 0

    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    sync_port = _free_port()
    if args.mode == "same-gpu":
        procs = [_spawn("same-gpu", "0", ["--rank", str(r), "--sync-port", str(sync_port)],
                        logs / f"same_gpu_{r}.log") for r in range(2)]
        codes = _wait(procs, 90)
        print(f"same-gpu NCCL group: exit codes {codes}")
        return 0 if codes == [0, 0] else 1
    if not args.model:
        p.error("--model is required")
    gpus = args.gpus.split(",")
    common = ["--model", args.model, "--gpus", args.gpus, "--receiver-gpu", args.receiver_gpu,
              "--bucket-mb", str(args.bucket_mb), "--ag-bucket-mb", args.ag_bucket_mb, "--repeats", str(args.repeats), "--train-shapes",
              args.train_shapes, "--warmup", str(args.warmup), "--steps", str(args.steps),
              "--rl-scale", str(args.rl_scale),
              "--json", str(Path(args.json).resolve()), "--port", str(_free_port()), "--sync-port", str(sync_port)]
    procs = [_spawn("trainer", "cpu" if not args.cuda else g, [*common, "--rank", str(r)], logs / f"zero3_rank{r}.log")
             for r, g in enumerate(gpus)]
    procs.append(_spawn("receiver", args.receiver_gpu, common, logs / "zero3_receiver.log"))
    codes = _wait(procs, args.timeout)
    if codes != [0] * len(procs):
        print(f"zero3 bench failed: exit codes {codes} (logs in {logs})")
        return 1
    res = json.loads(Path(args.json).read_text())
    gb = res["bytes"] / 1e9
    print(f"{res['device']} x{res['world']} ({res['backend']}); {res['params'] / 1e6:.0f}M params, {gb:.2f} GB; "
          f"bucketed bit-exact: {res['sync_verified']}")
    for name, r in res["sync"].items():
        print(f"  sync {name:12s} {r['seconds'] * 1e3:9.1f} ms {r['GBps']:8.1f} GB/s")
    for shape, r in res["train"].items():
        if "error" in r:
            print(f"  train {shape}: {r['error']}")
        else:
            print(f"  train {shape:11s} {r['step_s'] * 1e3:8.1f} ms/step {r['tokens']:6d} tokens "
                  f"{r['tokens_per_s_per_gpu']:9.0f} tok/s/GPU MFU {100 * r['mfu']:.1f} % "
                  f"(max mem {r['max_mem_gib']:.1f} GiB)")
    return 0 if res["sync_verified"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
