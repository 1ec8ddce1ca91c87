"""trainer.sync.iter_zero3_buckets (one all-gather per bucket from the ZeRO-3 partitions) against the
GatheredParameters path, on 2 gloo ranks; parameter sizes that do not split evenly test the padding."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from trainer import sync

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(33, 17), torch.nn.LayerNorm(17), torch.nn.Linear(17, 5))


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")  # fmt: skip
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_allow_untested_optimizer": True}  # fmt: skip
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = _model()
    engine, *_ = deepspeed.initialize(model=model, config=cfg)
    out = {}
    for bucket_bytes in (300, 1 << 20):  # several buckets (weights over 300 bytes alone) / one bucket
        fast = [(b.dtype, [(m.name, m.shape, m.offset) for m in b.manifest], b.buffer.clone())
                for b in sync.iter_zero3_buckets(engine, bucket_bytes)]
        slow = [(b.dtype, [(m.name, m.shape, m.offset) for m in b.manifest], b.buffer.clone())
                for b in sync.iter_buckets(sync.gather_zero3_params(engine, bucket_bytes), bucket_bytes)]
        out[bucket_bytes] = {"fast": fast, "slow": slow}
    torch.save(out, os.path.join(out_dir, f"buckets-{rank}.pt"))


def test_allgather_buckets_equal_the_gathered_parameters_path(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    mp.start_processes(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    want = {n: p.detach() for n, p in _model().named_parameters()}
    for rank in (0, 1):
        got = torch.load(tmp_path / f"buckets-{rank}.pt")
        for bucket_bytes, runs in got.items():
            assert len(runs["fast"]) == len(runs["slow"]) > 0
            if bucket_bytes == 300:
                assert len(runs["fast"]) > 2
            for (fd, fm, fb), (sd, sm, sb) in zip(runs["fast"], runs["slow"], strict=True):
                assert fd == sd and fm == sm, (rank, bucket_bytes)
                assert torch.equal(fb, sb), (rank, bucket_bytes, fm)
            seen = {}
            for dtype, manifest, buffer in runs["fast"]:
                metas = [sync.TensorMeta(n, dtype, tuple(s), o) for n, s, o in manifest]
                seen.update(sync.unpack_bucket(buffer, metas))
            assert sorted(seen) == sorted(want)
            for name, tensor in want.items():
                assert torch.equal(seen[name], tensor), (rank, bucket_bytes, name)


def test_plain_model_takes_the_iter_buckets_path() -> None:
    model = _model()
    fast = list(sync.iter_zero3_buckets(model, 600))
    slow = list(sync.iter_buckets(model.named_parameters(), 600))
    assert [b.manifest for b in fast] == [b.manifest for b in slow]
    assert all(torch.equal(a.buffer, b.buffer) for a, b in zip(fast, slow, strict=True))
