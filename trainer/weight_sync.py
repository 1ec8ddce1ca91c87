"""How the policy's weights reach the rollout engines: one class per transport, each owning its part of the
placement plan (``Plan.weight_transport``), chosen once by :func:`make_weight_sync`.

- :class:`SharedSync` (``shared``: engines colocated with the policy): in place from the policy ranks' memory,
  bucket by bucket, CUDA IPC on GPUs (NCCL cannot pair two processes on one GPU), ``/dev/shm`` without
  (:mod:`trainer.sync_shared`). Nothing to set up.
- :class:`BroadcastSync` (``broadcast``: engines on devices of their own): a group of policy rank 0 (the
  sender) and every engine's TP workers, NCCL on GPUs (``--vllm_sync_backend``), gloo without; the gathered
  ZeRO-3 parameters stream through it in buckets (:mod:`trainer.sync`: the sender gathers the next bucket
  while the last one is on the wire, the workers receive the next one while they load the last). The group
  forms at the first push, within ``--dist_timeout``.
- :class:`SafetensorsSync` (``safetensors``: the HF engine): the full state as safetensors bytes through Ray.

``push`` returns the bytes of weights handed over. Waking sleeping engines around a push is the trainer's
choreography (``Trainer.sync_weights``), not the transport's.
"""

from __future__ import annotations

import abc
from typing import Any

from trainer.deadlines import wait_all


class WeightSync(abc.ABC):
    """Moves the policy group's weights into the engines."""

    name: str = ""

    def __init__(self, cfg: Any, plan: Any, policy: Any, engines: Any) -> None:
        self.cfg, self.plan, self.policy, self.engines = cfg, plan, policy, engines

    @abc.abstractmethod
    def push(self) -> int:
        """Hand the current weights to every engine; returns the bytes handed over."""

    def describe(self) -> str:
        return self.name


class SharedSync(WeightSync):
    name = "shared"

    def describe(self) -> str:
        kind = "CUDA IPC" if self.plan.use_gpus else "/dev/shm"
        return (f"in place ({kind}) into {len(self.engines)} colocated engine(s), buckets of "
                f"{self.cfg.sync_bucket_bytes / 2**20:g} MiB")

    def push(self) -> int:
        import ray

        return ray.get(self.policy.async_run("push_weights_shared", self.engines.handles,
                                             self.cfg.sync_bucket_bytes))[0]


class BroadcastSync(WeightSync):
    name = "broadcast"

    def __init__(self, cfg: Any, plan: Any, policy: Any, engines: Any) -> None:
        super().__init__(cfg, plan, policy, engines)
        self.backend = cfg.vllm_sync_backend if plan.use_gpus else "gloo"
        self.formed = False
        self.where = ""

    def describe(self) -> str:
        note = ""
        if self.backend != self.cfg.vllm_sync_backend:
            note = f" (--vllm_sync_backend {self.cfg.vllm_sync_backend} needs GPUs; this cluster has none)"
        tp = self.plan.engines.tp
        return (f"{self.backend} broadcast group of {1 + len(self.engines) * tp} (policy rank 0 + "
                f"{len(self.engines)} engines x TP {tp}){' at ' + self.where if self.where else ''}{note}")

    def form(self) -> None:
        """Policy rank 0 and every engine worker join the group (engines must be up), within --dist_timeout."""
        import ray

        tp = self.plan.engines.tp
        world = 1 + len(self.engines) * tp
        addr, port = ray.get(self.policy.actors[0].rendezvous_address.remote())
        self.where = f"{addr}:{port}"
        store_timeout = self.cfg.dist_timeout + 30  # later than the driver's deadline: the line below names who
        joins = [engine.init_weight_sync_group.remote(addr, port, 1 + i * tp, world, self.backend, store_timeout)
                 for i, engine in enumerate(self.engines.handles)]
        sender = self.policy.actors[0].init_weight_sync.remote(addr, port, world, self.backend, store_timeout)
        wait_all([sender, *joins], ["policy rank 0", *self.engines.labels], self.cfg.dist_timeout,
                 f"weight-sync {self.backend} group at {self.where}", diagnose=False)
        self.formed = True
        print(f"weight sync: {self.describe()}", flush=True)

    def push(self) -> int:
        import ray

        if not self.formed:
            self.form()
        receives = [engine.receive_weights.remote() for engine in self.engines.handles]
        return ray.get(self.policy.async_run("broadcast_weights", self.cfg.sync_bucket_bytes) + receives)[0]


class SafetensorsSync(WeightSync):
    name = "safetensors"

    def push(self) -> int:
        import ray

        from trainer.sync import to_safetensors_bytes

        blob = to_safetensors_bytes(self.policy.run("full_state")[0])
        ray.get([engine.update_weights.remote(blob) for engine in self.engines.handles])
        return len(blob)


TRANSPORTS: dict[str, type[WeightSync]] = {c.name: c for c in (SharedSync, BroadcastSync, SafetensorsSync)}


def make_weight_sync(cfg: Any, plan: Any, policy: Any, engines: Any) -> WeightSync:
    """The transport the plan names (``Plan.weight_transport``)."""
    return TRANSPORTS[plan.weight_transport](cfg, plan, policy, engines)
