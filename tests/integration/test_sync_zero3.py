"""trainer.weights.gather against real ZeRO-3 partitions on 2 gloo ranks (DeepSpeed, one spawn of two processes for
the module): gather_zero3_params gives full tensors on every rank, and iter_zero3_buckets (one all-gather
per bucket) equals the GatheredParameters path; parameter sizes that do not split evenly test the padding.
The bucket path runs with parameters partitioned like the big ones (persistence threshold 0) and with
persistent ones (DeepSpeed's default threshold: small parameters stay whole on every rank), before and
after an optimizer step. trainer.learn.hf_save writes a partitioned Llama shard by shard that from_pretrained loads
bit for bit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.conftest import free_port
from trainer.weights.buckets import TensorMeta, iter_buckets, unpack_bucket
from trainer.weights.gather import gather_zero3_params, iter_zero3_buckets

pytestmark = pytest.mark.integration



def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, same shape and the same bytes (NaN payloads and -0.0 included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _gather_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))


def _bucket_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(33, 17), torch.nn.LayerNorm(17), torch.nn.Linear(17, 5))


THRESHOLDS = (0, 100_000)


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")  # fmt: skip
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_allow_untested_optimizer": True}  # fmt: skip

    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = _gather_model()
    engine, *_ = deepspeed.initialize(model=model, config=cfg)
    partition_sizes = [p.numel() for p in engine.module.parameters()]
    # Small buckets: several gathers; clone since a yielded tensor is only valid until the next bucket.
    gathered = {n: t.clone() for n, t in gather_zero3_params(engine, bucket_bytes=600)}
    torch.save({"gathered": gathered, "partition_sizes": partition_sizes}, os.path.join(out_dir, f"zero3-{rank}.pt"))

    for threshold in THRESHOLDS:
        bcfg = {**cfg, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": threshold}}
        with deepspeed.zero.Init(config_dict_or_path=bcfg):
            model = _bucket_model()
        engine, *_ = deepspeed.initialize(model=model, config=bcfg)
        persistent = sorted(n for n, p in engine.module.named_parameters() if getattr(p, "ds_persist", False))
        before = _buckets(engine)
        torch.manual_seed(rank)
        engine.backward(engine(torch.randn(2, 33)).square().mean())
        engine.step()
        torch.save({"before": before, "after": _buckets(engine), "persistent": persistent},
                   os.path.join(out_dir, f"buckets-{threshold}-{rank}.pt"))

    _save_hf(rank, cfg, out_dir)


HF_SHARD_BYTES = 20_000  # the tiny Llama below in several shards


def _save_hf(rank: int, cfg: dict, out_dir: str) -> None:
    """trainer.learn.hf_save on a partitioned Llama: every rank gathers, rank 0 writes shard by shard."""
    import deepspeed
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.learn.hf_save import save_model

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=97, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = LlamaForCausalLM(config)
    engine, *_ = deepspeed.initialize(model=model, config=cfg)
    partitioned = all(p.numel() == 0 for p in engine.module.parameters())
    stats = save_model(engine.module, os.path.join(out_dir, "hf"), rank=rank, max_shard_bytes=HF_SHARD_BYTES)
    gathered = {n: t.clone() for n, t in gather_zero3_params(engine, bucket_bytes=1 << 20)}
    if rank == 0:
        torch.save({"stats": stats, "gathered": gathered, "partitioned": partitioned},
                   os.path.join(out_dir, "hf-0.pt"))
    else:
        assert stats is None


def _buckets(engine) -> dict:
    out = {}
    for bucket_bytes in (300, 1 << 20):  # several buckets (weights over 300 bytes alone) / one bucket
        fast = [(b.dtype, [(m.name, m.shape, m.offset) for m in b.manifest], b.buffer.clone())
                for b in iter_zero3_buckets(engine, bucket_bytes)]
        slow = [(b.dtype, [(m.name, m.shape, m.offset) for m in b.manifest], b.buffer.clone())
                for b in iter_buckets(gather_zero3_params(engine, bucket_bytes), bucket_bytes)]
        out[bucket_bytes] = {"fast": fast, "slow": slow}
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    """The two ranks' results (one spawn for the module's tests)."""
    pytest.importorskip("deepspeed")
    out = tmp_path_factory.mktemp("zero3")
    mp.start_processes(_worker, args=(free_port(), str(out)), nprocs=2, join=True, start_method="spawn")
    return out


def test_gather_zero3_params_gives_full_tensors_on_every_rank(ranks: Path) -> None:
    expected = dict(_gather_model().named_parameters())
    for rank in (0, 1):
        got = torch.load(ranks / f"zero3-{rank}.pt")
        # Partitioned while not gathered (ZeRO-3 keeps an empty placeholder in .data).
        assert all(n == 0 for n in got["partition_sizes"]), got["partition_sizes"]
        assert sorted(got["gathered"]) == sorted(expected)
        for name, t in expected.items():
            assert bits_equal(got["gathered"][name], t.detach()), (rank, name)


@pytest.mark.parametrize("threshold", THRESHOLDS, ids=["partitioned", "persistent"])
def test_allgather_buckets_equal_the_gathered_parameters_path(ranks: Path, threshold: int) -> None:
    want = {n: p.detach() for n, p in _bucket_model().named_parameters()}
    for rank in (0, 1):
        got = torch.load(ranks / f"buckets-{threshold}-{rank}.pt")
        assert (len(got["persistent"]) == len(want)) == (threshold > 0), got["persistent"]
        for bucket_bytes, runs in got["after"].items():  # after a step: the two paths still agree
            assert any(not torch.equal(f[2], b[2]) for f, b in zip(runs["fast"], got["before"][bucket_bytes]["fast"],
                                                                   strict=True)), "the step changed nothing"
            for (fd, fm, fb), (sd, sm, sb) in zip(runs["fast"], runs["slow"], strict=True):
                assert fd == sd and fm == sm and torch.equal(fb, sb), (rank, bucket_bytes, fm)
        for bucket_bytes, runs in got["before"].items():
            assert len(runs["fast"]) == len(runs["slow"]) > 0
            if bucket_bytes == 300:
                assert len(runs["fast"]) > 2
            for (fd, fm, fb), (sd, sm, sb) in zip(runs["fast"], runs["slow"], strict=True):
                assert fd == sd and fm == sm, (rank, bucket_bytes)
                assert torch.equal(fb, sb), (rank, bucket_bytes, fm)
            seen = {}
            for dtype, manifest, buffer in runs["fast"]:
                metas = [TensorMeta(n, dtype, tuple(s), o) for n, s, o in manifest]
                seen.update(unpack_bucket(buffer, metas))
            assert sorted(seen) == sorted(want)
            for name, tensor in want.items():
                assert torch.equal(seen[name], tensor), (rank, bucket_bytes, name)


def test_the_hf_save_of_a_partitioned_model_streams_shards_that_from_pretrained_loads(ranks: Path) -> None:
    from transformers import AutoModelForCausalLM

    got = torch.load(ranks / "hf-0.pt", weights_only=False)
    assert got["partitioned"], "the model was not partitioned: the test would not gather anything"
    stats, gathered = got["stats"], got["gathered"]
    shards = sorted((ranks / "hf").glob("model-*-of-*.safetensors"))
    assert stats.shards == len(shards) > 2
    largest = max(t.numel() * t.element_size() for t in gathered.values())
    assert stats.peak_bytes <= max(HF_SHARD_BYTES, largest) < stats.total_bytes
    loaded = AutoModelForCausalLM.from_pretrained(ranks / "hf").state_dict()
    assert sorted(loaded) == sorted(gathered)
    for name, tensor in gathered.items():
        assert bits_equal(loaded[name], tensor), name
