"""make_experience's forwards: in micro-batches of --micro_rollout_batch_size (trainer.learn.group.micro_batched),
and their cached device memory handed back only where the device is short of it (release_cache_if_short). No
GPU here: PyTorch's CUDA memory queries are replaced by a device whose numbers the test sets; the real release
ran on an H200 (docs/benchmarks.md, sixteenth loan)."""

from __future__ import annotations

import pytest
import torch

from trainer.learn.group import release_cache_if_short

GIB = 2**30


@pytest.fixture
def device(monkeypatch):
    state = {"reserved": 0, "allocated": 0, "free": 0, "emptied": 0}

    def empty_cache():
        state["emptied"] += 1
        state["free"] += state["reserved"] - state["allocated"]
        state["reserved"] = state["allocated"]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: state["reserved"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: state["allocated"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (state["free"], 140 * GIB))
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    return state


def test_a_cache_larger_than_the_free_memory_is_handed_back(device):
    # the one-GPU 7B job after its reference's forward: 55 GB cached beside 15 GB of weights, 0.2 GB free
    device.update(reserved=70 * GIB, allocated=15 * GIB, free=GIB // 5)
    assert release_cache_if_short() is True
    assert device["emptied"] == 1 and device["reserved"] == 15 * GIB and device["free"] > 55 * GIB


def test_a_cache_the_device_has_room_beside_is_kept(device):
    # the 4-GPU 7B job: ~14 GB cached with ~60 GB free; the next forward then allocates nothing
    device.update(reserved=29 * GIB, allocated=15 * GIB, free=60 * GIB)
    assert release_cache_if_short() is False
    assert device["emptied"] == 0 and device["reserved"] == 29 * GIB
    device.update(free=14 * GIB)  # exactly as much free as cached: kept
    assert release_cache_if_short() is False and device["emptied"] == 0


def test_nothing_happens_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: pytest.fail("emptied a cache on a machine without CUDA"))
    assert release_cache_if_short() is False


def test_make_experience_forwards_run_in_micro_batches_of_the_flag():
    """--micro_rollout_batch_size is make_experience's forward batch per GPU (its help, the presets' comments,
    the verl translation's log_prob_micro_batch_size): a rank's rows go through its forward that many at a time,
    every tensor of the row dict cut alike, and the results come back in row order. Before 2026-11-29 a rank's
    whole shard went through one forward whatever the flag said; the 7B job on one GPU asked for ~55 GB there."""
    from trainer.learn.group import micro_batched

    rows = {"input_ids": torch.arange(10 * 3).view(10, 3), "attention_mask": torch.ones(10, 3, dtype=torch.long)}
    seen = []

    def forward(mb):
        assert mb["input_ids"].size(0) == mb["attention_mask"].size(0)
        seen.append(mb["input_ids"][:, 0].tolist())
        return mb["input_ids"].float() * 2

    out = micro_batched(forward, rows, 4)
    assert seen == [[0, 3, 6, 9], [12, 15, 18, 21], [24, 27]]
    assert torch.equal(out, rows["input_ids"].float() * 2)
    seen.clear()
    assert torch.equal(micro_batched(forward, rows, 16), out) and len(seen) == 1  # fewer rows than the flag
    seen.clear()
    assert torch.equal(micro_batched(forward, rows, None), out) and len(seen) == 1
