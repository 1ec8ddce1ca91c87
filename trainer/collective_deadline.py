"""Deadlines on collectives: a hang becomes one line that names both ends, the transport and the interface.

A collective that cannot make progress (a firewalled port, the wrong interface, a peer reachable only over
another network) blocks inside the backend until the process group's timeout (30 minutes by default) and
then says little. :class:`GroupWatch` runs a collective (the group's construction included: gloo connects
every pair there) on a helper thread while the calling thread waits with a deadline. The clock starts only
when every rank has arrived at the collective (a counter in the group's own store), so a slow peer that is
still loading a model is not a broken link. When the deadline passes, the waiting rank opens a TCP connection
from its own address to a small listener that every rank of the group published in the store, and raises
:class:`NoProgress` whose message is one line per link that fails::

    127.0.0.8 -> 127.0.0.7: no progress in 30 s (NET/Socket on eth1; NCCL_SOCKET_IFNAME=eth1)

The listeners bind port 0 (the kernel's ephemeral range, where gloo and NCCL open their data sockets) on the
rank's node address, so a link that drops those connections drops the probe too. Where every peer answers,
the line names this rank, the group's nodes and says so.

Stdlib and torch only (no Ray): the trainer's groups (``trainer.learn.group``), the weight-sync group
(``trainer.weights.broadcast.make_sync_group``) and ``rlrun check --fabric``'s job (``rlrun/fabric/job.py``) use it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

DEADLINE_ENV = "RLRUN_COLLECTIVE_DEADLINE_S"
DEFAULT_DEADLINE_S = 120.0  # the trainer's formation of a group (rlrun check --fabric: 30 s, --deadline)
PROBE_TIMEOUT_S = 3.0
STORE_TIMEOUT_S = 5.0  # the watch's own store connection: a dead store costs seconds, not the group's timeout
# The variables that choose a backend's interface or network, in the order the message names them.
INTERFACE_VARS = {
    "nccl": ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_NET", "NCCL_IB_DISABLE"),
    "gloo": ("GLOO_SOCKET_IFNAME",),
}


class NoProgress(RuntimeError):
    """A collective made no progress within its deadline; ``str()`` is the one-line answer (one line per
    failing link), ``details`` the same as data (for ``rlrun check --fabric``'s JSON)."""

    def __init__(self, message: str, details: dict[str, Any]):
        super().__init__(message)
        self.details = details

    def __reduce__(self):  # crosses Ray (pickled) with its details
        return (NoProgress, (str(self), self.details))


# --- the deadline and the interface variables --------------------------------------------------------------
def deadline_s(environ: Mapping[str, str] = os.environ, default: float = DEFAULT_DEADLINE_S) -> float:
    """Seconds a collective may make no progress once every rank arrived: $RLRUN_COLLECTIVE_DEADLINE_S."""
    raw = environ.get(DEADLINE_ENV, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400:
        raise ValueError(f"{DEADLINE_ENV}={raw!r}: expected seconds, a number in (0, 86400], e.g. 120")
    return value


def interface_env(backend: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables set here that choose `backend`'s interface or network (name -> value)."""
    return {var: environ[var] for var in INTERFACE_VARS.get(backend.lower(), ()) if environ.get(var)}


def ifname_matches(spec: str, names: Iterable[str], exact: bool = False) -> list[str]:
    """The interfaces among `names` that an interface variable selects, by NCCL's rules for
    NCCL_SOCKET_IFNAME: a comma list of prefixes, ``=`` first for exact names, ``^`` first for a list to
    leave out (then every other name). GLOO_SOCKET_IFNAME is one exact name (`exact`)."""
    names = sorted(names)
    spec = spec.strip()
    if exact:
        return [n for n in names if n == spec]
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    wanted = [w for w in spec.lstrip("=").split(",") if w]
    hit = [n for n in names if any(n == w if exact else n.startswith(w) for w in wanted)]
    return [n for n in names if n not in hit] if exclude else hit


# --- interfaces and addresses of this host ------------------------------------------------------------------
class _Sockaddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 14)]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [("next", ctypes.POINTER(_Ifaddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                     ("addr", ctypes.POINTER(_Sockaddr)), ("netmask", ctypes.POINTER(_Sockaddr)),
                     ("ifu", ctypes.POINTER(_Sockaddr)), ("data", ctypes.c_void_p)]


def interface_addresses() -> dict[str, list[str]]:
    """Every interface of this host (network namespace) with its IPv4 addresses, secondary ones included
    (getifaddrs(3): 127.0.0.7 on lo beside 127.0.0.1)."""
    out: dict[str, list[str]] = {}
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        names = []
    for name in names:
        out.setdefault(name, [])
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return out
    try:
        node = head
        while node:
            item = node.contents
            if item.addr and item.addr.contents.family == socket.AF_INET:
                raw = bytes(item.addr.contents.data[2:6])  # sockaddr_in: port (2 bytes), then the address
                out.setdefault(item.name.decode(), []).append(socket.inet_ntoa(raw))
            node = item.next
    finally:
        libc.freeifaddrs(head)
    return out


def interface_of(address: str, addresses: Mapping[str, list[str]] | None = None) -> str | None:
    """The interface holding `address` here (None when no interface has it)."""
    addresses = interface_addresses() if addresses is None else addresses
    for name, found in sorted(addresses.items()):
        if address in found:
            return name
    return None


def collective_interface(backend: str, address: str | None = None, environ: Mapping[str, str] = os.environ,
                         addresses: Mapping[str, list[str]] | None = None) -> str | None:
    """The interface `backend` uses here as far as its variable tells (the first it selects), else the one
    holding this rank's `address`."""
    addresses = interface_addresses() if addresses is None else addresses
    var = "GLOO_SOCKET_IFNAME" if backend.lower() == "gloo" else "NCCL_SOCKET_IFNAME"
    spec = environ.get(var, "").strip()
    if spec:
        found = ifname_matches(spec, addresses, exact=var == "GLOO_SOCKET_IFNAME")
        if found:
            return found[0]
    return interface_of(address, addresses) if address else None


def local_address(peer: str | None = None, environ: Mapping[str, str] = os.environ) -> str:
    """This rank's node address: $RLRUN_BIND_ADDRESS (the inventory's cluster__node_address, which every
    rlrun node exports), else the source address of the route to `peer`, else 127.0.0.1."""
    if environ.get("RLRUN_BIND_ADDRESS"):
        return environ["RLRUN_BIND_ADDRESS"]
    if peer:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((peer, 9))  # no packet is sent: this only asks the routing table
                return s.getsockname()[0]
        except OSError:
            pass
    return "127.0.0.1"


# --- the message --------------------------------------------------------------------------------------------
def no_progress_line(src: str, dst: str, seconds: float, transport: str | None = None,
                     interface: str | None = None, env: Mapping[str, str] | None = None,
                     backend: str | None = None) -> str:
    """``SRC -> DST: no progress in N s (TRANSPORT on IFACE; VAR=VALUE...)``: the one line of a hang.

    `env` holds the interface variables that were set (:func:`interface_env`); for a backend whose
    variable was not set, the line says so (``NCCL_SOCKET_IFNAME unset``): that is often the answer."""
    return f"{src} -> {dst}: no progress in {seconds:g} s ({_path(transport, interface, env, backend)})"


def _path(transport: str | None, interface: str | None, env: Mapping[str, str] | None,
          backend: str | None) -> str:
    via = transport or (backend.upper() if backend and backend.lower() == "nccl" else backend) or "collective"
    parts = [f"{via} on {interface}" if interface else via]
    env = dict(env or {})
    parts += [f"{k}={v}" for k, v in env.items()]
    if backend and not env:
        main = INTERFACE_VARS.get(backend.lower(), ("",))[0]
        if main:
            parts.append(f"{main} unset")
    return "; ".join(parts)


# --- running a collective with a deadline -------------------------------------------------------------------
def _works(result: Any) -> list[Any]:
    """The async work handles in what a collective call returned (a Work, a list of them, or nothing)."""
    items = result if isinstance(result, list | tuple) else [result]
    return [w for w in items if hasattr(w, "is_completed") and hasattr(w, "wait")]


def _store_client(store: Any) -> Any:
    """A connection of the watch's own to `store`, with a short timeout (the group's connection keeps its
    own timeout, and is busy while gloo connects); the store itself where it cannot be cloned."""
    try:
        client = store.clone()
        client.set_timeout(datetime.timedelta(seconds=STORE_TIMEOUT_S))
        return client
    except (AttributeError, RuntimeError, NotImplementedError):
        return store


class GroupWatch:
    """Deadlines for the collectives of one process group, and names for a hang.

    Every rank of the group makes one, on the group's store, before the group is formed, and then runs the
    group's collectives in the same order through :meth:`run`. ``address`` is this rank's node address (the
    one its peers reach it on), ``label`` how the message names it (default: the address), ``transport``
    what the message says the collective runs over (default: the backend's name; rlrun check --fabric
    passes what NCCL chose). :meth:`close` (or ``with``) ends its listener.
    """

    def __init__(self, store: Any, rank: int, world_size: int, backend: str, name: str, address: str,
                 deadline: float, label: str | None = None, transport: str | None = None,
                 arrival_s: float | None = None, environ: Mapping[str, str] = os.environ):
        if deadline <= 0:
            raise ValueError(f"deadline {deadline!r} s: expected a number of seconds > 0")
        self.rank, self.world_size, self.backend, self.name = rank, world_size, backend.lower(), name
        self.address, self.label = address, label or address
        self.deadline, self.arrival_s, self.transport = deadline, arrival_s, transport
        self.env = interface_env(self.backend, environ)
        self.interface = collective_interface(self.backend, address, environ)
        self._seq = 0
        self._listener: socket.socket | None = None
        self._client = None
        if world_size <= 1:
            return
        import torch.distributed as dist

        self._client = dist.PrefixStore(f"rlrun-watch/{name}/", _store_client(store))
        probe = None
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((address, 0))
            sock.listen(max(16, world_size))  # the kernel accepts the probes; nobody needs to call accept()
            self._listener, probe = sock, f"{address}:{sock.getsockname()[1]}"
        except OSError:
            pass  # not an address of this host: no probe, the message then says less
        self._client.set(f"peer/{rank}", json.dumps({"address": address, "label": self.label, "probe": probe}))

    def __enter__(self) -> GroupWatch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def run(self, what: str, fn: Callable[[], Any]) -> Any:
        """Call `fn` (a collective: it may return work handles, which are waited for) with the deadline;
        its result, its exception, or :class:`NoProgress`."""
        self._seq += 1
        key = f"{self._seq}/arrived"
        if self._client is not None:
            self._client.set(f"{key}/{self.rank}", "1")
            self._client.add(key, 1)
        done, box = threading.Event(), {}
        device = _current_cuda_device()

        def work() -> None:
            try:
                if device is not None:
                    import torch

                    torch.cuda.set_device(device)
                result = fn()
                for w in _works(result):
                    w.wait()  # gloo: blocks until done (its send/recv complete only here); NCCL: the stream waits
                    while not w.is_completed():  # NCCL: done on the device (polled: never blocks in CUDA)
                        time.sleep(0.002)
                box["result"] = result
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=work, name=f"rlrun-watch-{what}", daemon=True).start()
        started, everyone = time.monotonic(), None if self._client is not None else time.monotonic()
        while not done.wait(0.05 if everyone else 0.2):
            now = time.monotonic()
            if everyone is None:
                try:
                    arrived = self._client.add(key, 0)
                except Exception:  # noqa: BLE001 - a store that does not answer: count from now
                    arrived = self.world_size
                if arrived >= self.world_size:
                    everyone = now
                elif self.arrival_s is not None and now - started > self.arrival_s:
                    raise self._not_arrived(what, key, now - started)
            elif now - everyone > self.deadline:
                raise self._no_progress(what)
        if "error" in box:
            raise box["error"]
        return box.get("result")

    # --- what to say ---------------------------------------------------------------------------------------
    def _peers(self) -> dict[int, dict]:
        peers: dict[int, dict] = {}
        for r in range(self.world_size):
            if r == self.rank:
                continue
            try:
                if self._client.check([f"peer/{r}"]):
                    peers[r] = json.loads(self._client.get(f"peer/{r}"))
            except Exception:  # noqa: BLE001 - the store may be what is broken
                pass
        return peers

    def _probe(self, target: str | None) -> str | None:
        """None when a TCP connection from this rank's address to `target` opens, else why not."""
        if not target:
            return None
        host, _, port = target.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S,
                                          source_address=(self.address, 0)):
                return None
        except TimeoutError:
            return f"a TCP connect timed out after {PROBE_TIMEOUT_S:g} s"
        except OSError as exc:
            return f"a TCP connect failed: {exc.strerror or exc}"

    def _linger(self) -> None:
        """Keep the listener open a while after a deadline: the peers, who reach theirs at about the same
        time, are probing it (closed at once, it would make every link from them look broken)."""
        sock, self._listener = self._listener, None
        if sock is not None:
            timer = threading.Timer(4 * PROBE_TIMEOUT_S, sock.close)
            timer.daemon = True
            timer.start()

    def _no_progress(self, what: str) -> NoProgress:
        self._linger()
        peers = self._peers()
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(peers)))) as pool:
            probes = dict(zip(peers, pool.map(lambda p: self._probe(p.get("probe")), peers.values()), strict=True))
        failing = {r: why for r, why in probes.items() if why}
        path = dict(transport=self.transport, interface=self.interface, env=self.env, backend=self.backend)
        if failing:
            lines = [no_progress_line(self.label, peers[r]["label"], self.deadline, **path) for r in sorted(failing)]
        else:
            nodes = sorted({p["label"] for p in peers.values()} | {self.label})
            unknown = self.world_size - 1 - len(peers)
            lines = [f"{self.label}: no progress in {self.deadline:g} s in {what} of {self.name} "
                     f"({self.world_size} ranks on {', '.join(nodes)}"
                     + (f"; {unknown} not in the store" if unknown else "; every peer answers a TCP connect")
                     + f") ({_path(**path)})"]
        details = {"what": what, "group": self.name, "rank": self.rank, "seconds": self.deadline,
                   "from": self.label, "address": self.address, "interface": self.interface, "env": self.env,
                   "transport": self.transport, "backend": self.backend,
                   "unreachable": {peers[r]["label"]: why for r, why in sorted(failing.items())},
                   "peers": sorted(p["label"] for p in peers.values())}
        return NoProgress("\n".join(lines), details)

    def _not_arrived(self, what: str, key: str, waited: float) -> NoProgress:
        self._linger()
        missing = []
        for r in range(self.world_size):
            try:
                if not self._client.check([f"{key}/{r}"]):
                    missing.append(r)
            except Exception:  # noqa: BLE001
                missing.append(r)
        peers = self._peers()
        names = [peers.get(r, {}).get("label", f"rank {r}") for r in missing]
        line = (f"{self.label}: {what} of {self.name}: {', '.join(names) or 'some ranks'} did not arrive within "
                f"{waited:.0f} s ({_path(self.transport, self.interface, self.env, self.backend)})")
        return NoProgress(line, {"what": what, "group": self.name, "rank": self.rank, "seconds": waited,
                                 "from": self.label, "not_arrived": names, "backend": self.backend})


def _current_cuda_device() -> int | None:
    """The calling thread's CUDA device where CUDA is in use (a helper thread starts on device 0)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()
