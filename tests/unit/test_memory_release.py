"""make_experience's forwards hand their cached device memory back only where the device is short of it
(trainer.learn.group.release_cache_if_short). No GPU here: PyTorch's CUDA memory queries are replaced by a
device whose numbers the test sets; the real release ran on an H200 (docs/benchmarks.md, sixteenth loan)."""

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
