"""What NCCL chose, read from its ``NCCL_DEBUG=INFO`` lines: transports per connection, interfaces, version.

The lines this reads (formats of NCCL 2.4 to 2.28, as printed to stdout or ``NCCL_DEBUG_FILE``; a
launcher's ``[rank]`` prefix is allowed)::

    host:1234:1250 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[2] [send] via NET/Socket/0
    host:1234:1250 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM/read
    host:1234:1250 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct
    host:1234:1250 [0] NCCL INFO Ring 00 : 35 -> 34 [send] via NET/Socket/0           (NCCL 2.4)
    host:1234:1250 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:10.0.1.1<0>
    host:1234:1250 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>
    host:1234:1250 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
    host:1234:1250 [0] NCCL INFO Using network Socket
    host:1234:1250 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0
    host:1234:1250 [0] misc/socket.cc:484 NCCL WARN socketProgress: Connection closed by remote peer
    NCCL version 2.21.5+cuda12.4

Stdlib only: it runs in the fabric job on the cluster and in the controller's tests.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

_HEADER = re.compile(r"^(?:\[\d+\]\s*)?(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
                     r"(?:(?P<src>\S+:\d+) )?NCCL (?P<level>INFO|WARN|TRACE) (?P<msg>.*)$")
_CHANNEL = re.compile(r"^(?:Channel|Ring) (?P<channel>\d+)(?:/(?P<sub>\d+))? : (?P<src>\d+)(?:\[(?P<src_dev>[0-9a-fx]+)\])?"
                      r" -> (?P<dst>\d+)(?:\[(?P<dst_dev>[0-9a-fx]+)\])?(?: \[(?P<dir>send|receive)\])?"
                      r" via (?P<via>.+?)\s*$")
_NET_USING = re.compile(r"^NET/(?P<net>[^ :]+) ?: Using (?P<rest>.*)$")
_DEVICE = re.compile(r"\[(?P<index>\d+)\](?P<name>[^:\s\[]+):(?P<addr>[^\s<\[]+)(?:<\d+>)?")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: Using (?:\[\d+\])?(?P<name>[^:\s]+):(?P<addr>[^\s<]+)")
_VERSION = re.compile(r"NCCL version (?P<version>\S+)")
_ENV = re.compile(r"^(?P<var>NCCL_[A-Z0-9_]+) set by environment to (?P<value>.*?)\.?\s*$")
_NETWORK = re.compile(r"^Using network (?P<network>.+?)\s*$")


@dataclass(frozen=True)
class Channel:
    """One connection NCCL set up: ``src -> dst`` (ranks of the communicator) over ``transport``."""

    src: int
    dst: int
    transport: str  # family: P2P/CUMEM, P2P/IPC, P2P/direct, SHM, NET/IB, NET/Socket, NET/<plugin>, ...
    via: str  # as logged: NET/Socket/0, P2P/CUMEM/read, NET/IBext_v8/3/GDRDMA
    direction: str | None = None  # send | receive (network connections), else None
    net_device: int | None = None  # NET/<x>/<device>: the index into that network's "Using" list
    gdr: bool = False  # GPU Direct RDMA


def transport_family(via: str) -> tuple[str, int | None, bool]:
    """(family, network device index, GPUDirect RDMA) of a ``via`` field.

    ``NET/Socket/0`` -> (NET/Socket, 0); ``NET/IBext_v8/3/GDRDMA`` -> (NET/IB, 3, True) (the IB plugin
    counts as IB); ``P2P/CUMEM/read`` -> (P2P/CUMEM); ``P2P/direct pointer`` -> (P2P/direct);
    ``SHM/direct/direct`` -> (SHM); anything else: its first two parts."""
    parts = via.split("/")
    head = parts[0].strip()
    if head == "NET" and len(parts) >= 2:
        name = parts[1].strip()
        family = "NET/IB" if name.startswith("IB") else f"NET/{name}"
        device = int(parts[2]) if len(parts) >= 3 and parts[2].strip().isdigit() else None
        return family, device, any(p.strip().upper() == "GDRDMA" for p in parts[3:])
    if head == "SHM":
        return "SHM", None, False
    if head == "P2P" and len(parts) >= 2:
        return f"P2P/{parts[1].split()[0]}", None, False
    return "/".join(p.split()[0] for p in parts[:2] if p.strip()), None, False


@dataclass
class NcclLog:
    """What one process's NCCL lines say."""

    version: str | None = None
    network: str | None = None  # "Socket", "IB", ... (Using network X)
    bootstrap: dict | None = None  # {"interface": "eth0", "address": "10.0.0.1"}
    # network name (Socket, IB, ...) -> its devices in index order: {"index", "name", "address"}
    net_devices: dict[str, list[dict]] = field(default_factory=dict)
    channels: list[Channel] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # NCCL_* set by environment, as NCCL saw them
    warnings: list[str] = field(default_factory=list)

    def transports(self) -> dict[str, int]:
        """Connections per transport family."""
        return dict(Counter(c.transport for c in self.channels))

    def interface(self, channel: Channel) -> str | None:
        """The interface (NET/Socket) or adapter (NET/IB: mlx5_0:1) a network connection uses."""
        if not channel.transport.startswith("NET/") or channel.net_device is None:
            return None
        net = channel.via.split("/")[1].strip()
        for key in (net, "IB") if channel.transport == "NET/IB" else (net,):
            for dev in self.net_devices.get(key, []):
                if dev["index"] == channel.net_device:
                    # a socket's interface (eth0); an IB adapter with its port and link layer (mlx5_0:1/IB)
                    return dev["name"] if channel.transport == "NET/Socket" else f"{dev['name']}:{dev['address']}"
        return None

    def to_json(self) -> dict:
        out = asdict(self)
        out["transports"] = self.transports()
        return out


