"""Deadlines on collectives (trainer/collective_deadline.py): the one-line message, the interface variables'
rules, and GroupWatch on real gloo groups of two ranks (threads of this process, over loopback): a collective
that completes, a peer that arrives and never takes part (its listener closed: the link looks broken; or
open: every peer answers), a peer that never arrives, an error that is not a hang."""

from __future__ import annotations

import datetime
import pickle
import threading
import time

import pytest
import torch
import torch.distributed as dist

from tests.conftest import free_port
from trainer import collective_deadline as cd
from trainer.collective_deadline import GroupWatch, NoProgress, ifname_matches, no_progress_line


def test_the_line_names_both_ends_the_transport_the_interface_and_its_variable():
    # the issue's own example
    assert no_progress_line("127.0.0.8", "127.0.0.7", 30, "NET/Socket", "eth1", {"NCCL_SOCKET_IFNAME": "eth1"}) == (
        "127.0.0.8 -> 127.0.0.7: no progress in 30 s (NET/Socket on eth1; NCCL_SOCKET_IFNAME=eth1)")
    assert no_progress_line("10.0.0.2", "10.0.0.1", 12.5, None, "eth0", {"GLOO_SOCKET_IFNAME": "eth0"},
                            backend="gloo") == "10.0.0.2 -> 10.0.0.1: no progress in 12.5 s (gloo on eth0; " \
                                               "GLOO_SOCKET_IFNAME=eth0)"
    # unset: the line says so (the usual answer when NCCL picked docker0 or a VPN)
    assert no_progress_line("a", "b", 30, None, "docker0", {}, backend="nccl") == (
        "a -> b: no progress in 30 s (NCCL on docker0; NCCL_SOCKET_IFNAME unset)")
    assert no_progress_line("a", "b", 30) == "a -> b: no progress in 30 s (collective)"


def test_interface_env_keeps_the_backends_own_variables():
    env = {"NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5_0", "PATH": "/bin",
           "NCCL_DEBUG": "INFO", "NCCL_NET": ""}
    assert cd.interface_env("nccl", env) == {"NCCL_SOCKET_IFNAME": "eth1", "NCCL_IB_HCA": "mlx5_0"}
    assert cd.interface_env("gloo", env) == {"GLOO_SOCKET_IFNAME": "eth0"}


@pytest.mark.parametrize(("spec", "exact", "want"), [
    ("eth", False, ["eth0", "eth1"]),            # NCCL: a prefix
    ("eth1,ib", False, ["eth1", "ib0"]),
    ("=eth", False, []),                          # = : exact names only
    ("=eth1", False, ["eth1"]),
    ("^docker,lo", False, ["eth0", "eth1", "ib0"]),  # ^ : everything but
    ("eth", True, []),                            # GLOO_SOCKET_IFNAME: one exact name
    ("eth0", True, ["eth0"]),
])
def test_ifname_rules(spec, exact, want):
    assert ifname_matches(spec, ["lo", "eth0", "eth1", "docker0", "ib0"], exact=exact) == want


def test_this_hosts_interfaces_and_the_one_a_variable_picks():
    addresses = cd.interface_addresses()
    assert "127.0.0.1" in addresses["lo"]
    assert cd.interface_of("127.0.0.1", addresses) == "lo"
    assert cd.interface_of("203.0.113.9", addresses) is None
    fake = {"lo": ["127.0.0.1", "127.0.0.7"], "eth0": ["10.0.0.2"], "eth1": ["10.1.0.2"]}
    assert cd.collective_interface("nccl", "10.0.0.2", {"NCCL_SOCKET_IFNAME": "eth1"}, fake) == "eth1"
    assert cd.collective_interface("nccl", "127.0.0.7", {}, fake) == "lo"  # a secondary address counts
    assert cd.collective_interface("gloo", "10.0.0.2", {"GLOO_SOCKET_IFNAME": "eth9"}, fake) == "eth0"


def test_the_deadline_variable_is_checked():
    assert cd.deadline_s({}) == cd.DEFAULT_DEADLINE_S
    assert cd.deadline_s({cd.DEADLINE_ENV: " 45 "}) == 45.0
    for bad in ("soon", "0", "-3", "1e9"):
        with pytest.raises(ValueError, match=rf"RLRUN_COLLECTIVE_DEADLINE_S='{bad}': expected seconds"):
            cd.deadline_s({cd.DEADLINE_ENV: bad})


def test_local_address_prefers_the_nodes_own():
    assert cd.local_address("10.0.0.1", {"RLRUN_BIND_ADDRESS": "10.0.0.5"}) == "10.0.0.5"
    assert cd.local_address("127.0.0.1", {}) == "127.0.0.1"


def test_no_progress_crosses_pickling_with_its_details():
    exc = NoProgress("a -> b: no progress in 1 s (gloo)", {"unreachable": {"b": "refused"}})
    back = pickle.loads(pickle.dumps(exc))
    assert str(back) == str(exc) and back.details == exc.details


# --- GroupWatch on real gloo groups ------------------------------------------------------------------------

