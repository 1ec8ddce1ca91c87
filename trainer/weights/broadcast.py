"""The broadcast transport's wire: a dedicated process group and the bucket stream over it.

A group of its own (:func:`make_sync_group`, gloo on CPU, NCCL on GPU) holds only the sender (trainer rank 0,
group rank 0) and the engine workers.

Wire protocol of :func:`broadcast_buckets` / :func:`iter_received_buckets` (all from ``src``): first the
stream's plan (an int64 length, then one JSON list of every bucket's dtype, size and manifest, as uint8:
:func:`trainer.weights.buckets.plan_header`), then each bucket's buffer, nothing else. The receivers know every
size up front, so the transfer runs ahead of the work at both ends: the sender posts a bucket and goes on
gathering the next while it is on the wire, the receivers post the next bucket's receive before they hand the
last one to the loader (``depth`` buckets in flight; one host synchronisation per stream, not three per bucket).

Every call on a group is collective: all its ranks must make the same calls in the same order.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from trainer.weights.buckets import Bucket, TensorMeta, bucket_plan, parse_plan_header, plan_header


@dataclass
class SyncGroup:
    """A process group of its own (not torch.distributed's default group) plus what it needs to live."""

    pg: Any
    store: Any
    rank: int
    world_size: int
    backend: str
    device: torch.device


def make_sync_group(
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    backend: Literal["gloo", "nccl"] = "gloo",
    timeout_s: float = 600.0,
    device: torch.device | str | None = None,
    master_listen_fd: int | None = None,
) -> SyncGroup:
    """Join (rank 0: host) a ``world_size`` group on ``master_addr:master_port``; blocks until all joined.

    Independent of ``torch.distributed.init_process_group``: a DeepSpeed rank and a vLLM worker can each
    be in their own default group and still share this one. For NCCL, ``device`` (default: the current
    CUDA device) is where the transferred buffers live. On rank 0, ``master_listen_fd`` is a socket already
    bound and listening (``DistributedWorker.take_listen_fd``), which the store then serves on and owns.
    """
    import torch.distributed as dist

    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a group of world_size {world_size}; expected 0 <= rank < size")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(master_addr, master_port, world_size, rank == 0, timeout=timeout,
                          master_listen_fd=master_listen_fd if rank == 0 else None)
    # [collective deadline] Forming the group (gloo connects every pair here) and its first broadcast under a
    # deadline ($RLRUN_COLLECTIVE_DEADLINE_S): a failing link is one line (trainer/collective_deadline.py).
    from trainer.collective_deadline import GroupWatch, deadline_s, local_address

    watch = GroupWatch(store, rank, world_size, backend, "weight-sync group", local_address(master_addr), deadline_s())
    if backend == "gloo":
        pg = watch.run("forming the group", lambda: dist.ProcessGroupGloo(store, rank, world_size, timeout))
        dev = torch.device(device or "cpu")
    elif backend == "nccl":
        if not torch.cuda.is_available() or not hasattr(dist, "ProcessGroupNCCL"):
            raise RuntimeError("backend 'nccl' needs CUDA and a torch built with NCCL; use backend='gloo' on CPU")
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)
    else:
        raise ValueError(f"unknown sync backend {backend!r}: expected 'gloo' or 'nccl'")
    with watch:  # [collective deadline]
        watch.run("the first broadcast", lambda: pg.broadcast(torch.zeros(1, dtype=torch.uint8, device=dev), 0))
    return SyncGroup(pg, store, rank, world_size, backend, dev)


def close_sync_group(group: SyncGroup, abort: bool = False) -> None:
    """Shut the group's backend down (NCCL warns at exit otherwise); the group is unusable afterwards.
    ``abort``: tear it down without waiting for the other members (some may be dead: an engine was
    replaced), where the backend can (NCCL's ``ncclCommAbort``)."""
    end = (getattr(group.pg, "abort", None) if abort else None) or getattr(group.pg, "shutdown", None)
    if end is not None:
        end()


def broadcast_tensor(group: SyncGroup, tensor: torch.Tensor, src: int = 0) -> None:
    """Broadcast one contiguous tensor in place (as raw bytes, so any dtype works on any backend)."""
    if not tensor.is_contiguous():
        raise ValueError("broadcast_tensor needs a contiguous tensor (receivers fill it in place)")
    if tensor.numel() == 0:
        return
    group.pg.broadcast(tensor.reshape(-1).view(torch.uint8), src).wait()


