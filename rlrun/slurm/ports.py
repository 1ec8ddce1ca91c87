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

What a block holds is the cluster contract's, read through rlrun/contract.py
(roles/cluster/vars/main.yml, as rlrun/checks/vocabulary.py gives it): a port for
every fixed port of a head that also serves rewards (``cluster__ray_head_ports``,
``cluster__ray_node_ports``, ``cluster__reward_port``, in that order from the
block's base; a port the contract gains gets its place without a change here),
then, from ``base + FIXED`` to the block's end, the worker range
(``cluster__ray_min_worker_port`` .. ``cluster__ray_max_worker_port``, its fewest
ports from ``cluster__port_range_specs``). Each has a shell variable, named from
its role variable: ``cluster__ray_gcs_port`` is ``PORT_GCS``,
``cluster__reward_port`` ``PORT_REWARD``, the worker range ``PORT_WORKER_MIN`` and
``PORT_WORKER_MAX``. The other ranges (the jobs' rendezvous range, the kernel's
ephemeral range) are the inventory's, as on a cluster the roles start.
"""

from __future__ import annotations

import functools
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
FIXED = 16  # places for fixed ports before the worker range (12 used, 4 spare: a new port moves no range)


@dataclass(frozen=True)
class Layout:
    """The block's places, from the cluster contract: role variable -> (shell variable, offset from the base) for
    the fixed ports; the worker range's (first, last) role variables, shell variables and fewest ports."""

    fixed: dict[str, tuple[str, int]]
    worker: tuple[tuple[str, str], tuple[str, str], int]
    held_by: dict[str, tuple[str, ...]]  # head | node | reward -> the role variables of the ports it holds

    @property
    def smallest(self) -> int:
        """The fewest ports a block may have."""
        return FIXED + self.worker[2]

    def shell_names(self) -> dict[str, str]:
        """Role variable -> shell variable, for every port and range end of the block."""
        return {**{var: name for var, (name, _) in self.fixed.items()},
                **dict(zip(self.worker[0], self.worker[1], strict=True))}

    def shell_ports(self, of: str) -> list[str]:
        """The shell variables of the fixed ports a head (its own), every Ray node, or the reward service hold."""
        return [self.fixed[var][0] for var in self.held_by[of]]


def _shell(var: str) -> str:
    """``cluster__ray_gcs_port`` -> ``PORT_GCS``."""
    return "PORT_" + var.removeprefix("cluster__").removeprefix("ray_").removesuffix("_port").upper()


@functools.cache
def layout() -> Layout:
    """The block's layout, read from the cluster contract (see the module docstring)."""
    from rlrun.checks import vocabulary as V  # the contract, as the checks read it

    head, node = V.head_ports(), V.node_ports()
    fixed_vars = [*head, *node, V.N.reward_port]
    if len(fixed_vars) > FIXED:
        raise PortError(f"the cluster contract has {len(fixed_vars)} fixed ports, more than the {FIXED} places a "
                        "Slurm job's port block keeps for them: raise rlrun/slurm/ports.py's FIXED")
    worker = next(r for r in V.port_ranges() if r.first == V.N.min_worker_port)
    return Layout(fixed={var: (_shell(var), i) for i, var in enumerate(fixed_vars)},
                  worker=((worker.first, worker.last), ("PORT_WORKER_MIN", "PORT_WORKER_MAX"), worker.min_span),
                  held_by={"head": tuple(head), "node": tuple(node), "reward": (V.N.reward_port,)})


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
        low, high = layout().worker[1]
        return {**{name: self.base + offset for name, offset in layout().fixed.values()},
                low: self.worker_min, high: self.worker_max}


def block_bases(window: tuple[int, int] = DEFAULT_WINDOW, size: int = DEFAULT_BLOCK,
                deny: list[tuple[int, int]] | None = None, ephemeral: int | None = None) -> list[int]:
    """The bases of every block that fits the window, stays below the ephemeral range and touches no
    denied port, in order."""
    smallest, workers = layout().smallest, layout().worker[2]
    if size < smallest:
        raise PortError(f"--port-block {size}: at least {smallest} ports ({FIXED} fixed and {workers} for Ray's "
                        "worker processes)")
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
