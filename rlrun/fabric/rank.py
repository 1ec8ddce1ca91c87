"""One rank of the fabric check (a Ray actor of ``rlrun/fabric/job.py``): what its node has, and its side of
each pair test and of the all-reduce, every collective under a deadline (``GroupWatch``).

A rank inherits its node's ``ray start`` environment (the accelerator env file: NCCL / Gloo interface
variables, ``NCCL_HOSTID``); it only adds ``NCCL_DEBUG=INFO`` and a ``NCCL_DEBUG_FILE`` of its own, read
back after each test for the transports NCCL chose. Imports torch lazily: the driver does not need it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import tempfile
import time

from trainer.errors import one_line

NCCL_SUBSYS = "INIT,NET,P2P,ENV"
ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "RLRUN_BIND_ADDRESS",
                "RLRUN_RENDEZVOUS_PORTS")


# --- what a node has -----------------------------------------------------------------------------------------
def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def node_interfaces() -> dict[str, dict]:
    """Every interface: operstate, link speed in Mb/s (None where the kernel has none: lo, veth on old
    kernels), MTU, IPv4 addresses."""
    # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
    from trainer.collective_deadline import interface_addresses

    addresses = interface_addresses()
    out = {}
    for name in sorted(set(os.listdir("/sys/class/net")) | set(addresses)):
        speed = _read(f"/sys/class/net/{name}/speed")
        try:
            mbps = int(speed) if speed is not None else None
        except ValueError:
            mbps = None
        out[name] = {"state": _read(f"/sys/class/net/{name}/operstate") or "unknown",
                     "speed_mbps": mbps if mbps and mbps > 0 else None,
                     "mtu": int(_read(f"/sys/class/net/{name}/mtu") or 0) or None,
                     "addresses": addresses.get(name, [])}
    return out


def node_infiniband() -> list[dict]:
    """InfiniBand / RoCE adapters (/sys/class/infiniband) and their ports: state, rate, link layer."""
    root = "/sys/class/infiniband"
    out = []
    for dev in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        ports = []
        port_root = f"{root}/{dev}/ports"
        for port in sorted(os.listdir(port_root)) if os.path.isdir(port_root) else []:
            ports.append({"port": port, "state": _read(f"{port_root}/{port}/state"),
                          "rate": _read(f"{port_root}/{port}/rate"),
                          "link_layer": _read(f"{port_root}/{port}/link_layer")})
        out.append({"device": dev, "ports": ports})
    return out


def _own_tcp_sockets() -> dict[int, tuple[str, str, str]]:
    """This process's TCP sockets: inode -> (local ip:port, remote ip:port, state hex)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    out = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in (_read(table) or "").splitlines()[1:]:
            cols = line.split()
            if len(cols) > 9 and int(cols[9]) in inodes:
                out[int(cols[9])] = (_hex_endpoint(cols[1]), _hex_endpoint(cols[2]), cols[3])
    return out


def _hex_endpoint(text: str) -> str:
    """/proc/net/tcp's ``0100007F:1F90`` (or a tcp6 v4-mapped address) as ``127.0.0.1:8080``."""
    addr, port = text.split(":")
    raw = bytes.fromhex(addr)
    if len(raw) == 16:  # tcp6: four little-endian words; v4-mapped addresses end in the IPv4 one
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
        ip = socket.inet_ntoa(raw[12:]) if raw[:12] == b"\0" * 10 + b"\xff\xff" else socket.inet_ntop(
            socket.AF_INET6, raw)
    else:
        ip = socket.inet_ntoa(raw[::-1])
    return f"{ip}:{int(port, 16)}"