def _two_ranks(behaviour, deadline: float = 1.5, arrival_s: float | None = None) -> dict[int, object]:
    """Run behaviour(rank, store, watch) on two threads, one per rank; rank -> what it returned or raised."""
    port, out = free_port(), {}

    def rank(r: int) -> None:
        store = dist.TCPStore("127.0.0.1", port, 2, r == 0, timeout=datetime.timedelta(seconds=30))
        watch = GroupWatch(store, r, 2, "gloo", "test", "127.0.0.1", deadline, label=f"node{r}", arrival_s=arrival_s,
                           environ={"GLOO_SOCKET_IFNAME": "lo"})
        started = time.monotonic()
        try:
            out[r] = behaviour(r, store, watch)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            out[r] = exc
        out[f"{r}/seconds"] = time.monotonic() - started

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # A collective left behind by a deadline goes on in C++ on the watch's helper thread until the group's own
    # timeout (GLOO_TIMEOUT_S): wait for it, as an interpreter that exits under it aborts ("terminate called").
    # (In a job its actor process is killed instead.)
    for t in threading.enumerate():
        if t.name.startswith("rlrun-watch-"):
            t.join(GLOO_TIMEOUT_S + 10)
    return out


GLOO_TIMEOUT_S = 4  # the groups' own timeout: past every deadline here, short enough to wait for


def _gloo(r, store):
    return dist.ProcessGroupGloo(dist.PrefixStore("pg/", store), r, 2, datetime.timedelta(seconds=GLOO_TIMEOUT_S))


def test_a_collective_that_completes_returns_its_result():
    def behaviour(r, store, watch):
        pg = watch.run("connect", lambda: _gloo(r, store))
        t = torch.full((4,), float(r + 1))
        watch.run("all-reduce", lambda: pg.allreduce([t]))
        buf = torch.zeros(3)
        watch.run("send/recv", lambda: pg.send([torch.ones(3)], 1, 0) if r == 0 else pg.recv([buf], 0, 0))
        watch.close()
        return t.tolist(), buf.tolist()

    out = _two_ranks(behaviour)
    assert out[0] == ([3.0] * 4, [0.0] * 3) and out[1] == ([3.0] * 4, [1.0] * 3)


def test_a_peer_whose_link_fails_is_named_with_the_interface_within_the_deadline():
    """Rank 1 arrives and then never takes part, with its listener closed: from rank 0 the link to rank 1 is
    broken (a TCP connect is refused), and the line names both and gloo's interface."""
    def behaviour(r, store, watch):
        if r == 1:
            watch.close()
            return watch.run("connect", lambda: time.sleep(3))
        return watch.run("connect", lambda: _gloo(r, store))

    out = _two_ranks(behaviour, deadline=1.5)
    assert isinstance(out[0], NoProgress), out
    assert str(out[0]) == "node0 -> node1: no progress in 1.5 s (gloo on lo; GLOO_SOCKET_IFNAME=lo)"
    assert out[0].details["unreachable"] == {"node1": "a TCP connect failed: Connection refused"}
    assert isinstance(out[1], NoProgress)  # its listener lingers after a deadline: rank 0 stays reachable
    assert str(out[1]).startswith("node1: no progress in 1.5 s in connect of test (2 ranks on node0, node1; "
                                  "every peer answers a TCP connect) (gloo on lo;")


def test_a_peer_that_arrives_and_hangs_with_its_link_fine_is_said_so():
    def behaviour(r, store, watch):
        if r == 1:
            return watch.run("connect", lambda: time.sleep(3))
        return watch.run("connect", lambda: _gloo(r, store))

    out = _two_ranks(behaviour, deadline=1.0)
    assert str(out[0]) == ("node0: no progress in 1 s in connect of test (2 ranks on node0, node1; every peer "
                           "answers a TCP connect) (gloo on lo; GLOO_SOCKET_IFNAME=lo)")


def test_the_clock_starts_when_every_rank_arrived():
    """Rank 1 comes 2.5 s late (a slow model load, not a broken link): with a 1 s deadline nothing is reported,
    since the deadline counts from the last arrival."""
    def behaviour(r, store, watch):
        if r == 1:
            time.sleep(2.5)
        pg = watch.run("connect", lambda: _gloo(r, store))
        t = torch.ones(2)
        watch.run("all-reduce", lambda: pg.allreduce([t]))
        return t.tolist()

    out = _two_ranks(behaviour, deadline=1.0)
    assert out[0] == [2.0, 2.0] and out[1] == [2.0, 2.0], out
    assert out["0/seconds"] >= 2.4


def test_a_peer_that_never_arrives_is_named_after_the_arrival_limit():
    def behaviour(r, store, watch):
        if r == 1:
            return time.sleep(2)
        return watch.run("connect", lambda: _gloo(r, store))

    out = _two_ranks(behaviour, deadline=1.0, arrival_s=1.2)
    assert isinstance(out[0], NoProgress)
    assert str(out[0]).startswith("node0: connect of test: node1 did not arrive within 1 s (gloo on lo")
    assert out[0].details["not_arrived"] == ["node1"]


def test_an_error_is_raised_as_itself_not_as_a_hang():
    def behaviour(r, store, watch):
        return watch.run("bad", lambda: (_ for _ in ()).throw(ValueError(f"broken on {r}")))

    out = _two_ranks(behaviour)
    assert isinstance(out[0], ValueError) and str(out[0]) == "broken on 0"


def test_a_one_rank_group_needs_no_store():
    watch = GroupWatch(None, 0, 1, "gloo", "solo", "127.0.0.1", 1.0)
    assert watch.run("nothing", lambda: 42) == 42
    with pytest.raises(ValueError, match="deadline 0 s: expected a number of seconds > 0"):
        GroupWatch(None, 0, 1, "gloo", "solo", "127.0.0.1", 0)
