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
import time
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


def group_bundle(spec: GroupSpec) -> dict[str, float]:
    """One rank's bundle (trainer.placement.Plan.bundle gives the same: a test holds them equal)."""
    bundle: dict[str, float] = {"CPU": spec.cpus_per_actor}
    if spec.use_gpus:
        bundle["GPU"] = 1.0
    return bundle


def reserve(spec: GroupSpec, timeout_s: float = 300.0) -> PlacementGroup:
    """A placement group with one bundle per rank, packed per node as in OpenRLHF (see reserve_bundles)."""
    from trainer.placement import PlacementGroupPlan

    bundles = tuple(group_bundle(spec) for _ in range(spec.world_size))
    return reserve_bundles(PlacementGroupPlan(spec.name, bundles, "PACK"), timeout_s,
                           f"group {spec.name} ({spec.num_nodes} nodes x {spec.gpus_per_node}), ")


def reserve_bundles(plan: Any, timeout_s: float = 300.0, prefix: str = "") -> PlacementGroup:
    """The placement group a :class:`trainer.placement.PlacementGroupPlan` describes, named ``rlrun-<name>``.

    Fails within ``timeout_s`` with one line (:mod:`trainer.deadlines`): what was asked, in all, and what each
    node has free."""
    from trainer.deadlines import StartupTimeout, describe_pending

    pg = placement_group([dict(b) for b in plan.bundles], strategy=plan.strategy, name=f"rlrun-{plan.name}")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        detail = describe_pending()
        ray.util.remove_placement_group(pg)
        need: dict[str, float] = {}
        for b in plan.bundles:
            for k, v in b.items():
                need[k] = need.get(k, 0.0) + v
        total = ", ".join(f"{k} {v:g}" for k, v in sorted(need.items(), key=lambda kv: kv[0] != "GPU"))
        raise StartupTimeout(f"{prefix}{plan.describe()} ({total} in all) not placed within {timeout_s:g} s: {detail}")
    return pg


def bundle_nodes(pg: PlacementGroup) -> list[str]:
    """The node (IP) of each bundle of a placed group, in bundle order."""
    from ray.util import placement_group_table

    ips = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes()}
    table = placement_group_table(pg)
    nodes = {int(k): v for k, v in (table.get("bundles_to_node_id") or {}).items()}
    return [ips.get(nodes.get(i, ""), "?") for i in range(len(pg.bundle_specs))]


# The cluster's pinned range for the jobs' rendezvous stores ("FIRST-LAST"), set by the Ray
# node's env file (roles/ray_node: cluster__rendezvous_min_port .. cluster__rendezvous_max_port).
RENDEZVOUS_PORTS_ENV = "RLRUN_RENDEZVOUS_PORTS"


def rendezvous_range(spec: str | None = None) -> tuple[int, int] | None:
    """The cluster's rendezvous range ``(first, last)`` from ``spec`` (default $RLRUN_RENDEZVOUS_PORTS);
    None where it is not set (a job on a plain Ray, without rlrun's node env)."""
    spec = (os.environ.get(RENDEZVOUS_PORTS_ENV, "") if spec is None else spec).strip()
    if not spec:
        return None
    low, sep, high = spec.partition("-")
    if not (sep and low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high) <= 65535):
        raise RuntimeError(f"{RENDEZVOUS_PORTS_ENV}={spec!r}: expected FIRST-LAST, e.g. 8120-8199 "
                           "(cluster__rendezvous_min_port, cluster__rendezvous_max_port)")
    return int(low), int(high)


def rendezvous_listener(ip: str) -> socket.socket:
    """A listening TCP socket on `ip` for a torch.distributed store: on the highest free port of
    $RLRUN_RENDEZVOUS_PORTS (vLLM takes that range from its bottom), or on any free port without it.

    Bound to the node address only, not to every interface; the store serves on this very socket
    (``TCPStore(master_listen_fd=...)``), so no other process can take the port in between."""
    spec = os.environ.get(RENDEZVOUS_PORTS_ENV, "").strip()
    span = rendezvous_range(spec)
    ports = range(span[1], span[0] - 1, -1) if span else range(0, 1)  # without the range: any free port
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


