"""In-place weight updates for engines that share a machine (and a GPU) with the trainer: shared buckets.

A colocated engine (``--colocate_all_models``) runs on the same GPUs as the policy's ranks, where NCCL
cannot pair two processes ("Duplicate GPU detected"). Pushing the weights through Ray instead costs a full
host copy of the model and seconds a step. Here the bytes never leave the device: a policy rank publishes
each gathered bucket (:func:`trainer.weights.gather.iter_zero3_buckets`) as a **handle**, the engine's workers open
it and load the tensors straight from the trainer's memory, and only the handle (a few hundred bytes)
travels through Ray.

Two kinds of handle, one protocol:

- ``cuda``: a CUDA IPC handle of the bucket's device buffer (``torch.multiprocessing.reductions``), keyed
  by the GPU's UUID, so each engine worker opens the copy that lives on its own GPU (every policy rank holds
  the whole bucket after the all-gather, so engine worker ``j`` of a TP group reads from the policy rank on
  its GPU). The receiver rebuilds the tensor on its own device index: processes see one GPU under different
  ``CUDA_VISIBLE_DEVICES`` indices.
- ``shm``: the CPU equivalent, used where there are no GPUs (tests, CPU clusters): the bucket's bytes in a
  file under ``/dev/shm`` that the receiver maps; keyed by node, one file per node.

The sender is :func:`push_shared`, which every policy rank runs (``ModelWorker.push_weights_shared``); the
receiver is the engine worker's :func:`open_bucket` (``WeightSyncExtension.rlrun_load_shared``).

The sender must keep a bucket alive until every engine has loaded it (:class:`SharedBucket` is only a
reference). GPU engines load each bucket when it arrives (``model.load_weights``); CPU engines must load
all tensors in one ``reload_weights`` call (see :mod:`trainer.weights.vllm_worker_ext`), so with ``shm`` the
sender keeps every bucket until the update is finished (:func:`defers_load`).
"""

from __future__ import annotations

import functools
import inspect
import os
import pickle
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from trainer.weights.buckets import Bucket, bucket_header, parse_bucket_header
from trainer.weights.gather import iter_zero3_buckets

Kind = Literal["cuda", "shm"]
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "rlrun-wsync-"


@dataclass
class SharedBucket:
    """A bucket published for other processes: its header and one handle per location.

    ``handles`` maps a location key (:func:`location_key`: a GPU UUID, or ``node:<address>``) to what a
    process at that location needs to open the buffer (pickled CUDA IPC arguments, or a file path).
    Small and picklable: this is what crosses Ray and vLLM's RPC.
    """

    kind: Kind
    header: bytes
    handles: dict[str, bytes] = field(default_factory=dict)

    def merge(self, other: SharedBucket | None) -> SharedBucket:
        """This bucket's handles plus ``other``'s (the same bucket published at another location)."""
        if other is None:
            return self
        if other.kind != self.kind or other.header != self.header:
            raise ValueError("cannot merge handles of two different buckets (header or kind differ)")
        return SharedBucket(self.kind, self.header, {**self.handles, **other.handles})


def kind_for(device: torch.device) -> Kind:
    """``cuda`` for a CUDA device, ``shm`` otherwise."""
    return "cuda" if device.type == "cuda" else "shm"


def defers_load(kind: Kind) -> bool:
    """True where the receiver loads at the end of the update, so the sender must keep every bucket."""
    return kind == "shm"


def location_key(kind: Kind, device: torch.device | None = None) -> str:
    """Where this process's memory lives, as handles are keyed: the GPU's UUID, or this node's address."""
    if kind == "cuda":
        dev = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        return "gpu:" + str(torch.cuda.get_device_properties(dev).uuid)
    return "node:" + _node_address()


def _node_address() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:  # pragma: no cover - ray is part of the stack
        pass
    return socket.gethostname()


# --- sender ------------------------------------------------------------------------------------------------
class Publisher:
    """Publishes buckets from one process and releases them when the update is done."""

    def __init__(self, kind: Kind, device: torch.device | None = None, shm_dir: Path = SHM_DIR):
        self.kind = kind
        self.key = location_key(kind, device)
        self.shm_dir = Path(shm_dir)
        self._alive: list[tuple[torch.Tensor, Path | None]] = []  # what handles point at

    def publish(self, bucket: Bucket) -> SharedBucket:
        """A handle to ``bucket`` at this location; the bucket stays alive until :meth:`release`."""
        header = bucket_header(bucket)
        buffer = bucket.buffer.contiguous()
        if self.kind == "cuda":
            if buffer.device.type != "cuda":
                raise ValueError(f"a cuda handle needs a CUDA buffer, the bucket is on {buffer.device}")
            from torch.multiprocessing.reductions import reduce_tensor

            torch.cuda.current_stream(buffer.device).synchronize()  # the gather must have landed
            _, args = reduce_tensor(buffer)
            self._alive.append((buffer, None))
            return SharedBucket("cuda", header, {self.key: pickle.dumps(args)})
        path = self.shm_dir / f"{SHM_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        raw = buffer.detach().reshape(-1).view(torch.uint8)
        mapped = torch.from_file(str(path), shared=True, size=raw.numel(), dtype=torch.uint8)
        mapped.copy_(raw.cpu())
        self._alive.append((mapped, path))
        return SharedBucket("shm", header, {self.key: str(path).encode()})

    def release(self) -> None:
        """Drop every published buffer (remove ``shm`` files); call once every receiver is done."""
        alive, self._alive = self._alive, []
        for _, path in alive:
            if path is not None:
                path.unlink(missing_ok=True)
        del alive
        if self.kind == "cuda":
            torch.cuda.ipc_collect()  # hand blocks the receivers let go of back to the allocator


