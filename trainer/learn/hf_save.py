"""The Hugging Face save of a (ZeRO-3) model, streamed: rank 0 holds one shard at a time, not the model.

Gathering the whole model first and handing it to ``save_pretrained(state_dict=...)`` holds all of it in rank 0's
host memory: 61 GiB for the 32B model, which took the one-node 32B run's host from the 425-431 GiB it used while
training to a peak of 480.6 GiB of its 503, past Ray's memory monitor, which killed 5 worker processes
(docs/benchmarks.md, issue 36). Here every rank walks the parameters
in the same order and gathers them one at a time, rank 0 copies each to host memory and writes a shard as soon as
it is complete. The shard plan comes from the parameters' full sizes (``ds_numel`` under ZeRO-3), which every rank
knows, so the names are final from the start and nothing is renamed afterwards.

What is written is what ``save_pretrained`` writes for a dense model, and ``from_pretrained`` reads it as any
saved model: ``config.json`` (with ``dtype`` and ``architectures`` set as ``save_pretrained`` sets them),
``generation_config.json`` for a model that generates, and ``model.safetensors`` or, over one shard,
``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``. Shards of an earlier save that this one
does not replace are removed after the new ones are written, as ``save_pretrained`` does. Renamings transformers
attached at load are reversed name by name, as ``save_pretrained`` reverses them (under ZeRO-3 a dense model
carries legacy ones that match none of its names); a model with a converter that needs several tensors at once
(transformers 5 fuses some MoE experts at load) is gathered whole and saved by ``save_pretrained``, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SHARD_BYTES = 4 << 30  # a shard's size at most (one tensor larger than this is a shard of its own)
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


@dataclass(frozen=True)
class SaveStats:
    """What a streamed save wrote (rank 0): shard files, bytes in all, and the most it held in memory at once."""

    shards: int
    total_bytes: int
    peak_bytes: int


def full_nbytes(param: torch.Tensor) -> int:
    """The parameter's size when gathered: ZeRO-3 keeps only a partition in ``.data`` and the full count in
    ``ds_numel``."""
    numel = getattr(param, "ds_numel", None)
    return int(numel if numel is not None else param.numel()) * param.element_size()


def plan_shards(sizes: Sequence[tuple[str, int]], max_bytes: int = SHARD_BYTES) -> list[list[str]]:
    """Names in order, cut into shards of at most ``max_bytes`` (a larger tensor alone makes one)."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes {max_bytes}: expected a positive number of bytes")
    shards: list[list[str]] = []
    current: list[str] = []
    held = 0
    for name, nbytes in sizes:
        if current and held + nbytes > max_bytes:
            shards.append(current)
            current, held = [], 0
        current.append(name)
        held += nbytes
    if current:
        shards.append(current)
    return shards


