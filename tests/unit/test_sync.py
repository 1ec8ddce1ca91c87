"""trainer.weights (buckets, broadcast, gather): bucket packing, safetensors blobs, broadcast over a dedicated
gloo group (ZeRO-3 gathering: tests/integration/test_sync_zero3.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.conftest import free_port
from trainer.weights.broadcast import (
    broadcast_buckets,
    broadcast_tensor,
    close_sync_group,
    iter_received_tensors,
    make_sync_group,
    receive_buckets,
)
from trainer.weights.buckets import (
    describe_buckets,
    from_safetensors_bytes,
    iter_buckets,
    pack_buckets,
    to_safetensors_bytes,
    unpack_bucket,
)
from trainer.weights.gather import gather_zero3_params, iter_zero3_buckets


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, same shape and the same bytes (NaN payloads and -0.0 included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def sample_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """Mixed dtypes and shapes; floats carry NaN, inf and -0.0 so only a byte-exact copy compares equal."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for i, (dtype, shape) in enumerate([
        (torch.float32, (7, 13)), (torch.bfloat16, (64,)), (torch.float16, (3, 4, 5)), (torch.float32, ()),
        (torch.int64, (11,)), (torch.bool, (9, 2)), (torch.int8, (33,)), (torch.float32, (0, 4)),
        (torch.bfloat16, (2, 2)), (torch.float32, (1000,)), (torch.float32, (5,)),
    ]):  # fmt: skip
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=g).to(dtype)
            if t.numel() >= 3:
                t.view(-1)[:3] = torch.tensor([float("nan"), float("-inf"), -0.0]).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=g).bool()
        else:
            t = torch.randint(-100, 100, shape, generator=g).to(dtype)
        out[f"layer{i}.{str(dtype).split('.')[-1]}"] = t
    return out


def test_pack_unpack_round_trip_is_bit_exact_and_respects_bucket_size() -> None:
    tensors = sample_tensors()
    bucket_bytes = 256  # the 1000-float tensor (4000 B) must get a bucket of its own
    buckets = pack_buckets(tensors, bucket_bytes)
    seen: dict[str, torch.Tensor] = {}
    for b in buckets:
        assert b.buffer.dtype == b.dtype and b.buffer.dim() == 1
        assert all(m.dtype == b.dtype for m in b.manifest)
        assert b.nbytes <= bucket_bytes or len(b.manifest) == 1, describe_buckets(buckets)
        for name, t in unpack_bucket(b.buffer, b.manifest):
            assert name not in seen, f"{name} packed twice"
            seen[name] = t
    assert list(sorted(seen)) == sorted(tensors)
    for name, t in tensors.items():
        assert bits_equal(seen[name], t), name
    big = [b for b in buckets if any(m.name == "layer9.float32" for m in b.manifest)]
    assert len(big) == 1 and len(big[0].manifest) == 1
    # Order within a dtype is kept; dtypes never mix.
    f32 = [m.name for b in buckets if b.dtype == torch.float32 for m in b.manifest]
    assert f32 == [n for n, t in tensors.items() if t.dtype == torch.float32]


def test_bucket_boundaries_split_exactly_at_the_limit() -> None:
    tensors = {f"t{i}": torch.full((4,), float(i)) for i in range(5)}  # 16 B each
    buckets = pack_buckets(tensors, bucket_bytes=32)
    assert [len(b.manifest) for b in buckets] == [2, 2, 1]
    assert [m.offset for m in buckets[0].manifest] == [0, 4]
    one = pack_buckets(tensors, bucket_bytes=1 << 20)
    assert len(one) == 1 and one[0].nbytes == 80


def test_unpack_from_raw_bytes_and_rejects_bad_input() -> None:
    tensors = sample_tensors(1)
    for b in pack_buckets(tensors, 1 << 20):
        raw = b.buffer.view(torch.uint8).clone()
        for name, t in unpack_bucket(raw, b.manifest):
            assert bits_equal(t, tensors[name]), name
    b = pack_buckets({"x": torch.ones(4)}, 1 << 20)[0]
    with pytest.raises(ValueError, match="dtype"):
        unpack_bucket(b.buffer.to(torch.float64), b.manifest)
    with pytest.raises(ValueError, match="holds only"):
        unpack_bucket(b.buffer[:2], b.manifest)
    with pytest.raises(ValueError, match="bucket_bytes"):
        pack_buckets({"x": torch.ones(1)}, 0)