def remove_stale_files(shm_dir: Path = SHM_DIR) -> int:
    """Remove ``shm`` bucket files of processes that no longer exist (a crashed sender); returns the count."""
    removed = 0
    for path in Path(shm_dir).glob(SHM_PREFIX + "*"):
        pid = path.name[len(SHM_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            path.unlink(missing_ok=True)
            removed += 1
    return removed


@functools.cache
def _publishes(kind: Kind, device: torch.device, rank: int, world: int) -> bool:
    """Whether this rank publishes its copy of each bucket: the first rank at each location (GPU, or node) does.
    Collective over the policy's ranks, so made once per process (every rank makes it at its first push); rank 0
    removes the files of crashed senders then."""
    import torch.distributed as dist

    key = location_key(kind, device)
    keys = [key]
    if world > 1:
        keys = [None] * world
        dist.all_gather_object(keys, key)
    if rank == 0:
        remove_stale_files()
    return keys.index(key) == rank


def push_shared(model: Any, rank: int, engines: list[Any], bucket_bytes: int,
                timings: dict[str, float] | None = None) -> int:
    """One policy rank's part of a shared-bucket push to colocated ``engines`` (their Ray handles): gather
    ``model``'s ZeRO-3 parameters a bucket at a time and hand each bucket to the engines in place (CUDA IPC on
    GPUs, ``/dev/shm`` without); only handles cross Ray. Every rank must call it. The first rank at each location
    publishes its copy; rank 0 collects the handles, has every engine load the bucket and, at the end, finish the
    update. Returns the bytes handed over (0 on ranks other than 0). ``timings``, where given, gets this rank's
    seconds by part (``gather``: the buckets' all-gathers, landed; ``handles``: publishing and exchanging them;
    ``load``: the engines loading them, rank 0; ``release``: the barrier after each bucket and freeing it;
    ``finish``: the engines' end of the update) and the bucket count (``buckets``)."""
    import ray
    import torch.distributed as dist

    device = model.device
    kind = kind_for(device)
    world = dist.get_world_size() if dist.is_initialized() else 1
    publishes = _publishes(kind, device, rank, world)
    publisher = Publisher(kind, device)
    deferred = defers_load(kind)
    sent = 0
    spent = dict.fromkeys(("gather", "handles", "load", "release", "finish", "buckets"), 0.0)
    clock = time.perf_counter
    try:
        buckets = iter_zero3_buckets(model, bucket_bytes)
        while True:
            t0 = clock()
            bucket = next(buckets, None)
            if bucket is None:
                break
            if kind == "cuda" and publishes:  # publish() waits for the gather to land: here, so it is timed as one
                torch.cuda.current_stream(bucket.buffer.device).synchronize()
            t1 = clock()
            mine = publisher.publish(bucket) if publishes else None
            shared = [mine]
            if world > 1:
                shared = [None] * world
                dist.all_gather_object(shared, mine)
            t2 = clock()
            if rank == 0:
                merged = None
                for part in shared:
                    merged = part if merged is None else merged.merge(part)
                ray.get([e.load_shared_bucket.remote(vars(merged)) for e in engines])
                sent += bucket.nbytes
            t3 = clock()
            if not deferred:
                if world > 1:
                    dist.barrier()  # every engine has loaded it: the buffers may go
                publisher.release()
            del bucket
            t4 = clock()
            for part, seconds in zip(("gather", "handles", "load", "release"), (t1 - t0, t2 - t1, t3 - t2, t4 - t3),
                                     strict=True):
                spent[part] += seconds
            spent["buckets"] += 1
        t0 = clock()
        if rank == 0:
            ray.get([e.finish_weight_update.remote() for e in engines])
        if world > 1:
            dist.barrier()
        spent["finish"] = clock() - t0
    finally:
        publisher.release()
    if timings is not None:
        timings.update(spent)
    return sent


# --- receiver ----------------------------------------------------------------------------------------------
def _storage_device_index() -> int:
    """Position of the device argument of torch's ``rebuild_cuda_tensor`` (to re-target it locally)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return list(inspect.signature(rebuild_cuda_tensor).parameters).index("storage_device")


def open_bucket(shared: SharedBucket, device: torch.device | None = None) -> Bucket:
    """The bucket a :class:`SharedBucket` refers to, read from the copy at this process's location.

    ``cuda``: a tensor on this process's GPU backed by the sender's memory (no copy); ``shm``: a CPU
    tensor mapped from the file (no copy). The caller must drop it before the sender releases the bucket.
    """
    dtype, numel, manifest = parse_bucket_header(shared.header)
    key = location_key(shared.kind, device)
    if key not in shared.handles:
        raise RuntimeError(
            f"no copy of this weight bucket at {key}: the engine worker must share a GPU (or, without GPUs, a "
            f"node) with a policy rank; published at {sorted(shared.handles)}"
        )
    handle = shared.handles[key]
    if shared.kind == "cuda":
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        dev = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        args = list(pickle.loads(handle))
        args[_storage_device_index()] = dev.index if dev.index is not None else torch.cuda.current_device()
        buffer = rebuild_cuda_tensor(*args)
    else:
        path = handle.decode()
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if not os.path.exists(path):
            raise FileNotFoundError(f"weight bucket file {path} is gone: the sender released it too early")
        buffer = torch.from_file(path, shared=False, size=nbytes, dtype=torch.uint8).view(dtype)
    if buffer.numel() != numel or buffer.dtype != dtype:
        raise ValueError(f"shared bucket holds {buffer.numel()} {buffer.dtype}, its header says {numel} {dtype}")
    return Bucket(dtype, buffer, manifest)
