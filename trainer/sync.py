"""Weight sync from the trainer to the rollout engines: buckets, safetensors blobs, a dedicated group.

Two ways to move a policy's weights into the engines:

- **safetensors bytes** (:func:`to_safetensors_bytes`): one self-describing blob, safe through Ray and vLLM's
  ``collective_rpc`` (raw tensors are not, in vLLM's multiprocess mode). Fine for small models and CPU.
- **bucketed broadcast** over a dedicated process group (:func:`make_sync_group`, gloo on CPU, NCCL on GPU)
  that holds only the sender (trainer rank 0, group rank 0) and the engine workers. Parameters are packed
  into flat per-dtype buffers of at most ``bucket_bytes`` (:func:`pack_buckets`): one broadcast per bucket
  instead of one per tensor (0.70 s -> 0.027 s for a 0.5B model on H200s, see docs/gpu-machine.md).

Wire protocol of :func:`broadcast_buckets` / :func:`iter_received_buckets` (all from ``src``): first the
stream's plan (an int64 length, then one JSON list of every bucket's dtype, size and manifest, as uint8), then
each bucket's buffer, nothing else. The receivers know every size up front, so the transfer runs ahead of the
work at both ends: the sender posts a bucket and goes on gathering the next while it is on the wire, the
receivers post the next bucket's receive before they hand the last one to the loader (``depth`` buckets in
flight; one host synchronisation per stream, not three per bucket). The packing rule is one function
(:func:`pack_order`), so a plan made from the parameters' metadata (:func:`plan_of`) is what the lazy packers
(:func:`iter_buckets`, :func:`iter_zero3_buckets`) then produce.

Every call on a group is collective: all its ranks must make the same calls in the same order.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

DEFAULT_BUCKET_BYTES = 256 << 20
NamedTensors = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


# --- buckets -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor lives in a bucket: ``offset`` and ``numel`` count elements of ``dtype``."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Bucket:
    """A flat 1-D ``buffer`` of one dtype holding the tensors listed in ``manifest``, back to back."""

    dtype: torch.dtype
    buffer: torch.Tensor
    manifest: list[TensorMeta] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The bucket's tensors as views into its buffer (see :func:`unpack_bucket`)."""
        return unpack_bucket(self.buffer, self.manifest)


def _items(named_tensors: NamedTensors) -> Iterable[tuple[str, torch.Tensor]]:
    return named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors


