"""The bucket format: how the policy's weights are packed for the way to the rollout engines.

Parameters are packed into flat per-dtype buffers of at most ``bucket_bytes`` (:func:`pack_buckets`): one
transfer per bucket instead of one per tensor (0.70 s -> 0.027 s for a 0.5B model on H200s, see
docs/gpu-machine.md). The packing rule is one function (:func:`pack_order`), so a plan made from the parameters'
metadata (:func:`plan_of`) is what the lazy packers (:func:`iter_buckets`, and
:func:`trainer.weights.gather.iter_zero3_buckets` on the sender) then produce. A bucket's (or a stream's) dtype,
size and manifest travel as JSON bytes (:func:`plan_header`): the broadcast stream's plan
(:mod:`trainer.weights.broadcast`) and the shared buckets' headers (:mod:`trainer.weights.shared`).

The other format: **safetensors bytes** (:func:`to_safetensors_bytes`), one self-describing blob, safe through
Ray and vLLM's ``collective_rpc`` (raw tensors are not, in vLLM's multiprocess mode). Fine for small models and
CPU (the HF engine's transport).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

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


def describe_buckets(buckets: Sequence[Bucket]) -> str:
    """One line per bucket (dtype, tensors, MiB), for logs."""
    return "\n".join(
        f"bucket {i}: {b.dtype} x{len(b.manifest)} tensors, {b.nbytes / 2**20:.1f} MiB" for i, b in enumerate(buckets)
    )
