"""A vLLM worker extension: how new policy weights get into a running vLLM engine.

Passed as ``LLM(worker_extension_cls="trainer.weights.vllm_worker_ext.WeightSyncExtension")``; vLLM mixes the
class into its Worker, so its methods run inside every engine worker and are called through
``llm.collective_rpc("rlrun_...")``. Every attribute is prefixed ``rlrun_``: vLLM refuses an extension
whose attribute names clash with the Worker's (``update_weights`` is taken).

Three ways in, one loader (:func:`load_weights`: ``model.load_weights`` on GPUs, bucket by bucket; the
worker's ``reload_weights`` in one call on the CPU build):

- safetensors blobs (``rlrun_load_safetensors``): through Ray and vLLM's RPC; small models, the HF path;
- a bucket stream over a weight-sync group (``rlrun_init_sync_group`` + ``rlrun_receive_weights``):
  engines on GPUs of their own, NCCL (gloo without GPUs);
- shared buckets (``rlrun_load_shared`` ... ``rlrun_finish_shared``): engines colocated with the policy,
  in place from the trainer's memory (CUDA IPC; ``/dev/shm`` without GPUs), see :mod:`trainer.weights.shared`.

The caller must reset the prefix cache after every update (:class:`trainer.rollout.vllm_engine.VllmEngine`
does).

The loader is where vLLM's builds differ (the engine's other differences: :mod:`trainer.rollout.vllm_compat`).
On GPUs ``model.load_weights(pairs)`` copies each tensor into its (fused) parameter at once, so an update can
arrive bucket by bucket; this is what every RL framework calls, on 0.26 and 0.32 alike (~0.02 s for a 0.5B
model). The CPU build repacks linear weights for its GEMM kernels after loading and leaves the parameters
empty, so there ``load_weights`` fails; the worker's own ``reload_weights(weights_iterator=...,
is_checkpoint_format=True)`` works, but only for a whole model in ONE call (its layer-wise reload finalises
every layer at the end of the call). :func:`loads_incrementally` tells callers which case they are in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from trainer.weights.broadcast import SyncGroup, close_sync_group, iter_received_tensors, make_sync_group
from trainer.weights.buckets import from_safetensors_bytes, to_safetensors_bytes
from trainer.weights.shared import SharedBucket, location_key, open_bucket

log = logging.getLogger(__name__)

# vLLM 0.32's layer-wise reload counts a RotaryEmbedding's cos_sin_cache (a buffer vLLM computes itself, not a
# checkpoint weight) as a weight to load, so every weight update logs "RotaryEmbedding: Failed to load weights"
# and then puts the cache back unchanged. Only that message is dropped: any other layer that fails to load
# still warns.
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _RotaryCacheNotAWeight(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args
                    and str(record.args[0]).endswith("RotaryEmbedding"))


if not any(isinstance(f, _RotaryCacheNotAWeight) for f in logging.getLogger(RELOAD_LOGGER).filters):
    logging.getLogger(RELOAD_LOGGER).addFilter(_RotaryCacheNotAWeight())


def _blob_tensors(blobs: list[bytes]) -> Iterator[tuple[str, torch.Tensor]]:
    for blob in blobs:
        yield from from_safetensors_bytes(blob).items()


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def loads_incrementally(on_cpu: bool) -> bool:
    """True where an update may arrive in several load calls (GPU workers); False on the CPU build."""
    return not on_cpu


def _counted(pairs: Iterable[tuple[str, torch.Tensor]], counter: list[int]) -> Iterator[tuple[str, torch.Tensor]]:
    for pair in pairs:
        counter[0] += 1
        yield pair


def load_weights(worker: Any, pairs: Iterable[tuple[str, torch.Tensor]], on_cpu: bool) -> int:
    """Load ``(HF name, tensor)`` pairs into ``worker``'s model (``worker``: a vLLM Worker); returns the count.

    CPU: one ``reload_weights`` call, which must see every tensor of the model. GPU: ``model.load_weights``,
    any subset at a time. Raises ValueError for an update with no tensors.
    """
    counter = [0]
    stream = _counted(pairs, counter)
    if loads_incrementally(on_cpu):
        worker.model_runner.get_model().load_weights(weights=stream)
    else:
        worker.reload_weights(weights_iterator=stream, is_checkpoint_format=True)
    if counter[0] == 0:
        raise ValueError("weight update with no tensors: expected at least one (name, tensor)")
    return counter[0]


class WeightSyncExtension:
    """Methods mixed into vLLM's Worker (``self`` is the worker); see the module docstring."""

    rlrun_sync_group: SyncGroup | None = None
    rlrun_pending: list | None = None  # shared buckets held until rlrun_finish_shared (CPU build)
    rlrun_loaded = 0  # tensors loaded from shared buckets since the last rlrun_finish_shared

    def rlrun_reload(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load a whole update of ``(HF name, tensor)`` pairs; returns how many were loaded."""
        return load_weights(self, pairs, on_cpu=_on_cpu())

    def rlrun_load_safetensors(self, blobs: bytes | list[bytes]) -> int:
        """Load one update given as safetensors blob(s) (:func:`trainer.weights.buckets.to_safetensors_bytes`)."""
        if isinstance(blobs, bytes | bytearray):
            blobs = [bytes(blobs)]
        return self.rlrun_reload(_blob_tensors(list(blobs)))

    def rlrun_load_shared(self, wire: dict[str, Any]) -> bool:
        """Load one shared bucket (:class:`trainer.weights.shared.SharedBucket` as a dict) from the trainer's
        memory on this worker's GPU (or node). Returns True when the load is deferred to
        :meth:`rlrun_finish_shared` (the CPU build loads a whole update at once): the sender must then keep
        the bucket until that call returns."""
        shared = SharedBucket(**wire)
        device = self.device if shared.kind == "cuda" else None  # type: ignore[attr-defined]
        bucket = open_bucket(shared, device)
        if not loads_incrementally(_on_cpu()):
            self.rlrun_pending = [*(self.rlrun_pending or []), bucket]
            return True
        self.rlrun_loaded += load_weights(self, bucket.tensors(), on_cpu=False)
        if shared.kind == "cuda":  # the copies out of the trainer's memory are done before it may reuse it
            torch.cuda.synchronize(bucket.buffer.device)
        del bucket
        return False

    def rlrun_finish_shared(self) -> int:
        """End of a shared-bucket update: load what was deferred; returns the tensors loaded in all."""
        pending, self.rlrun_pending = self.rlrun_pending or [], None
        loaded, self.rlrun_loaded = self.rlrun_loaded, 0
        if pending:
            loaded += self.rlrun_reload(pair for bucket in pending for pair in bucket.tensors())
        del pending
        if loaded == 0:
            raise ValueError("shared weight update with no tensors: rlrun_load_shared was never called")
        return loaded

    def rlrun_device_memory(self) -> dict[str, int | str]:
        """This worker's device: its key (``gpu:<UUID>``, :func:`trainer.weights.shared.location_key`; '' on CPU),
        free and total bytes (``cudaMemGetInfo``), and the bytes its weights and its KV cache take (sizes of
        the tensors, whether or not their memory is mapped while asleep)."""
        runner = self.model_runner  # type: ignore[attr-defined]
        weights = sum(p.numel() * p.element_size() for p in runner.get_model().parameters())
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in getattr(runner, "kv_caches", None) or [] if isinstance(t, torch.Tensor)}
        out = {"device": "", "free": 0, "total": 0, "weights": int(weights), "kv_cache": int(sum(storages.values()))}
        if not _on_cpu() and torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            out.update(device=location_key("cuda"), free=int(free), total=int(total))
        return out

    def rlrun_init_sync_group(
        self, master_addr: str, master_port: int, rank_offset: int, world_size: int, backend: str = "gloo",
        timeout_s: float = 600.0,
    ) -> int:  # fmt: skip
        """Join a dedicated weight-sync group as rank ``rank_offset + worker rank``; returns that rank.

        The sender (trainer rank 0) is group rank 0; engine ``i`` with tensor-parallel size ``tp`` usually
        takes ``rank_offset = 1 + i * tp``. Blocks until every member joined.
        """
        if self.rlrun_sync_group is not None:
            raise RuntimeError("this worker is already in a weight-sync group; close it first")
        rank = rank_offset + int(self.rank)  # type: ignore[attr-defined]
        device = None
        if backend == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        self.rlrun_sync_group = make_sync_group(
            master_addr, master_port, rank, world_size, backend=backend, timeout_s=timeout_s, device=device
        )
        log.info("worker %s joined weight-sync group %s:%s as rank %d/%d (%s)",
                 self.rank, master_addr, master_port, rank, world_size, backend)  # type: ignore[attr-defined]  # fmt: skip
        return rank

    def rlrun_receive_weights(self, src: int = 0) -> int:
        """Receive one bucket stream (:func:`trainer.weights.broadcast.broadcast_buckets`) and load it; returns the count."""
        group = self.rlrun_sync_group
        if group is None:
            raise RuntimeError("rlrun_receive_weights before rlrun_init_sync_group: no weight-sync group")
        return self.rlrun_reload(iter_received_tensors(group, src))

    def rlrun_close_sync_group(self, abort: bool = False) -> None:
        """Leave the weight-sync group (shuts its backend down, drops it and its store); ``abort``: without
        waiting for its other members (see :func:`trainer.weights.broadcast.close_sync_group`)."""
        group, self.rlrun_sync_group = self.rlrun_sync_group, None
        if group is not None:
            close_sync_group(group, abort=abort)

    @torch.no_grad()
    def rlrun_read_weights(self) -> bytes:
        """The weights the model computes with, as a safetensors blob in vLLM's names (for tests/debugging).

        Parameters are read directly, with vocabulary padding rows cut off (``org_vocab_size``). On CPU
        vLLM drops linear weights after packing them for its GEMM kernels (the parameter is left empty),
        so those are recovered through the layer's own kernel: ``W = apply(layer, I).T`` with an identity
        input, which is exact (each output is one weight times 1 plus zeros). Names are vLLM's: fused
        ``qkv_proj`` (rows q, k, v) and ``gate_up_proj`` (rows gate, up). Only meaningful for
        tensor-parallel size 1 (each worker returns its own shard otherwise).
        """
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        out: dict[str, torch.Tensor] = {}
        for mod_name, mod in model.named_modules():
            for p_name, param in mod.named_parameters(recurse=False):
                name = f"{mod_name}.{p_name}" if mod_name else p_name
                out[name] = _effective_tensor(mod, p_name, param).cpu()
        return to_safetensors_bytes(out)


def _effective_tensor(mod: Any, p_name: str, param: torch.Tensor) -> torch.Tensor:
    if p_name == "weight" and param.numel() == 0 and hasattr(mod, "quant_method"):
        k = int(mod.input_size_per_partition)
        eye = torch.eye(k, dtype=param.dtype, device=param.device)
        return mod.quant_method.apply(mod, eye, None).t().contiguous()
    t = param.detach().clone()
    org = getattr(mod, "org_vocab_size", None)
    if org is not None and p_name == "weight":
        t = t[:org]
    return t