# --- one rank ------------------------------------------------------------------------------------------------
class Rank:
    """One rank of the check (a Ray actor): a node's first rank also describes the node."""

    def __init__(self, rank: int, address: str, label: str, backend: str):
        self.started = time.time()  # when the actor's process got to it (the driver sees how long a start took)
        self.rank, self.address, self.label, self.backend = rank, address, label, backend
        self.env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
        self.logdir = tempfile.mkdtemp(prefix="rlrun-fabric-")
        self.stuck = False  # an NCCL collective of this rank never finished: no more tests on this GPU
        self._listeners: dict[int, socket.socket] = {}
        if backend == "nccl":  # NCCL reads these at its first call, which is still to come in this process
            os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS=NCCL_SUBSYS,
                              NCCL_DEBUG_FILE=os.path.join(self.logdir, "nccl.%p.log"))

    def describe(self, full: bool) -> dict:
        # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
        import platform

        # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
        import ray
        import torch

        out = {"rank": self.rank, "address": self.address, "label": self.label, "pid": os.getpid(),
               "hostname": socket.gethostname(), "env": self.env, "started": self.started}
        if self.backend == "nccl":
            torch.cuda.set_device(0)
            props = torch.cuda.get_device_properties(0)
            out["gpu"] = {"name": props.name, "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
        if full:
            versions = {"python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__,
                        "cuda": torch.version.cuda}
            if torch.cuda.is_available():
                try:
                    nccl = torch.cuda.nccl.version()
                    versions["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
                except Exception:  # noqa: BLE001 - a torch without NCCL
                    versions["nccl"] = None
            out.update(versions=versions, interfaces=node_interfaces(), infiniband=node_infiniband())
        out["described"] = time.time()
        return out

    def listen(self) -> tuple[str, int]:
        """(address, port) of a store this rank will host: a port of the cluster's rendezvous range
        ($RLRUN_RENDEZVOUS_PORTS, as the trainer's groups), listening from now on."""
        # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
        from trainer.learn.group import rendezvous_listener

        sock = rendezvous_listener(self.address)
        port = sock.getsockname()[1]
        self._listeners[port] = sock
        return self.address, port

    def _store(self, spec: dict, world: int):
        # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
        import datetime

        # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
        import torch.distributed as dist

        host, port = spec["store"]
        timeout = datetime.timedelta(seconds=spec["deadline"])
        if spec["rank"] == 0:
            sock = self._listeners.pop(port)
            return dist.TCPStore(host, port, world, True, timeout=timeout, wait_for_workers=False,
                                 master_listen_fd=sock.detach())
        return dist.TCPStore(host, port, world, False, timeout=timeout)

    def set_label(self, label: str) -> None:
        self.label = label

    def _log_offset(self) -> int:
        return len(self._nccl_lines()[1])

    def _nccl_lines(self, offset: int = 0) -> tuple[list[str], list[str]]:
        """(this process's NCCL lines after the first `offset`, all its lines)."""
        lines: list[str] = []
        for name in sorted(os.listdir(self.logdir)):
            with open(os.path.join(self.logdir, name), encoding="utf-8", errors="replace") as fh:
                lines += fh.read().splitlines()
        return lines[offset:], lines

    def _group(self, spec: dict, world: int, store):
        # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
        import datetime

        # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
        import torch
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=2 * spec["deadline"])  # ends a thread left behind on its own
        prefix = dist.PrefixStore("pg/", store)
        if self.backend == "gloo":
            return dist.ProcessGroupGloo(prefix, spec["rank"], world, timeout), torch.device("cpu")
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefix, spec["rank"], world, opts), torch.device("cuda", 0)

    def pair(self, spec: dict) -> dict:
        """One side of a pair test (spec: id, rank 0|1, store, peer, size, iters, deadline); never raises."""
        # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
        from trainer.collective_deadline import GroupWatch, NoProgress

        out: dict = {"rank": self.rank, "label": self.label, "status": "ok", "phase": None}
        before, offset = set(_own_tcp_sockets()), self._log_offset() if self.backend == "nccl" else 0
        watch = pg = None
        phase = "store"
        try:
            t0 = time.monotonic()
            store = self._store(spec, 2)
            watch = GroupWatch(store, spec["rank"], 2, self.backend, f"pair-{spec['id']}", self.address,
                               spec["deadline"], label=self.label, arrival_s=spec["deadline"])
            phase = "connect"
            pg, device = watch.run(phase, lambda: self._group(spec, 2, store))
            watch.run(phase, lambda: _exchange(pg, spec["rank"], 1, device, ping=False))
            out["connect_s"] = time.monotonic() - t0
            if self.backend == "gloo":
                # gloo's sockets now, while both ends surely hold them: gloo closes its end of a pair as soon
                # as the peer shuts its group down, which the peer may do before this rank's test is over
                out.update(self._evidence(before, offset, spec["store"][1]))
            if self.backend == "nccl":
                watch.transport = _transport(self._nccl_lines(offset)[0])
            phase = "latency"
            out["latency_us"] = watch.run(phase, lambda: _latency(pg, spec["rank"], device, spec["pings"]))
            for direction, sender in (("a->b", 0), ("b->a", 1)):
                phase = f"bandwidth {direction}"
                gbps = watch.run(phase, lambda s=sender: _bandwidth(pg, spec["rank"], s, device, spec["size"],
                                                                     spec["iters"]))
                if gbps is not None:
                    out.setdefault("gbps", {})[direction] = gbps
        except NoProgress as exc:
            out.update(status="no-progress", phase=phase, line=str(exc), details=exc.details)
            self.stuck = self.backend == "nccl"
        except Exception as exc:  # noqa: BLE001 - the driver reports it for this pair
            out.update(status="error", phase=phase, error=one_line(exc))
        finally:
            if "sockets" not in out:  # NCCL's lines (kept in its file); gloo's sockets when the test failed
                out.update(self._evidence(before, offset, spec["store"][1]))
            if watch is not None:
                watch.close()
            if pg is not None and out["status"] == "ok":
                _shutdown(pg)
        return out

    def allreduce(self, spec: dict) -> dict:
        """One rank's part of the all-reduce across every rank; never raises."""
        # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
        from trainer.collective_deadline import GroupWatch, NoProgress

        out: dict = {"rank": self.rank, "label": self.label, "status": "ok", "phase": None}
        offset = self._log_offset() if self.backend == "nccl" else 0
        watch = pg = None
        phase = "store"
        world = spec["world"]
        try:
            store = self._store(spec, world)
            watch = GroupWatch(store, spec["rank"], world, self.backend, "allreduce", self.address,
                               spec["deadline"], label=self.label, arrival_s=spec["deadline"])
            phase = "connect"
            pg, device = watch.run(phase, lambda: self._group(spec, world, store))
            watch.run(phase, lambda: _allreduce(pg, device, 4, 1))
            if self.backend == "nccl":
                watch.transport = _transport(self._nccl_lines(offset)[0])
            phase = "all-reduce"
            out["seconds"] = watch.run(phase, lambda: _allreduce(pg, device, spec["size"], spec["iters"]))
        except NoProgress as exc:
            out.update(status="no-progress", phase=phase, line=str(exc), details=exc.details)
            self.stuck = self.backend == "nccl"
        except Exception as exc:  # noqa: BLE001
            out.update(status="error", phase=phase, error=one_line(exc))
        finally:
            if watch is not None:
                watch.close()
            if pg is not None and out["status"] == "ok":
                _shutdown(pg)
        if self.backend == "nccl":
            out["nccl"] = self._nccl_lines(offset)[0]
        return out

    def _evidence(self, before: set[int], offset: int, store_port: int) -> dict:
        """What the pair's group used: NCCL's lines (its 'Using' lines from any time), or gloo's sockets."""
        if self.backend == "nccl":
            since, every = self._nccl_lines(offset)
            using = [line for line in every if " : Using " in line or "Using network" in line
                     or "NCCL version" in line]
            return {"nccl": list(dict.fromkeys(using + since))}
        # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
        from trainer.collective_deadline import interface_addresses, interface_of

        addresses = interface_addresses()
        found = []
        for inode, (local, remote, state) in _own_tcp_sockets().items():
            ports = {int(local.rsplit(":", 1)[1]), int(remote.rsplit(":", 1)[1])}
            # 0A: LISTEN (the watch's probe listener); the peer may have closed its end already (CLOSE_WAIT)
            if inode in before or store_port in ports or state == "0A":
                continue
            found.append({"local": local, "remote": remote,
                          "interface": interface_of(local.rsplit(":", 1)[0], addresses)})
        return {"sockets": sorted(found, key=lambda s: s["local"])}

    def close(self) -> None:
        for sock in self._listeners.values():
            sock.close()
        shutil.rmtree(self.logdir, ignore_errors=True)


