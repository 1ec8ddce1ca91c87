"""ActorGroup: N ranked Ray actors of one class on a placement group.

One abstraction for the policy, reference and critic groups (no copied
`.options()` blocks): it reserves `num_nodes x gpus_per_node` bundles (or
reuses a shared placement group when models are colocated), starts one actor
per bundle, asks rank 0 for a rendezvous address and has every rank join one
torch.distributed group (NCCL on GPU, gloo on CPU).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@dataclass(frozen=True)
class GroupSpec:
    """Where a group runs. On a cluster without GPUs a 'GPU' slot is a CPU rank."""

    name: str
    num_nodes: int
    gpus_per_node: int
    use_gpus: bool
    # Share of a GPU / CPUs each actor takes (fractions < 1 when models are colocated).
    gpus_per_actor: float = 1.0
    cpus_per_actor: float = 1.0
    env_vars: dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node


def reserve(spec: GroupSpec, timeout_s: float = 120.0) -> PlacementGroup:
    """A placement group with one bundle per rank, packed per node as in OpenRLHF.

    Fails with the arithmetic when the cluster cannot hold it within `timeout_s`.
    """
    bundle: dict[str, float] = {"CPU": spec.cpus_per_actor}
    if spec.use_gpus:
        bundle["GPU"] = 1.0
    pg = placement_group([dict(bundle) for _ in range(spec.world_size)], strategy="PACK",
                         name=f"rlrun-{spec.name}")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        total = ray.cluster_resources()
        ray.util.remove_placement_group(pg)
        need = {k: v * spec.world_size for k, v in bundle.items()}
        raise RuntimeError(
            f"group {spec.name}: {spec.num_nodes} nodes x {spec.gpus_per_node} = {spec.world_size} bundles of "
            f"{bundle} (in all {need}) cannot be placed within {timeout_s:.0f} s; the cluster has "
            f"CPU={total.get('CPU', 0):g}, GPU={total.get('GPU', 0):g}")
    return pg


# The cluster's pinned range for the jobs' rendezvous stores ("FIRST-LAST"), set by the Ray
# node's env file (roles/ray_node: cluster__rendezvous_min_port .. cluster__rendezvous_max_port).
RENDEZVOUS_PORTS_ENV = "RLRUN_RENDEZVOUS_PORTS"


def rendezvous_listener(ip: str) -> socket.socket:
    """A listening TCP socket on `ip` for a torch.distributed store: on the highest free port of
    $RLRUN_RENDEZVOUS_PORTS (vLLM takes that range from its bottom), or on any free port without it.

    Bound to the node address only, not to every interface; the store serves on this very socket
    (``TCPStore(master_listen_fd=...)``), so no other process can take the port in between."""
    spec = os.environ.get(RENDEZVOUS_PORTS_ENV, "").strip()
    if spec:
        low, sep, high = spec.partition("-")
        if not (sep and low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high) <= 65535):
            raise RuntimeError(f"{RENDEZVOUS_PORTS_ENV}={spec!r}: expected FIRST-LAST, e.g. 8120-8199 "
                               "(cluster__rendezvous_min_port, cluster__rendezvous_max_port)")
        ports = range(int(high), int(low) - 1, -1)
    else:
        ports = range(0, 1)  # any free port (a job on a plain Ray, without rlrun's node env)
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError:
            sock.close()
            continue
        sock.listen(128)
        return sock
    raise RuntimeError(f"no free port for a rendezvous on {ip} in {RENDEZVOUS_PORTS_ENV}={spec} (all "
                       f"{len(ports)} taken): widen cluster__rendezvous_min_port .. cluster__rendezvous_max_port")


class DistributedWorker:
    """Base class of ranked actors: the rendezvous handshake and the process group."""

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size

    def rendezvous_address(self) -> tuple[str, int]:
        """(node IP, port) of a store this actor will host, listening from now on; asked of rank 0 only."""
        ip = ray.util.get_node_ip_address()
        sock = rendezvous_listener(ip)
        port = sock.getsockname()[1]
        # port -> listening socket held for a store this actor will host.
        self.__dict__.setdefault("_rendezvous", {})[port] = sock
        return ip, port

    def take_listen_fd(self, port: int) -> int | None:
        """The listening socket rendezvous_address made for `port`, handed over as a file descriptor
        (to ``TCPStore(master_listen_fd=...)``, which then owns it); None if there is none."""
        sock = self.__dict__.get("_rendezvous", {}).pop(port, None)
        return sock.detach() if sock is not None else None

    def init_process_group(self, master_addr: str, master_port: int, backend: str) -> int:
        """Join the group on rank 0's store, then hand it to DeepSpeed; returns this rank."""
        import datetime

        import torch
        import torch.distributed as dist

        # What DeepSpeed's launcher would set, LOCAL_SIZE included: without it DeepSpeed's CPU accelerator
        # runs `numactl --hardware` at every gradient reduction, which also resets Python's warning registry
        # (one FutureWarning per step in the job's log).
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK="0", LOCAL_SIZE="1")
        if not dist.is_initialized():
            if backend == "gloo":
                # deepspeed's shm comm op compiles for ~45 s at every CPU init and training does not need it.
                import deepspeed.ops

                deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
            import deepspeed

            # Rank 0 serves the store on the socket bound to its node address (env:// would listen on
            # every interface); DeepSpeed then finds torch.distributed initialised and keeps it.
            timeout = datetime.timedelta(minutes=30)  # DeepSpeed's default process-group timeout
            fd = self.take_listen_fd(master_port) if self.rank == 0 else None
            store = dist.TCPStore(master_addr, master_port, self.world_size, self.rank == 0, timeout=timeout,
                                  master_listen_fd=fd)
            # [collective deadline] Forming the group and its first all-reduce under a deadline (counted from
            # the last rank's arrival, $RLRUN_COLLECTIVE_DEADLINE_S): a link that fails is one line naming
            # both nodes and the interface, not a 30-minute wait (trainer/collective_deadline.py).
            from trainer.collective_deadline import GroupWatch, deadline_s

            with GroupWatch(store, self.rank, self.world_size, backend, f"{type(self).__name__} group",
                            ray.util.get_node_ip_address(), deadline_s()) as watch:
                watch.run("forming the group", lambda: dist.init_process_group(
                    backend, store=store, rank=self.rank, world_size=self.world_size, timeout=timeout))
                one = torch.ones(1, device="cuda" if backend == "nccl" else "cpu")
                watch.run("the first all-reduce", lambda: dist.all_reduce(one, async_op=True))
            deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        return dist.get_rank()

    def ping(self) -> int:
        return self.rank

    def device_free(self) -> tuple[str, int]:
        """This rank's GPU (``gpu:<UUID>``, as the engines name theirs) and its free bytes as the driver
        reports them (all processes' use counted); ('', 0) without CUDA."""
        import torch

        if not torch.cuda.is_available():
            return "", 0
        from trainer.sync_shared import location_key

        return location_key("cuda"), int(torch.cuda.mem_get_info()[0])

    def empty_cache(self) -> int:
        """Hand the allocator's cached, unused device memory back (a colocated engine is about to wake up
        into it); returns the bytes released (0 without CUDA)."""
        import torch

        if not torch.cuda.is_available():
            return 0
        before = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        return before - torch.cuda.memory_reserved()