def micro_batched(fn: Any, rows: dict[str, Any], micro: int | None) -> Any:
    """``fn`` over ``rows`` (a dict of tensors, one row per sample on dim 0, as Experience.rows gives them) in
    micro-batches of at most ``micro`` rows, its results concatenated in row order: --micro_rollout_batch_size,
    make_experience's forward batch per GPU (a forward's logits grow with its rows: 128 rows of the 7B job on
    one GPU asked for ~55 GB). None or 0: one call over every row."""
    import torch

    n = next(iter(rows.values())).size(0)
    if not micro or n <= micro:
        return fn(rows)
    return torch.cat([fn({k: v[i:i + micro] for k, v in rows.items()}) for i in range(0, n, micro)])


def release_cache_if_short() -> bool:
    """After one of make_experience's forwards: hand this process's cached, unused device memory back when the
    device has less free memory than that cache. A forward's activations and logits stay in PyTorch's cache,
    and where the model shares its GPUs (colocated) that cache is dead memory while the policy trains: a 7B job
    on one H200 ran out of memory in its second train phase with 55 GB of it held by the reference (2026-11-29).
    Where the device has room, the cache is kept and the next forward allocates nothing. Returns whether it
    released."""
    import torch

    if not torch.cuda.is_available():
        return False
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    free, _ = torch.cuda.mem_get_info()
    if cached <= free:
        return False
    torch.cuda.empty_cache()
    return True


class DistributedWorker:
    """Base class of ranked actors: the rendezvous handshake and the process group."""

    def __init__(self, rank: int, world_size: int):
        from trainer.startup import Marks

        self.startup_marks = Marks()  # its process's start, then this constructor (trainer.startup)
        self.startup_marks.mark("init")
        self.rank = rank
        self.world_size = world_size

    def startup(self) -> dict[str, float]:
        """The moments of this rank's start (trainer.startup): process, init, and what init_model marked."""
        return self.startup_marks.get()

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

    def init_process_group(self, master_addr: str, master_port: int, backend: str, timeout_s: float = 300.0) -> int:
        """Join the group on rank 0's store, then hand it to DeepSpeed; returns this rank. Forming the group
        (every rank at the store, then a first collective that makes NCCL build its communicator) must end
        within ``timeout_s``; later collectives keep DeepSpeed's 30 minutes."""
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
            store = dist.TCPStore(master_addr, master_port, self.world_size, self.rank == 0,
                                  timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=fd)
            # [collective deadline] Forming the group and its first all-reduce (which makes NCCL build its
            # communicator) under a deadline counted from the last rank's arrival ($RLRUN_COLLECTIVE_DEADLINE_S):
            # a link that fails is one line naming both nodes and the interface, not a 30-minute wait
            # (trainer/collective_deadline.py); the driver's own deadline (--dist_timeout) names who never came.
            from trainer.collective_deadline import GroupWatch, deadline_s

            if backend == "nccl":
                torch.cuda.set_device(0)  # Ray shows each rank its own GPU as device 0
            with GroupWatch(store, self.rank, self.world_size, backend, f"{type(self).__name__} group",
                            ray.util.get_node_ip_address(), deadline_s()) as watch:
                watch.run("forming the group", lambda: dist.init_process_group(
                    backend, store=store, rank=self.rank, world_size=self.world_size, timeout=timeout))
                one = torch.ones(1, device="cuda" if backend == "nccl" else "cpu")
                watch.run("the first all-reduce", lambda: dist.all_reduce(one, async_op=True))
            store.set_timeout(timeout)
            deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        return dist.get_rank()

    def ping(self) -> int:
        return self.rank

    def node_ip(self) -> str:
        return ray.util.get_node_ip_address()

    def device_free(self) -> tuple[str, int]:
        """This rank's GPU (``gpu:<UUID>``, as the engines name theirs) and its free bytes as the driver
        reports them (all processes' use counted); ('', 0) without CUDA."""
        import torch

        if not torch.cuda.is_available():
            return "", 0
        from trainer.weights.shared import location_key

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

    def timed(self, shard: Any, method: str, micro: int | None = None) -> tuple[Any, float, float, float]:
        """``method(shard)`` on this rank (as ActorGroup.async_run_sharded passes a rank its shard), the
        seconds it took here, its device work included where the result is on the host, and when it started
        and ended (``time.time()``): the loop's ``timing/forward/*``, ``timing/forward_wait/*`` and
        ``timing/make_experience/return``, which tell a phase's time in the workers from the time around them
        (a rank still busy, the results' way back, the driver's own work)."""
        started = time.time()
        t0 = time.perf_counter()
        out = micro_batched(getattr(self, method), shard, micro)
        seconds = time.perf_counter() - t0
        release_cache_if_short()
        return out, seconds, started, time.time()

    def profile_begin(self, path: str, trace: bool = False) -> bool:
        """--profile_step: rank 0 starts torch.profiler (trainer.learn.profile) until profile_end; the other
        ranks do nothing (ZeRO-3's collectives keep them in step with it). True where it started."""
        if self.rank != 0:
            return False
        from trainer.learn.profile import StepProfiler

        self._profiler = StepProfiler()
        self._profiler.begin(path, trace)
        return True

    def profile_end(self) -> dict:
        """The profile's summary (trainer.learn.profile.summarize; its files written), {} on other ranks."""
        profiler = getattr(self, "_profiler", None)
        self._profiler = None
        return profiler.end() if profiler is not None else {}