def test_safetensors_round_trip_including_shared_views() -> None:
    tensors = sample_tensors(2)
    blob = to_safetensors_bytes(tensors)
    back = from_safetensors_bytes(blob)
    assert sorted(back) == sorted(tensors)
    for name, t in tensors.items():
        assert bits_equal(back[name], t), name
    # Views into one bucket buffer share storage: still serialisable, still exact.
    views = [pair for b in pack_buckets(tensors, 1 << 20) for pair in b.tensors()]
    back2 = from_safetensors_bytes(to_safetensors_bytes(views))
    for name, t in tensors.items():
        assert bits_equal(back2[name], t), name
    with pytest.raises(ValueError, match="twice"):
        to_safetensors_bytes([("a", torch.ones(1)), ("a", torch.ones(1))])
    with pytest.raises(TypeError, match="safetensors bytes"):
        from_safetensors_bytes("not bytes")  # type: ignore[arg-type]



def _broadcast_worker(rank: int, port: int, out_dir: str) -> None:
    group = make_sync_group("127.0.0.1", port, rank, 2, backend="gloo", timeout_s=60)
    tensors = sample_tensors(3)
    if rank == 0:
        sent = broadcast_buckets(group, iter_buckets(tensors, bucket_bytes=512))
        # Second stream, then a single raw tensor: the protocol must resynchronise after each end marker.
        broadcast_buckets(group, pack_buckets({"again": tensors["layer0.float32"]}, 1 << 20))
        raw = torch.arange(10, dtype=torch.float64)
        broadcast_tensor(group, raw, 0)
        torch.save({"sent": sent}, os.path.join(out_dir, "rank0.pt"))
    else:
        received = dict(iter_received_tensors(group))
        buckets = receive_buckets(group)
        raw = torch.zeros(10, dtype=torch.float64)
        broadcast_tensor(group, raw, 0)
        torch.save({"first": received, "second": buckets[0].tensors(), "raw": raw,
                    "bucket_sizes": [b.nbytes for b in buckets]}, os.path.join(out_dir, "rank1.pt"))  # fmt: skip
    close_sync_group(group)


def test_gloo_broadcast_of_buckets_between_two_processes_is_bit_exact(tmp_path: Path) -> None:
    port = free_port()
    mp.start_processes(_broadcast_worker, args=(port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    got = torch.load(tmp_path / "rank1.pt")
    tensors = sample_tensors(3)
    assert sorted(got["first"]) == sorted(tensors)
    for name, t in tensors.items():
        assert bits_equal(got["first"][name], t), name
    (name, again), = got["second"]
    assert name == "again" and bits_equal(again, tensors["layer0.float32"])
    assert torch.equal(got["raw"], torch.arange(10, dtype=torch.float64))
    sent = torch.load(tmp_path / "rank0.pt")["sent"]
    assert sent == sum(t.numel() * t.element_size() for t in tensors.values())


def test_make_sync_group_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="outside a group"):
        make_sync_group("127.0.0.1", free_port(), 2, 2)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="nccl"):
            make_sync_group("127.0.0.1", free_port(), 0, 1, backend="nccl", timeout_s=5)


def test_gather_plain_model_yields_every_parameter_in_order() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    got = list(gather_zero3_params(model, bucket_bytes=8))
    assert [n for n, _ in got] == [n for n, _ in model.named_parameters()]
    for (_, a), (_, b) in zip(got, model.named_parameters(), strict=True):
        assert bits_equal(a, b)


def test_plain_model_takes_the_iter_buckets_path() -> None:
    """Without ZeRO-3 partitions iter_zero3_buckets gives iter_buckets' buckets (the ZeRO-3 path:
    tests/integration/test_sync_zero3.py)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(33, 17), torch.nn.LayerNorm(17), torch.nn.Linear(17, 5))
    fast = list(iter_zero3_buckets(model, 600))
    slow = list(iter_buckets(model.named_parameters(), 600))
    assert [b.manifest for b in fast] == [b.manifest for b in slow]
    assert all(torch.equal(a.buffer, b.buffer) for a, b in zip(fast, slow, strict=True))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))


def test_the_flat_all_gather_runs_on_the_gpu_images_torch_too(monkeypatch):
    """torch 2.13 has ``all_gather_single`` (and deprecates ``all_gather_into_tensor``); torch 2.11, the GPU
    image's, has only ``all_gather_into_tensor``: the sync uses whichever this torch has."""
    from types import SimpleNamespace

    from trainer.weights.gather import all_gather_into_tensor

    def new(*a, **k):
        return "single"

    def old(*a, **k):
        return "into_tensor"

    assert all_gather_into_tensor(SimpleNamespace(all_gather_single=new, all_gather_into_tensor=old))() == "single"
    assert all_gather_into_tensor(SimpleNamespace(all_gather_into_tensor=old))() == "into_tensor"
    import torch.distributed as dist

    assert all_gather_into_tensor(dist) in (getattr(dist, "all_gather_single", None), dist.all_gather_into_tensor)
