"""Shared buckets (trainer.weights.shared), the CPU kind: bytes handed to another process through /dev/shm.

The CUDA kind uses the same header and protocol with CUDA IPC handles; it runs on the GPU machines
(bench/gpu/vllm_bench.py checks its bytes there). Here: a bucket published in one process and opened in
another (spawned, so nothing is inherited) comes back bit for bit; handles are keyed by location and the
wrong location is refused by name; release removes the files; a crashed sender's files are swept.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
from pathlib import Path

import pytest
import torch

from trainer.weights.buckets import pack_buckets
from trainer.weights.shared import (
    SHM_PREFIX,
    Publisher,
    SharedBucket,
    defers_load,
    kind_for,
    location_key,
    open_bucket,
    remove_stale_files,
)


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(13, 7, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(7, 7, generator=g),
        "model.norm.weight": torch.randn(7, generator=g),
    }


def _open_in_child(wire: dict, out: str) -> None:
    bucket = open_bucket(SharedBucket(**wire))
    torch.save({n: t.clone() for n, t in bucket.tensors()}, out)


def test_a_bucket_published_here_opens_bit_for_bit_in_another_process(tmp_path: Path) -> None:
    tensors = _tensors()
    (bucket,) = pack_buckets(tensors, bucket_bytes=1 << 20)
    pub = Publisher("shm", shm_dir=tmp_path)
    shared = pub.publish(bucket)
    assert len(pickle.dumps(shared)) < 1024  # what crosses Ray: a header and a path, whatever the size
    out = tmp_path / "got.pt"
    child = mp.get_context("spawn").Process(target=_open_in_child, args=(vars(shared), str(out)))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    got = torch.load(out)
    assert list(got) == list(tensors)
    for name, t in tensors.items():
        assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), name
    pub.release()
    assert not list(tmp_path.glob(SHM_PREFIX + "*"))


def test_opening_reads_the_senders_current_bytes_without_a_copy_per_process(tmp_path: Path) -> None:
    (bucket,) = pack_buckets(_tensors(), bucket_bytes=1 << 20)
    pub = Publisher("shm", shm_dir=tmp_path)
    shared = pub.publish(bucket)
    opened = open_bucket(shared)
    assert opened.dtype == bucket.dtype and opened.buffer.numel() == bucket.buffer.numel()
    assert torch.equal(opened.buffer, bucket.buffer)
    assert [m.name for m in opened.manifest] == [m.name for m in bucket.manifest]
    pub.release()


def test_the_wrong_location_is_refused_by_name(tmp_path: Path) -> None:
    (bucket,) = pack_buckets(_tensors(), bucket_bytes=1 << 20)
    pub = Publisher("shm", shm_dir=tmp_path)
    shared = pub.publish(bucket)
    elsewhere = SharedBucket("shm", shared.header, {"node:10.9.9.9": next(iter(shared.handles.values()))})
    with pytest.raises(RuntimeError, match=r"no copy of this weight bucket at node:.*published at \['node:10.9.9.9'\]"):
        open_bucket(elsewhere)
    pub.release()
    with pytest.raises(FileNotFoundError, match="released it too early"):
        open_bucket(shared)


def test_merge_joins_locations_of_one_bucket_only(tmp_path: Path) -> None:
    a = SharedBucket("shm", b"h", {"node:a": b"/x"})
    b = SharedBucket("shm", b"h", {"node:b": b"/y"})
    assert a.merge(b).handles == {"node:a": b"/x", "node:b": b"/y"}
    assert a.merge(None) is a
    with pytest.raises(ValueError, match="two different buckets"):
        a.merge(SharedBucket("shm", b"other", {"node:b": b"/y"}))
    with pytest.raises(ValueError, match="two different buckets"):
        a.merge(SharedBucket("cuda", b"h", {"gpu:b": b"x"}))


def test_bf16_buckets_survive_the_trip(tmp_path: Path) -> None:
    tensors = {k: v.to(torch.bfloat16) for k, v in _tensors().items()}
    (bucket,) = pack_buckets(tensors, bucket_bytes=1 << 20)
    pub = Publisher("shm", shm_dir=tmp_path)
    opened = open_bucket(pub.publish(bucket))
    assert opened.dtype == torch.bfloat16
    for (name, got), want in zip(opened.tensors(), tensors.values(), strict=True):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), name
    pub.release()


def test_stale_files_of_dead_senders_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    dead = mp.get_context("spawn").Process(target=os.getpid)
    dead.start()
    dead.join()
    stale = tmp_path / f"{SHM_PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{SHM_PREFIX}{os.getpid()}-def"
    other = tmp_path / "someone-elses-file"
    for p in (stale, live, other):
        p.write_bytes(b"x")
    assert remove_stale_files(tmp_path) == 1
    assert not stale.exists() and live.exists() and other.exists()


def test_kinds_and_deferral() -> None:
    assert kind_for(torch.device("cpu")) == "shm"
    assert kind_for(torch.device("cuda", 0)) == "cuda"
    assert defers_load("shm") and not defers_load("cuda")
    assert location_key("shm").startswith("node:")
