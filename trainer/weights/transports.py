"""How the policy's weights reach the rollout engines: one class per transport, each owning its part of the
placement plan (``Plan.weight_transport``), chosen once by :func:`make_weight_sync`.

- :class:`SharedSync` (``shared``: engines colocated with the policy): in place from the policy ranks' memory,
  bucket by bucket, CUDA IPC on GPUs (NCCL cannot pair two processes on one GPU), ``/dev/shm`` without
  (:mod:`trainer.weights.shared`). Nothing to set up.
- :class:`BroadcastSync` (``broadcast``: engines on devices of their own): a group of policy rank 0 (the
  sender) and every engine's TP workers, NCCL on GPUs (``--vllm_sync_backend``), gloo without; the gathered
  ZeRO-3 parameters stream through it in buckets (:mod:`trainer.weights.broadcast`: the sender gathers the next bucket
  while the last one is on the wire, the workers receive the next one while they load the last). The group
  forms at the first push, within ``--dist_timeout``.
- :class:`SafetensorsSync` (``safetensors``: the HF engine): the full state as safetensors bytes through Ray.

``push`` returns the bytes of weights handed over. Waking sleeping engines around a push is the trainer's
choreography (``Trainer.sync_weights``), not the transport's.

Faults: before every push each engine answers a ping (``Engines.revive``: a dead or hung one is replaced and
gets its weights from this very push), and the push itself has a deadline (``--generate_timeout``). When
engines were replaced since the broadcast group formed (``Engines.epoch``), :class:`BroadcastSync` re-forms
it: policy rank 0 and the surviving engines leave the old group, and the whole group forms again with the
replacements. An engine that dies *during* a push ends the job with one line (:class:`PushFailure`): the policy
ranks are inside collectives (ZeRO-3 gathers) that cannot be resumed midway.

The engines and the policy group are taken as they are handed in: the engines' ``handles``, ``labels``,
``epoch`` and ``revive()`` (:class:`trainer.rollout.engines.Engines`), the policy group's ``async_run`` /
``run`` and its rank 0 (:class:`trainer.learn.group.ActorGroup`); nothing here imports either side.
"""

from __future__ import annotations

import abc
from typing import Any

from trainer.deadlines import Fault, wait_all
from trainer.errors import one_line


class PushFailure(Fault):
    """An engine call of the weight push failed or missed its deadline; the message is the one line the job ends
    with."""


class WeightSync(abc.ABC):
    """Moves the policy group's weights into the engines."""

    name: str = ""

    def __init__(self, cfg: Any, plan: Any, policy: Any, engines: Any) -> None:
        self.cfg, self.plan, self.policy, self.engines = cfg, plan, policy, engines
        self.timings: dict[str, float] = {}  # the last push's parts, as metrics (a transport that times them)

    def push(self) -> int:
        """Hand the current weights to every engine (replacing first any that died or hangs); returns the bytes
        handed over."""
        self.engines.revive()
        return self._push()

    @abc.abstractmethod
    def _push(self) -> int:
        """The transport's push (the engines are alive)."""

    def _get(self, refs: list[Any], labels: list[str]) -> list[Any]:
        """``ray.get`` of a push's calls within --generate_timeout; a call that fails or misses it ends the job
        with one line (see the module docstring)."""
        try:
            return wait_all(refs, labels, self.cfg.generate_timeout, f"weight push ({self.name})", diagnose=False)
        except Exception as exc:
            raise PushFailure(f"weight push ({self.name}) to {len(self.engines)} engine(s) failed: "
                              f"{one_line(exc)} (an engine that fails during a push cannot be replaced midway; "
                              "resume from the last checkpoint)") from exc

    def describe(self) -> str:
        return self.name