class ActorGroup:
    """Ranked actors of `actor_cls` (a subclass of DistributedWorker) joined in one process group."""

    def __init__(self, actor_cls: type, spec: GroupSpec, pg: PlacementGroup | None = None,
                 bundle_offset: int = 0):
        self.spec = spec
        self.pg = pg if pg is not None else reserve(spec)
        self._own_pg = pg is None
        remote_cls = ray.remote(actor_cls)
        self.actors = [
            remote_cls.options(
                num_cpus=spec.cpus_per_actor if self._own_pg else 0,
                num_gpus=spec.gpus_per_actor if spec.use_gpus else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=bundle_offset + rank),
                runtime_env={"env_vars": dict(spec.env_vars)} if spec.env_vars else None,
                name=None,
            ).remote(rank, spec.world_size)
            for rank in range(spec.world_size)
        ]
        backend = "nccl" if spec.use_gpus else "gloo"
        addr, port = ray.get(self.actors[0].rendezvous_address.remote())
        ranks = ray.get([a.init_process_group.remote(addr, port, backend) for a in self.actors])
        if ranks != list(range(spec.world_size)):
            raise RuntimeError(f"group {spec.name}: ranks {ranks} after rendezvous, expected 0..{spec.world_size - 1}")

    def run(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call `method` on every rank with the same arguments; results in rank order."""
        return ray.get(self.async_run(method, *args, **kwargs))

    def async_run(self, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        return [getattr(a, method).remote(*args, **kwargs) for a in self.actors]

    def run_sharded(self, method: str, shards: list[Any], **kwargs: Any) -> list[Any]:
        """Rank i gets shards[i] (one per rank) and the same keyword arguments."""
        if len(shards) != len(self.actors):
            raise ValueError(f"{len(shards)} shards for {len(self.actors)} ranks of group {self.spec.name}")
        return ray.get([getattr(a, method).remote(s, **kwargs) for a, s in zip(self.actors, shards, strict=True)])

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        if self._own_pg:
            ray.util.remove_placement_group(self.pg)
