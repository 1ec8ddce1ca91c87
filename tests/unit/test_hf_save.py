"""trainer.learn.hf_save: the streamed Hugging Face save writes what save_pretrained writes (the same tensors under
the same names, a config from_pretrained reads), shard by shard, never holding more than a shard; the ZeRO-3 case
(parameters gathered one by one on 2 ranks) is in tests/integration/test_sync_zero3.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainer.learn import hf_save
from trainer.learn.hf_save import (
    INDEX,
    SHARD_BYTES,
    WEIGHTS,
    full_nbytes,
    plan_shards,
    save_model,
    shard_names,
)

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        part = safetensors_torch.load_file(f)
        assert not set(part) & set(out), f"{f.name} repeats a tensor"
        out.update(part)
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from trainer.tiny import make_model

    src = make_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2, num_heads=2)
    return transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)


def test_shards_are_cut_in_order_and_a_large_tensor_stands_alone():
    sizes = [("a", 40), ("b", 40), ("c", 30), ("big", 500), ("d", 10), ("e", 10)]
    assert plan_shards(sizes, 100) == [["a", "b"], ["c"], ["big"], ["d", "e"]]
    assert plan_shards(sizes, 10_000) == [["a", "b", "c", "big", "d", "e"]]
    assert plan_shards([], 100) == []
    with pytest.raises(ValueError, match="max_bytes 0"):
        plan_shards(sizes, 0)
    assert shard_names(1) == [WEIGHTS]
    assert shard_names(3) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]


def test_a_zero3_placeholder_counts_its_full_size():
    p = torch.nn.Parameter(torch.empty(0, dtype=torch.bfloat16))
    p.ds_numel = 1000  # what ZeRO-3 leaves on a partitioned parameter
    assert full_nbytes(p) == 2000
    assert full_nbytes(torch.zeros(3, 5)) == 60


@pytest.mark.parametrize("shard_bytes", [SHARD_BYTES, 40_000], ids=["one-file", "sharded"])
def test_the_streamed_save_writes_what_save_pretrained_writes(model, tmp_path, shard_bytes):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    stats = save_model(model, ours, rank=0, max_shard_bytes=shard_bytes)
    model.save_pretrained(theirs, safe_serialization=True)

    want, got = _tensors(theirs), _tensors(ours)
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    files = sorted(f.name for f in ours.glob("*.safetensors"))
    assert stats.shards == len(files)
    assert stats.total_bytes == sum(t.numel() * t.element_size() for t in want.values())
    largest = max(t.numel() * t.element_size() for t in want.values())
    assert stats.peak_bytes <= max(shard_bytes, largest)
    if shard_bytes == SHARD_BYTES:
        assert files == [WEIGHTS] and not (ours / INDEX).exists()
    else:
        assert len(files) > 2
        index = json.loads((ours / INDEX).read_text())
        assert set(index["weight_map"]) == set(want) and set(index["weight_map"].values()) == set(files)
        assert index["metadata"]["total_size"] == stats.total_bytes
        assert stats.peak_bytes < stats.total_bytes  # never the whole model at once
    config = json.loads((ours / "config.json").read_text())
    assert config["architectures"] == [type(model).__name__] and config["dtype"] == "bfloat16"
    assert (ours / "generation_config.json").exists()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(ours, dtype=torch.bfloat16)
    for (name, a), (_, b) in zip(loaded.state_dict().items(), model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_a_new_save_removes_the_shards_of_an_earlier_one_it_does_not_replace(model, tmp_path):
    save_model(model, tmp_path, rank=0, max_shard_bytes=40_000)
    assert (tmp_path / INDEX).exists()
    (tmp_path / "notes.txt").write_text("kept")
    save_model(model, tmp_path, rank=0)  # one file now
    assert sorted(f.name for f in tmp_path.glob("*.safetensors")) == [WEIGHTS]
    assert not (tmp_path / INDEX).exists() and (tmp_path / "notes.txt").read_text() == "kept"
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    save_model(model, tmp_path, rank=0, max_shard_bytes=40_000)  # and back: the single file goes
    assert not (tmp_path / WEIGHTS).exists()
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path)


def test_a_prefix_saves_a_submodule_under_its_own_names(model, tmp_path):
    wrapper = torch.nn.Module()
    wrapper.backbone = model.model  # as the critic holds its backbone
    wrapper.value_head = torch.nn.Linear(64, 1, bias=False)
    save_model(wrapper, tmp_path, rank=0, prefix="backbone.", max_shard_bytes=40_000)
    got = _tensors(tmp_path)
    assert sorted(got) == sorted(n for n, _ in model.model.named_parameters())
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [type(model.model).__name__]
    transformers.AutoModel.from_pretrained(tmp_path)


def test_other_ranks_write_nothing_and_names_must_be_unique(model, tmp_path):
    assert save_model(model, tmp_path / "r1", rank=1) is None
    assert not (tmp_path / "r1").exists()
    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="names saved twice: w"):
        hf_save.save_streamed([("w", p), ("w", p)], tmp_path / "dup", rank=0)
    assert not (tmp_path / "dup").exists()


def test_rank_0_lets_go_of_a_shard_before_it_gathers_the_next(model, tmp_path, monkeypatch):
    import gc
    import weakref

    earlier: list[weakref.ref] = []
    alive_at_write: list[int] = []
    real = safetensors_torch.save_file

    def spy(tensors, filename, metadata=None):
        gc.collect()
        alive_at_write.append(sum(1 for ref in earlier if ref() is not None))
        earlier.extend(weakref.ref(t) for t in tensors.values())
        real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors_torch, "save_file", spy)
    save_model(model, tmp_path, rank=0, max_shard_bytes=40_000)
    assert len(alive_at_write) > 2
    assert alive_at_write == [0] * len(alive_at_write), "an earlier shard's tensors were still held"


def test_renamings_are_reversed_as_save_pretrained_reverses_them_and_a_converter_saves_whole(model, tmp_path,
                                                                                               monkeypatch):
    """Loaded under ZeRO-3, transformers 5 attaches its legacy renamings (LayerNorm.gamma -> .weight, ...) to a
    dense model: they match none of its names, and the save still streams. A renaming that does match is
    reversed per name, as save_pretrained reverses it; a converter (fused experts) cannot be done shard by
    shard."""
    from transformers.core_model_loading import WeightRenaming

    from trainer.learn.hf_save import saved_names

    names = [n for n, _ in model.named_parameters()]
    legacy = [WeightRenaming(source_patterns=["LayerNorm.gamma"], target_patterns=["LayerNorm.weight"]),
              WeightRenaming(source_patterns=[".weight_g$"], target_patterns=[".parametrizations.weight.original0"])]
    monkeypatch.setattr(model, "_weight_conversions", legacy, raising=False)
    assert saved_names(model, names) == {n: n for n in names}

    renamed = [WeightRenaming(source_patterns=["mlp.upper"], target_patterns=["mlp.up_proj"])]
    monkeypatch.setattr(model, "_weight_conversions", renamed, raising=False)
    stats = save_model(model, tmp_path / "ours", rank=0, max_shard_bytes=40_000)
    assert stats.shards > 2
    model.save_pretrained(tmp_path / "theirs", safe_serialization=True)
    want, got = _tensors(tmp_path / "theirs"), _tensors(tmp_path / "ours")
    assert any("mlp.upper" in n for n in want), "the renaming was not applied by save_pretrained either"
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert torch.equal(got[name], t), name

    class Converter:  # anything but a renaming
        pass

    monkeypatch.setattr(model, "_weight_conversions", [*legacy, Converter()], raising=False)
    assert saved_names(model, names) is None