class SharedSync(WeightSync):
    name = "shared"

    def describe(self) -> str:
        kind = "CUDA IPC" if self.plan.use_gpus else "/dev/shm"
        return (f"in place ({kind}) into {len(self.engines)} colocated engine(s), buckets of "
                f"{self.cfg.sync_bucket_bytes / 2**20:g} MiB")

    def _push(self) -> int:
        refs = self.policy.async_run("push_weights_shared", self.engines.handles, self.cfg.sync_bucket_bytes)
        first = self._get(refs, [f"policy rank {r}" for r in range(len(refs))])[0]
        # where the push's time went, on rank 0 (the one that has the engines load each bucket): sync/<part>_s
        self.timings = {f"sync/{k}" if k == "buckets" else f"sync/{k}_s": v for k, v in first.items() if k != "bytes"}
        return int(first["bytes"])


class BroadcastSync(WeightSync):
    name = "broadcast"

    def __init__(self, cfg: Any, plan: Any, policy: Any, engines: Any) -> None:
        super().__init__(cfg, plan, policy, engines)
        self.backend = cfg.vllm_sync_backend if plan.use_gpus else "gloo"
        self.formed = False
        self.where = ""
        self.members: list[Any] = []  # the engine handles the group was formed with
        self.epoch = -1  # Engines.epoch when it formed: replacements since then mean re-forming it

    def describe(self) -> str:
        note = ""
        if self.backend != self.cfg.vllm_sync_backend:
            note = f" (--vllm_sync_backend {self.cfg.vllm_sync_backend} needs GPUs; this cluster has none)"
        tp = self.plan.engines.tp
        return (f"{self.backend} broadcast group of {1 + len(self.engines) * tp} (policy rank 0 + "
                f"{len(self.engines)} engines x TP {tp}){' at ' + self.where if self.where else ''}{note}")

    def leave(self) -> None:
        """Policy rank 0 and the engines of the last group that are still there leave it (replaced engines are
        gone with theirs), so that it can form again; within --dist_timeout, failures only logged."""
        import ray

        alive = [h for h in self.members if any(h is cur for cur in self.engines.handles)]
        refs = [self.policy.actors[0].close_weight_sync.remote(), *[h.close_weight_sync_group.remote(abort=True) for h in alive]]
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=self.cfg.dist_timeout)
        for ref in done:
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - the group is being replaced; say so and go on
                print(f"weight sync: leaving the old group: {type(exc).__name__}: {exc}", flush=True)
        if pending:
            print(f"weight sync: {len(pending)} member(s) did not leave the old group within {self.cfg.dist_timeout:g} s",
                  flush=True)
        self.formed = False

    def form(self) -> None:
        """Policy rank 0 and every engine worker join the group (engines must be up), within --dist_timeout."""
        import ray

        if self.formed:  # engines were replaced since: the whole group forms again, replacements included
            print(f"weight sync: re-forming the {self.backend} group with {self.engines.epoch - self.epoch} "
                  "replaced engine(s)", flush=True)
            self.leave()
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
        self.members = list(self.engines.handles)
        self.epoch = self.engines.epoch
        print(f"weight sync: {self.describe()}", flush=True)

    def _push(self) -> int:
        if not self.formed or self.epoch != self.engines.epoch:
            self.form()
        sends = self.policy.async_run("broadcast_weights", self.cfg.sync_bucket_bytes)
        receives = [engine.receive_weights.remote() for engine in self.engines.handles]
        labels = [f"policy rank {r}" for r in range(len(sends))] + list(self.engines.labels)
        return self._get(sends + receives, labels)[0]


class SafetensorsSync(WeightSync):
    name = "safetensors"

    def _push(self) -> int:
        from trainer.weights.buckets import to_safetensors_bytes

        blob = to_safetensors_bytes(self.policy.run("full_state")[0])
        self._get([engine.update_weights.remote(blob) for engine in self.engines.handles], list(self.engines.labels))
        return len(blob)


TRANSPORTS: dict[str, type[WeightSync]] = {c.name: c for c in (SharedSync, BroadcastSync, SafetensorsSync)}


def make_weight_sync(cfg: Any, plan: Any, policy: Any, engines: Any) -> WeightSync:
    """The transport the plan names (``Plan.weight_transport``)."""
    return TRANSPORTS[plan.weight_transport](cfg, plan, policy, engines)