# --- the collectives (run on GroupWatch's helper thread) ---------------------------------------------------
def _finish(work) -> None:
    """Until `work` is done: gloo's wait() blocks until then (its send/recv are complete only after it);
    NCCL's only makes the stream wait, so its completion on the device is polled (a spin: latencies are
    microseconds)."""
    work.wait()
    while not work.is_completed():
        pass


def _exchange(pg, rank: int, n: int, device, ping: bool) -> None:
    """Rank 0 sends n bytes to rank 1 (and back with `ping`)."""
    # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
    import torch

    buf = torch.zeros(n, dtype=torch.uint8, device=device)
    if rank == 0:
        _finish(pg.send([buf], 1, 0))
        if ping:
            _finish(pg.recv([buf], 1, 0))
    else:
        _finish(pg.recv([buf], 0, 0))
        if ping:
            _finish(pg.send([buf], 0, 0))


def _latency(pg, rank: int, device, pings: int) -> float:
    """Half the median round trip of 8 bytes, in microseconds."""
    times = []
    for _ in range(pings):
        t0 = time.perf_counter()
        _exchange(pg, rank, 8, device, ping=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / 2 * 1e6


TIMED_S = 2.0  # about how long a timed loop runs: fewer messages on a slow link, so it never nears the deadline


def _count(one: float, most: int) -> int:
    """How many messages to time, from the warm-up's seconds for one: at most `most`, about TIMED_S in all."""
    return max(1, min(most, int(TIMED_S / max(one, 1e-6))))


def _bandwidth(pg, rank: int, sender: int, device, size: int, iters: int) -> float | None:
    """`sender` sends `size` bytes, the receiver answers with 1 byte: once to warm up (timed by the sender,
    which then picks how many to time, at most `iters`, and tells the receiver), then that many back to back;
    the sender's GB/s (None on the receiver)."""
    # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
    import torch

    buf = torch.zeros(size, dtype=torch.uint8, device=device)
    ack = torch.zeros(1, dtype=torch.uint8, device=device)
    count = torch.ones(1, dtype=torch.int64, device=device)
    peer = 1 - rank
    for timed in (False, True):
        n = int(count.item())
        t0 = time.perf_counter()
        if rank == sender:
            works = [pg.send([buf], peer, 1) for _ in range(n)]
            for w in works:
                _finish(w)
            _finish(pg.recv([ack], peer, 2))
        else:
            works = [pg.recv([buf], peer, 1) for _ in range(n)]
            for w in works:
                _finish(w)
            _finish(pg.send([ack], peer, 2))
        seconds = time.perf_counter() - t0
        if not timed:
            if rank == sender:
                count.fill_(_count(seconds, iters))
                _finish(pg.send([count], peer, 3))
            else:
                _finish(pg.recv([count], peer, 3))
    return size * n / seconds / 1e9 if rank == sender else None


def _allreduce(pg, device, size: int, iters: int) -> float:
    """Seconds per all-reduce of `size` bytes of float32: one to warm up, then as many as the slowest rank's
    warm-up allows (at most `iters`, about TIMED_S in all; the ranks agree on the fewest)."""
    # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
    import torch
    import torch.distributed as dist

    buf = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
    t0 = time.perf_counter()
    _finish(pg.allreduce([buf]))
    count = torch.tensor([_count(time.perf_counter() - t0, iters)], dtype=torch.int64, device=device)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MIN
    _finish(pg.allreduce([count], opts))
    n = int(count.item())
    t0 = time.perf_counter()
    for _ in range(n):
        _finish(pg.allreduce([buf]))
    return (time.perf_counter() - t0) / n


def _shutdown(pg) -> None:
    with contextlib.suppress(Exception):  # an older torch without shutdown(): dropped with the object
        pg.shutdown()


def _transport(lines: list[str]) -> str | None:
    # the rank's side: torch, Ray and the trainer's helpers load on the node where it runs
    from rlrun.fabric.nccl_log import main_transport, parse

    return main_transport(parse(lines).channels)