class ActorGroup:
    """Ranked actors of `actor_cls` (a subclass of DistributedWorker) joined in one process group.

    Every wait has a deadline (:mod:`trainer.deadlines`): the placement group and the actors' start within
    ``placement_timeout``, the process group within ``dist_timeout``; each ends the job with one line."""

    def __init__(self, actor_cls: type, spec: GroupSpec, pg: PlacementGroup | None = None,
                 bundle_offset: int = 0, *, placement_timeout: float = 300.0, dist_timeout: float = 300.0,
                 owns_pg: bool = False):
        """``pg``: another group's placement group to share (colocated), or None for one of its own; with
        ``owns_pg``, ``pg`` is the group's own, reserved ahead by the caller (:func:`reserve`, with this ``spec``)
        so that something else can start in it first (--vllm_start_with_models): the group releases it."""
        from trainer.deadlines import wait_all

        self.spec = spec
        self.pg = pg if pg is not None else reserve(spec, placement_timeout)
        self._own_pg = pg is None or owns_pg
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
        labels = [f"{spec.name} rank {r}" for r in range(spec.world_size)]
        wait_all([a.ping.remote() for a in self.actors], labels, placement_timeout, f"group {spec.name}: actor start")
        backend = "nccl" if spec.use_gpus else "gloo"
        addr, port = ray.get(self.actors[0].rendezvous_address.remote())
        nodes = ray.get([a.node_ip.remote() for a in self.actors])
        # the ranks' own store deadline comes later than this one, so the job ends with the line naming them
        ranks = wait_all([a.init_process_group.remote(addr, port, backend, dist_timeout + 30) for a in self.actors],
                         [f"{label} on {ip}" for label, ip in zip(labels, nodes, strict=True)],
                         dist_timeout, f"group {spec.name}: {backend} group at {addr}:{port}", diagnose=False)
        if ranks != list(range(spec.world_size)):
            raise RuntimeError(f"group {spec.name}: ranks {ranks} after rendezvous, expected 0..{spec.world_size - 1}")

    def run(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call `method` on every rank with the same arguments; results in rank order."""
        return ray.get(self.async_run(method, *args, **kwargs))

    def async_run(self, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        return [getattr(a, method).remote(*args, **kwargs) for a in self.actors]

    def run_sharded(self, method: str, shards: list[Any], **kwargs: Any) -> list[Any]:
        """Rank i gets shards[i] (one per rank) and the same keyword arguments."""
        return ray.get(self.async_run_sharded(method, shards, **kwargs))

    def async_run_sharded(self, method: str, shards: list[Any], *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        """:meth:`run_sharded` without waiting: the refs, in rank order (rank i called with shards[i], *args)."""
        if len(shards) != len(self.actors):
            raise ValueError(f"{len(shards)} shards for {len(self.actors)} ranks of group {self.spec.name}")
        return [getattr(a, method).remote(s, *args, **kwargs) for a, s in zip(self.actors, shards, strict=True)]

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        if self._own_pg:
            ray.util.remove_placement_group(self.pg)