def _send_bytes(group: SyncGroup, raw: bytes, src: int) -> None:
    length = torch.tensor([len(raw)], dtype=torch.int64, device=group.device)
    broadcast_tensor(group, length, src)
    if raw:
        payload = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(group.device)
        broadcast_tensor(group, payload, src)


def _receive_bytes(group: SyncGroup, src: int) -> bytes:
    length = torch.empty(1, dtype=torch.int64, device=group.device)
    broadcast_tensor(group, length, src)
    n = int(length.item())
    if n == 0:
        return b""
    raw = torch.empty(n, dtype=torch.uint8, device=group.device)
    broadcast_tensor(group, raw, src)
    return raw.cpu().numpy().tobytes()


def _post(group: SyncGroup, buffer: torch.Tensor, src: int) -> Any:
    """One bucket's broadcast, posted and not waited for (its work handle)."""
    return group.pg.broadcast(buffer.reshape(-1).view(torch.uint8), src)


def broadcast_buckets(group: SyncGroup, buckets: Iterable[Bucket], src: int = 0,
                      plan: Sequence[tuple[torch.dtype, int, Sequence[TensorMeta]]] | None = None,
                      depth: int = 2) -> int:
    """Sender side: the stream's plan, then every bucket, ``depth`` of them in flight while the next is
    produced (gathered). ``plan`` (from :func:`plan_of`) lets ``buckets`` stay lazy; without it they are packed
    first. A bucket that differs from its plan entry stops the stream before it is sent. Returns the payload
    bytes sent; the transfers are complete when it returns."""
    if group.rank != src:
        raise RuntimeError(f"broadcast_buckets called on rank {group.rank}; only the source rank {src} sends")
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    if plan is None:
        buckets = list(buckets)
        plan = bucket_plan(buckets)
    _send_bytes(group, plan_header(plan), src)
    sent, count = 0, 0
    inflight: list[tuple[Any, Bucket]] = []
    for bucket in buckets:
        if count >= len(plan):
            raise ValueError(f"bucket {count} is beyond the stream's plan of {len(plan)} buckets")
        dtype, numel, manifest = plan[count]
        if bucket.dtype != dtype or bucket.buffer.numel() != numel or [m.name for m in bucket.manifest] != [
                m.name for m in manifest]:
            raise ValueError(f"bucket {count} ({bucket.dtype}, {bucket.buffer.numel()} elements) differs from its "
                             f"plan ({dtype}, {numel} elements): the packing and the plan disagree")
        buffer = bucket.buffer if bucket.buffer.device == group.device else bucket.buffer.to(group.device)
        inflight.append((_post(group, buffer.contiguous(), src), bucket))
        if len(inflight) > depth:
            inflight.pop(0)[0].wait()
        sent += bucket.nbytes
        count += 1
    for work, _ in inflight:
        work.wait()
    if count != len(plan):
        raise ValueError(f"the stream's plan has {len(plan)} buckets, {count} were produced")
    if group.device.type == "cuda":
        torch.cuda.synchronize(group.device)
    return sent


def iter_received_buckets(group: SyncGroup, src: int = 0, depth: int = 2) -> Iterator[Bucket]:
    """Receiver side: yield each bucket (buffer on ``group.device``) of one stream, in order; the next
    ``depth - 1`` receives are posted before a bucket is handed over (its buffer stays valid until the next one
    is requested)."""
    if group.rank == src:
        raise RuntimeError(f"rank {group.rank} is the source; it sends with broadcast_buckets, not receive")
    plan = parse_plan_header(_receive_bytes(group, src))
    posted: list[tuple[Any, Bucket]] = []
    nxt = 0
    for _ in range(len(plan)):
        while nxt < len(plan) and len(posted) < max(depth, 1):
            dtype, numel, manifest = plan[nxt]
            buffer = torch.empty(numel, dtype=dtype, device=group.device)
            posted.append((_post(group, buffer, src), Bucket(dtype, buffer, manifest)))
            nxt += 1
        work, bucket = posted.pop(0)
        work.wait()
        yield bucket
    if group.device.type == "cuda":
        torch.cuda.synchronize(group.device)


def receive_buckets(group: SyncGroup, src: int = 0) -> list[Bucket]:
    """Receiver side: all buckets of one :func:`broadcast_buckets` stream."""
    return list(iter_received_buckets(group, src))


def iter_received_tensors(group: SyncGroup, src: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Receiver side: ``(name, tensor)`` of every bucket of one stream, in order (views into the buffers)."""
    for bucket in iter_received_buckets(group, src):
        yield from bucket.tensors()