def parse(lines: Iterable[str]) -> NcclLog:
    """Read NCCL's INFO/WARN lines (anything else is skipped)."""
    log = NcclLog()
    for raw in lines:
        line = raw.rstrip("\n")
        found = _HEADER.match(line.strip())
        if found is None:
            version = _VERSION.search(line)
            if version and line.strip().startswith("NCCL version"):
                log.version = version.group("version")
            continue
        msg = found.group("msg").strip()
        if found.group("level") == "WARN":
            log.warnings.append(msg)
            continue
        if (m := _CHANNEL.match(msg)) is not None:
            family, device, gdr = transport_family(m.group("via"))
            log.channels.append(Channel(int(m.group("src")), int(m.group("dst")), family, m.group("via"),
                                        m.group("dir"), device, gdr))
        elif (m := _NET_USING.match(msg)) is not None:
            rest = m.group("rest").split(";")[0]  # "; OOB eth0:..." is the out-of-band interface of IB
            devices = [{"index": int(d.group("index")), "name": d.group("name"), "address": d.group("addr")}
                       for d in _DEVICE.finditer(rest)]
            net = m.group("net")
            log.net_devices[net] = devices
            if net.startswith("IB") and "IB" not in log.net_devices:
                log.net_devices["IB"] = devices
        elif (m := _BOOTSTRAP.match(msg)) is not None:
            log.bootstrap = {"interface": m.group("name"), "address": m.group("addr")}
        elif (m := _NETWORK.match(msg)) is not None:
            log.network = m.group("network")
        elif (m := _ENV.match(msg)) is not None:
            log.env[m.group("var")] = m.group("value")
        elif (m := _VERSION.search(msg)) is not None and msg.startswith("NCCL version"):
            log.version = m.group("version")
    return log


def between(log: NcclLog, a: int, b: int) -> list[Channel]:
    """The connections between ranks `a` and `b` of a communicator, both ways."""
    return [c for c in log.channels if {c.src, c.dst} == {a, b}]


def main_transport(channels: Iterable[Channel]) -> str | None:
    """The transport most connections use (ties: the first seen); None without connections."""
    counts = Counter(c.transport for c in channels)
    return counts.most_common(1)[0][0] if counts else None
