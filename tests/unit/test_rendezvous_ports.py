"""The trainer's rendezvous stores listen on the node address only, on the cluster's pinned range
(RLRUN_RENDEZVOUS_PORTS, which the Ray node's env file sets from cluster__rendezvous_*_port)."""

from __future__ import annotations

import datetime
import socket
from pathlib import Path

import pytest
import torch.distributed as dist

from trainer.learn.group import RENDEZVOUS_PORTS_ENV, DistributedWorker, rendezvous_listener
from trainer.weights.broadcast import close_sync_group, make_sync_group


def _free_block(n: int, ip: str = "127.0.0.5") -> range:
    """n consecutive ports free on `ip` (searched from a random free port)."""
    with socket.socket() as s:
        s.bind((ip, 0))
        start = s.getsockname()[1]
    for first in range(min(start, 60000), 1024, -n):
        block = range(first, first + n)
        try:
            for port in block:
                with socket.socket() as s:
                    s.bind((ip, port))
            return block
        except OSError:
            continue
    raise AssertionError("no free block")


def _listening(port: int) -> list[str]:
    """Local addresses of the IPv4/IPv6 listeners on `port` in this network namespace."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            addr, hexport = f[1].rsplit(":", 1)
            if f[3] == "0A" and int(hexport, 16) == port:
                found.append(socket.inet_ntoa(bytes.fromhex(addr)[::-1]) if len(addr) == 8 else "v6:" + addr)
    return found


def test_listeners_take_the_range_from_the_top_on_the_node_address(monkeypatch):
    block = _free_block(3)
    monkeypatch.setenv(RENDEZVOUS_PORTS_ENV, f"{block[0]}-{block[-1]}")
    first = rendezvous_listener("127.0.0.5")
    second = rendezvous_listener("127.0.0.5")
    try:
        assert first.getsockname() == ("127.0.0.5", block[-1])
        assert second.getsockname() == ("127.0.0.5", block[-2])
        assert _listening(block[-1]) == ["127.0.0.5"]
    finally:
        first.close()
        second.close()


def test_a_full_range_names_the_inventory_variables(monkeypatch):
    block = _free_block(2)
    monkeypatch.setenv(RENDEZVOUS_PORTS_ENV, f"{block[0]}-{block[-1]}")
    held = [rendezvous_listener("127.0.0.5") for _ in block]
    try:
        with pytest.raises(RuntimeError, match=r"no free port .* \(all 2 taken\): widen cluster__rendezvous_min_port"):
            rendezvous_listener("127.0.0.5")
    finally:
        for s in held:
            s.close()


@pytest.mark.parametrize("spec", ["8120", "8199-8120", "a-b", "0-10", "8120-70000"])
def test_a_malformed_range_is_refused(monkeypatch, spec):
    monkeypatch.setenv(RENDEZVOUS_PORTS_ENV, spec)
    with pytest.raises(RuntimeError, match=r"expected FIRST-LAST, e\.g\. 8120-8199 \(cluster__rendezvous_min_port"):
        rendezvous_listener("127.0.0.5")


def test_without_the_range_any_free_port_on_the_node_address(monkeypatch):
    monkeypatch.delenv(RENDEZVOUS_PORTS_ENV, raising=False)
    sock = rendezvous_listener("127.0.0.5")
    try:
        assert sock.getsockname()[0] == "127.0.0.5" and sock.getsockname()[1] > 0
    finally:
        sock.close()


def test_the_store_serves_on_the_held_socket_bound_to_the_node_address(monkeypatch):
    """The weight-sync group's store (make_sync_group) on the socket a worker holds: it listens on
    the node address only (not on every interface as TCPStore alone would), and a member joins it."""
    block = _free_block(4)
    monkeypatch.setenv(RENDEZVOUS_PORTS_ENV, f"{block[0]}-{block[-1]}")
    worker = DistributedWorker(0, 1)
    sock = rendezvous_listener("127.0.0.5")
    port = sock.getsockname()[1]
    worker.__dict__.setdefault("_rendezvous", {})[port] = sock
    fd = worker.take_listen_fd(port)
    assert fd is not None and worker.take_listen_fd(port) is None
    group = make_sync_group("127.0.0.5", port, 0, 1, backend="gloo", timeout_s=30, master_listen_fd=fd)
    try:
        assert _listening(port) == ["127.0.0.5"]
        client = dist.TCPStore("127.0.0.5", port, None, False, timeout=datetime.timedelta(seconds=10))
        client.set("k", "v")
        assert group.store.get("k") == b"v"
    finally:
        close_sync_group(group)
