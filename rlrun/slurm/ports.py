"""The port block of one Slurm job: every port its Ray cluster and reward service use.

Jobs of different users share nodes, so no port may be fixed: each job takes a
block of consecutive ports derived from its job id. The block lies in a window
below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, where
outgoing connections and Slurm's own srun ports get theirs) and clear of a
deny-list of ports other software on compute nodes listens on. Consecutive job
ids get consecutive blocks, so jobs running at the same time on a node collide
only when their ids differ by a multiple of the number of blocks in the window
(64 with the defaults); the node step checks every port is free before it starts
Ray and fails naming the port otherwise.

Layout of a block at ``base`` (the role's port variables in brackets)::

    base+0  GCS                 (cluster__ray_gcs_port)
    base+1  dashboard, Jobs API (cluster__ray_dashboard_port)
    base+2  Ray Client server   (cluster__ray_client_server_port)
    base+3  node manager        (cluster__ray_node_manager_port)
    base+4  object manager      (cluster__ray_object_manager_port)
    base+5  dashboard agent     (cluster__ray_dashboard_agent_listen_port)
    base+6  dashboard agent gRPC(cluster__ray_dashboard_agent_grpc_port)
    base+7  runtime-env agent   (cluster__ray_runtime_env_agent_port)
    base+8  metrics export      (cluster__ray_metrics_export_port)
    base+9  reward service      (cluster__reward_port)
    base+16 .. base+size-1      worker processes (cluster__ray_min/max_worker_port)
"""

from __future__ import annotations

from dataclasses import dataclass

# Below the usual ephemeral range (32768-60999) and below Kubernetes' NodePort range (30000-32767).
DEFAULT_WINDOW = (16384, 29999)
DEFAULT_BLOCK = 256
# Ports software on GPU nodes commonly listens on inside the window, each with its reason.
DEFAULT_DENY = {
    "29400-29510": "torchrun rendezvous (29400), torch.distributed / DeepSpeed MASTER_PORT (29500)",
    "27017-27019": "MongoDB",
    "24007-24008": "GlusterFS",
    "20048": "NFS mountd",
    "23456": "torch.distributed examples' init_method port",
}
FIXED = 16  # ports before the worker range (10 used, 6 spare)
MIN_WORKER_PORTS = 100  # the cluster role's lower bound on the worker range

# Shell variable -> offset; the sbatch script and the role's variables use these names.
OFFSETS = {
    "PORT_GCS": 0,
    "PORT_DASHBOARD": 1,
    "PORT_CLIENT": 2,
    "PORT_NODE_MANAGER": 3,
    "PORT_OBJECT_MANAGER": 4,
    "PORT_AGENT_HTTP": 5,
    "PORT_AGENT_GRPC": 6,
    "PORT_RUNTIME_ENV": 7,
    "PORT_METRICS": 8,
    "PORT_REWARD": 9,
}


class PortError(ValueError):
    """A window, block size or deny-list that cannot give a job its ports; the message says why."""


def parse_ranges(text: str, what: str = "--deny-ports") -> list[tuple[int, int]]:
    """'29400-29510,27017' -> [(29400, 29510), (27017, 27017)]; errors name the bad item."""
    ranges = []
    for item in [i.strip() for i in text.split(",") if i.strip()]:
        low, _, high = item.partition("-")
        try:
            lo, hi = int(low), int(high or low)
        except ValueError:
            raise PortError(f"{what} {item!r}: expected PORT or LOW-HIGH (e.g. 29400-29510)") from None
        if not (1 <= lo <= hi <= 65535):
            raise PortError(f"{what} {item!r}: expected ports 1-65535 with LOW <= HIGH")
        ranges.append((lo, hi))
    return ranges


def parse_window(text: str) -> tuple[int, int]:
    ranges = parse_ranges(text, "--port-window")
    if len(ranges) != 1 or ranges[0][0] == ranges[0][1]:
        raise PortError(f"--port-window {text!r}: expected one range LOW-HIGH, e.g. 16384-29999")
    return ranges[0]


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port of this machine's ephemeral range (32768 where it cannot be read)."""
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


@dataclass(frozen=True)
class PortBlock:
    base: int
    size: int

    @property
    def worker_min(self) -> int:
        return self.base + FIXED

    @property
    def worker_max(self) -> int:
        return self.base + self.size - 1

    def ports(self) -> dict[str, int]:
        """Shell variable -> port, the worker range's ends included."""
        return {**{name: self.base + off for name, off in OFFSETS.items()},
                "PORT_WORKER_MIN": self.worker_min, "PORT_WORKER_MAX": self.worker_max}


def block_bases(window: tuple[int, int] = DEFAULT_WINDOW, size: int = DEFAULT_BLOCK,
                deny: list[tuple[int, int]] | None = None, ephemeral: int | None = None) -> list[int]:
    """The bases of every block that fits the window, stays below the ephemeral range and touches no
    denied port, in order."""
    if size < FIXED + MIN_WORKER_PORTS:
        raise PortError(f"--port-block {size}: at least {FIXED + MIN_WORKER_PORTS} ports ({FIXED} fixed and "
                        f"{MIN_WORKER_PORTS} for Ray's worker processes)")
    low, high = window
    if low < 1024:
        raise PortError(f"--port-window {low}-{high}: ports below 1024 need root; start at 1024 or above")
    eph = ephemeral_low() if ephemeral is None else ephemeral
    top = min(high, eph - 1)
    deny = list(DEFAULT_DENY_RANGES if deny is None else deny)
    bases = []
    base = low
    while base + size - 1 <= top:
        hit = [(lo, hi) for lo, hi in deny if lo <= base + size - 1 and hi >= base]
        if hit:
            # Start the next candidate right after the highest denied port in this block.
            base = max(hi for _, hi in hit) + 1
            continue
        bases.append(base)
        base += size
    if not bases:
        raise PortError(f"no block of {size} ports fits the window {low}-{high} below the ephemeral range "
                        f"(starting at {eph}) and clear of the deny-list {_fmt(deny)}: widen --port-window, "
                        "shrink --port-block or shorten --deny-ports")
    return bases


def block_for_job(job_id: int, window: tuple[int, int] = DEFAULT_WINDOW, size: int = DEFAULT_BLOCK,
                  deny: list[tuple[int, int]] | None = None, ephemeral: int | None = None) -> PortBlock:
    """The block of job `job_id`: block number job_id modulo the number of blocks."""
    if job_id < 0:
        raise PortError(f"job id {job_id}: expected a non-negative Slurm job id")
    bases = block_bases(window, size, deny, ephemeral)
    return PortBlock(bases[job_id % len(bases)], size)


def _fmt(ranges: list[tuple[int, int]]) -> str:
    return ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ranges) or "(empty)"


DEFAULT_DENY_RANGES = [r for item in DEFAULT_DENY for r in parse_ranges(item)]
DEFAULT_DENY_TEXT = _fmt(DEFAULT_DENY_RANGES)