def _dtype_from_str(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a bucket manifest: expected a torch dtype like 'float32'")
    return dtype


def _build_bucket(dtype: torch.dtype, pending: list[tuple[str, torch.Tensor]]) -> Bucket:
    device = pending[0][1].device
    # One cat: a single (batched) copy kernel on GPU instead of one per tensor.
    buffer = torch.cat([t.detach().reshape(-1).to(device) for _, t in pending])
    manifest, offset = [], 0
    for name, tensor in pending:
        manifest.append(TensorMeta(name, dtype, tuple(tensor.shape), offset))
        offset += tensor.numel()
    return Bucket(dtype, buffer, manifest)


def pack_order(sizes: Iterable[tuple[torch.dtype, int]], bucket_bytes: int) -> Iterator[list[int]]:
    """The packing rule, on metadata alone: for tensors given as (dtype, bytes) in order, the index lists of
    the buckets in the order they are emitted. A dtype's bucket is emitted when the next tensor of that dtype
    would overflow it; a tensor of ``bucket_bytes`` or more gets a bucket of its own; what is left is emitted
    at the end, dtype by dtype in order of first appearance."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    pending: dict[torch.dtype, list[int]] = {}
    used: dict[torch.dtype, int] = {}
    for i, (dtype, size) in enumerate(sizes):
        if pending.get(dtype) and used[dtype] + size > bucket_bytes:
            yield pending.pop(dtype)
        if size >= bucket_bytes:  # alone: never mixed with smaller tensors
            yield [i]
            continue
        if dtype not in pending:
            pending[dtype], used[dtype] = [], 0
        pending[dtype].append(i)
        used[dtype] += size
    for items in pending.values():
        if items:
            yield items


def plan_of(meta: Sequence[tuple[str, torch.dtype, tuple[int, ...]]], bucket_bytes: int) -> list[tuple[torch.dtype, int, list[TensorMeta]]]:
    """The buckets (dtype, elements, manifest) that packing tensors of this (name, dtype, shape) metadata, in
    order, makes: what :func:`iter_buckets` and :func:`iter_zero3_buckets` will yield, known before any of it
    is gathered."""
    sizes = [(dtype, math.prod(shape) * torch.empty((), dtype=dtype).element_size()) for _, dtype, shape in meta]
    plan = []
    for idx in pack_order(sizes, bucket_bytes):
        manifest, offset = [], 0
        for i in idx:
            name, dtype, shape = meta[i]
            manifest.append(TensorMeta(name, dtype, tuple(shape), offset))
            offset += math.prod(shape)
        plan.append((meta[idx[0]][1], offset, manifest))
    return plan


def iter_buckets(named_tensors: NamedTensors, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[Bucket]:
    """Pack tensors into per-dtype buckets of at most ``bucket_bytes`` (:func:`pack_order`), yielding each as
    soon as it is full. The tensors are copied, so the caller may free or reuse them once the next bucket is
    requested."""
    items = []
    for name, tensor in _items(named_tensors):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"weight {name!r} is a {type(tensor).__name__}, expected a torch.Tensor")
        items.append((name, tensor))
    sizes = ((t.dtype, t.numel() * t.element_size()) for _, t in items)
    for idx in pack_order(sizes, bucket_bytes):
        yield _build_bucket(items[idx[0]][1].dtype, [items[i] for i in idx])


def pack_buckets(named_tensors: NamedTensors, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Bucket]:
    """All of :func:`iter_buckets` as a list."""
    return list(iter_buckets(named_tensors, bucket_bytes))


def unpack_bucket(buffer: torch.Tensor, manifest: Sequence[TensorMeta]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views into ``buffer`` (typed like the manifest, or raw uint8 bytes); no copy."""
    if buffer.dim() != 1 or not buffer.is_contiguous():
        raise ValueError(f"bucket buffer must be a contiguous 1-D tensor, got shape {tuple(buffer.shape)}")
    out = []
    for meta in manifest:
        typed = buffer
        if buffer.dtype != meta.dtype:
            if buffer.dtype != torch.uint8:
                raise ValueError(
                    f"bucket buffer has dtype {buffer.dtype} but manifest entry {meta.name!r} is {meta.dtype}; "
                    "expected the bucket's own dtype or raw uint8 bytes"
                )
            typed = buffer.view(meta.dtype)
        end = meta.offset + meta.numel
        if end > typed.numel():
            raise ValueError(
                f"manifest entry {meta.name!r} ends at element {end} but the bucket buffer holds only "
                f"{typed.numel()} {meta.dtype} elements"
            )
        out.append((meta.name, typed[meta.offset : end].view(meta.shape)))
    return out


def bucket_header(bucket: Bucket) -> bytes:
    """One bucket's dtype, size and manifest as JSON bytes (the shared-bucket handles carry it)."""
    return plan_header([(bucket.dtype, bucket.buffer.numel(), bucket.manifest)])


def parse_bucket_header(raw: bytes) -> tuple[torch.dtype, int, list[TensorMeta]]:
    return parse_plan_header(raw)[0]


def plan_header(plan: Sequence[tuple[torch.dtype, int, Sequence[TensorMeta]]]) -> bytes:
    """The stream's plan as JSON bytes (see the module docstring)."""
    return json.dumps([{"dtype": str(dtype), "numel": numel,
                        "tensors": [[m.name, list(m.shape), m.offset] for m in manifest]}
                       for dtype, numel, manifest in plan]).encode()


def parse_plan_header(raw: bytes) -> list[tuple[torch.dtype, int, list[TensorMeta]]]:
    out = []
    for head in json.loads(raw.decode()):
        dtype = _dtype_from_str(head["dtype"])
        out.append((dtype, int(head["numel"]),
                    [TensorMeta(name, dtype, tuple(shape), offset) for name, shape, offset in head["tensors"]]))
    return out


def bucket_plan(buckets: Sequence[Bucket]) -> list[tuple[torch.dtype, int, list[TensorMeta]]]:
    """The plan of buckets already packed."""
    return [(b.dtype, b.buffer.numel(), list(b.manifest)) for b in buckets]


# --- safetensors -------------------------------------------------------------------------------------------
def to_safetensors_bytes(named_tensors: NamedTensors) -> bytes:
    """One safetensors blob of the tensors (moved to CPU; shared or partial-storage views are copied)."""
    from safetensors.torch import save

    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in _items(named_tensors):
        if name in out:
            raise ValueError(f"weight name {name!r} appears twice; expected unique names")
        t = tensor.detach().to("cpu").contiguous()
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() != t.numel() * t.element_size():
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return save(out)


def from_safetensors_bytes(blob: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a :func:`to_safetensors_bytes` blob (CPU)."""
    from safetensors.torch import load

    if not isinstance(blob, bytes | bytearray | memoryview):
        raise TypeError(f"expected safetensors bytes, got {type(blob).__name__}")
    return load(bytes(blob))


# --- a dedicated process group ------------------------------------------------------------------------------
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


# --- gathering a (ZeRO-3) model ----------------------------------------------------------------------------
def _full_nbytes(param: torch.Tensor) -> int:
    numel = getattr(param, "ds_numel", None)
    return (numel if numel is not None else param.numel()) * param.element_size()


def gather_zero3_params(
    model: torch.nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` for every parameter of ``model`` (a DeepSpeedEngine is unwrapped).

    ZeRO-3 partitioned parameters are gathered a bucket's worth (``bucket_bytes``) at a time with
    ``deepspeed.zero.GatheredParameters``, which is collective: **every rank must consume the whole
    generator**. A yielded tensor is only valid until the next one is requested (its bucket is partitioned
    again): copy it (or pack it, see :func:`iter_buckets`) to keep it. Models without ZeRO-3 parameters
    take a plain path (``named_parameters``, no communication).
    """
    if model.__class__.__name__ == "DeepSpeedEngine":
        model = model.module
    params = list(model.named_parameters())
    if not any(hasattr(p, "ds_id") for _, p in params):
        for name, p in params:
            yield name, p.detach()
        return
    import deepspeed

    group: list[tuple[str, torch.Tensor]] = []
    used = 0

    def flush() -> Iterator[tuple[str, torch.Tensor]]:
        zero = [p for _, p in group if hasattr(p, "ds_id")]
        if not zero:
            for name, p in group:
                yield name, p.detach()
            return
        with deepspeed.zero.GatheredParameters(zero, modifier_rank=None):
            for name, p in group:
                yield name, p.detach()

    for name, p in params:
        size = _full_nbytes(p)
        if group and used + size > bucket_bytes:
            yield from flush()
            group, used = [], 0
        group.append((name, p))
        used += size
    if group:
        yield from flush()


def iter_zero3_buckets(
    model: torch.nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[Bucket]:
    """Full parameters of ``model`` packed in per-dtype buckets, gathered with ONE all-gather per bucket.

    Same buckets as ``iter_buckets(gather_zero3_params(model))`` (names, order, dtypes, bytes), built from
    the ranks' ZeRO-3 partitions (``param.ds_tensor``: element ``[r * s, (r + 1) * s)`` of the flattened
    parameter on rank ``r``, ``s = ceil(numel / world)``, zero-padded) with a single
    ``all_gather_into_tensor`` of the concatenated partitions, then one re-ordering copy. Measured on
    2 x H200 for a 0.5B bf16 model (docs/benchmarks.md): far faster than ``GatheredParameters``, whose
    per-parameter gather and re-partition dominate a weight push. Collective over the parameters' ZeRO
    group: **every rank must consume the whole generator**; every rank gets the buckets. Plain models
    (no ZeRO-3 parameters) fall back to :func:`iter_buckets`.
    """
    if model.__class__.__name__ == "DeepSpeedEngine":
        model = model.module
    params = list(model.named_parameters())
    if not any(hasattr(p, "ds_id") for _, p in params):
        yield from iter_buckets(((n, p.detach()) for n, p in params), bucket_bytes)
        return
    if not all(hasattr(p, "ds_tensor") for _, p in params):
        raise ValueError("iter_zero3_buckets needs every parameter partitioned by ZeRO-3 (some are not)")
    sizes = [(p.dtype, _full_nbytes(p)) for _, p in params]  # the packing rule of iter_buckets, on full sizes
    for idx in pack_order(sizes, bucket_bytes):
        yield _allgather_bucket([params[i] for i in idx])


def model_bucket_plan(model: torch.nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[tuple[torch.dtype, int, list[TensorMeta]]]:
    """The plan of :func:`iter_zero3_buckets` (ZeRO-3 or plain model), from the parameters' metadata only:
    what a sender announces before it gathers anything."""
    if model.__class__.__name__ == "DeepSpeedEngine":
        model = model.module
    meta = [(name, p.dtype, tuple(getattr(p, "ds_shape", None) or p.shape)) for name, p in model.named_parameters()]
    return plan_of(meta, bucket_bytes)


def all_gather_into_tensor(dist):
    """torch.distributed's gather of one tensor per rank into one flat output: ``all_gather_single`` where this
    torch has it (2.13 deprecates ``all_gather_into_tensor``), else ``all_gather_into_tensor`` (torch 2.11, the
    GPU image's, has no ``all_gather_single``)."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _allgather_bucket(items: list[tuple[str, torch.Tensor]]) -> Bucket:
    import torch.distributed as dist

    group = getattr(items[0][1], "ds_process_group", None)
    world = dist.get_world_size(group)
    parts = [p.ds_tensor.detach().reshape(-1) for _, p in items]
    device = parts[0].device
    local = torch.cat([t.to(device) for t in parts])
    gathered = torch.empty(world * local.numel(), dtype=local.dtype, device=device)
    if dist.get_backend(group) == "nccl":
        all_gather_into_tensor(dist)(gathered, local, group=group)
    else:  # gloo: the list form, into views of the same buffer
        dist.all_gather(list(gathered.view(world, -1).unbind(0)), local, group=group)
    grid = gathered.view(world, local.numel())
    pieces, manifest, col, offset = [], [], 0, 0
    for (name, p), part in zip(items, parts, strict=True):
        numel = p.ds_numel
        pieces.append(grid[:, col : col + part.numel()].reshape(-1)[:numel])
        manifest.append(TensorMeta(name, p.dtype, tuple(p.ds_shape), offset))
        col += part.numel()
        offset += numel
    return Bucket(local.dtype, torch.cat(pieces), manifest)


def describe_buckets(buckets: Sequence[Bucket]) -> str:
    """One line per bucket (dtype, tensors, MiB), for logs."""
    return "\n".join(
        f"bucket {i}: {b.dtype} x{len(b.manifest)} tensors, {b.nbytes / 2**20:.1f} MiB" for i, b in enumerate(buckets)
    )