def shard_names(count: int) -> list[str]:
    """Hugging Face's file names for ``count`` shards."""
    return [WEIGHTS] if count == 1 else [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def weight_conversions(module: Any) -> list:
    """What transformers would convert when saving ``module`` (names and layouts changed at load); [] for
    transformers without conversions. Loaded under DeepSpeed ZeRO-3, a dense Llama carries the legacy renamings
    (``LayerNorm.gamma`` -> ``LayerNorm.weight``, ...), which match none of its names."""
    conversions = getattr(module, "_weight_conversions", None)
    if conversions is None:
        try:
            from transformers.conversion_mapping import get_model_conversion_mapping
            from transformers.core_model_loading import PrefixChange
        except ImportError:
            return []
        conversions = [c for c in get_model_conversion_mapping(module, add_legacy=False)
                       if not isinstance(c, PrefixChange)]  # fmt: skip
    return list(conversions or [])


def saved_names(module: Any, names: Sequence[str]) -> dict[str, str] | None:
    """name -> the name ``save_pretrained`` would write it under (its conversions reversed, as it reverses
    them); None where a conversion needs several tensors at once (fused experts), which a save shard by shard
    cannot do."""
    conversions = weight_conversions(module)
    if not conversions:
        return {n: n for n in names}
    try:
        from transformers.core_model_loading import WeightRenaming, revert_weight_conversion
    except ImportError:
        return None
    if not all(isinstance(c, WeightRenaming) for c in conversions):
        return None
    probe = {n: torch.empty(0) for n in names}  # renamings only look at the names
    try:
        reverted = revert_weight_conversion(module, dict(probe))
    except Exception:  # noqa: BLE001 (a conversion this code does not know: the whole-model save decides)
        return None
    back = {id(t): k for k, t in reverted.items()}
    mapping = {n: back.get(id(t)) for n, t in probe.items()}
    if len(reverted) != len(probe) or None in mapping.values() or len(set(mapping.values())) != len(mapping):
        return None
    return mapping  # type: ignore[return-value]


@contextlib.contextmanager
def _gathered(param: torch.Tensor) -> Iterator[None]:
    """The full parameter in ``param.data`` within the block: a collective under ZeRO-3 (every rank calls it)."""
    if hasattr(param, "ds_id"):
        import deepspeed

        with deepspeed.zero.GatheredParameters([param]):
            yield
    else:
        yield


def save_streamed(named: Sequence[tuple[str, torch.Tensor]], directory: str | os.PathLike, *, rank: int,
                  config_owner: Any = None, max_shard_bytes: int = SHARD_BYTES) -> SaveStats | None:  # fmt: skip
    """Write ``named`` (saved name, parameter) as Hugging Face safetensors shards into ``directory``; every rank
    calls it in the same order. ``config_owner``: the ``PreTrainedModel`` whose config (and generation config)
    go beside the weights. Rank 0 returns what it wrote, the others None."""
    from safetensors.torch import save_file

    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"save_streamed: names saved twice: {', '.join(dup[:5])}")
    params = dict(named)
    plan = plan_shards([(n, full_nbytes(p)) for n, p in named], max_shard_bytes)
    files = shard_names(len(plan))
    out = Path(directory)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = peak = 0
    dtype = None
    for names_in_shard, filename in zip(plan, files, strict=True):
        shard: dict[str, torch.Tensor] = {}
        held = 0
        for name in names_in_shard:
            param = params[name]
            with _gathered(param):
                if rank == 0:
                    shard[name] = param.data.detach().to("cpu", copy=True).contiguous()
                    held += shard[name].numel() * shard[name].element_size()
                    dtype = dtype or shard[name].dtype
        if rank == 0:
            peak = max(peak, held)
            total += held
            save_file(shard, str(out / filename), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, filename))
        del shard
    if rank != 0:
        return None
    if len(files) > 1:
        count = sum(int(getattr(p, "ds_numel", None) or p.numel()) for p in params.values())
        index = {"metadata": {"total_size": total, "total_parameters": count}, "weight_map": weight_map}
        (out / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    keep = set(files) | ({INDEX} if len(files) > 1 else set())
    for stale in out.iterdir():  # an earlier save's shards that these do not replace
        if stale.name not in keep and (stale.name in (WEIGHTS, INDEX) or _SHARD_NAME.fullmatch(stale.name)):
            stale.unlink()
    if config_owner is not None:
        _write_config(config_owner, out, dtype)
    return SaveStats(shards=len(files), total_bytes=total, peak_bytes=peak)


def _write_config(model: Any, out: Path, dtype: torch.dtype | None) -> None:
    """config.json (and generation_config.json) as ``save_pretrained`` writes them."""
    config = model.config
    if dtype is not None:
        config.dtype = str(dtype).split(".")[1]
    config.architectures = [type(model).__name__]
    config.save_pretrained(out)
    can_generate = getattr(model, "can_generate", None)
    if callable(can_generate) and can_generate() and getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)


def save_model(module: Any, directory: str | os.PathLike, *, rank: int, prefix: str = "",
               max_shard_bytes: int = SHARD_BYTES) -> SaveStats | None:  # fmt: skip
    """``module``'s parameters (those under ``prefix``, renamed without it) and config into ``directory``,
    streamed; a model with weight conversions (module docstring) is gathered whole and saved by
    ``save_pretrained``. Every rank calls it."""
    owner = module.get_submodule(prefix.rstrip(".")) if prefix else module
    named = [(n[len(prefix):], p) for n, p in module.named_parameters() if n.startswith(prefix)]
    mapping = saved_names(owner, [n for n, _ in named])
    if mapping is not None:
        return save_streamed([(mapping[n], p) for n, p in named], directory, rank=rank, config_owner=owner,
                             max_shard_bytes=max_shard_bytes)  # fmt: skip
    state: dict[str, torch.Tensor] = {}
    for name, param in named:
        with _gathered(param):
            if rank == 0:
                state[name] = param.data.detach().to("cpu", copy=True)
    if rank != 0:
        return None
    print(f"save: {type(owner).__name__} converts its weights when saved: gathered whole for save_pretrained")
    owner.save_pretrained(directory, state_dict=state, safe_serialization=True)
    total = sum(t.numel() * t.element_size() for t in state.values())
    shards = sum(1 for f in Path(directory).iterdir() if f.name == WEIGHTS or _SHARD_NAME.fullmatch(f.name))
    return SaveStats(shards=shards, total_bytes=total, peak_bytes=total)
