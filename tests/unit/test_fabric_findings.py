"""`rlrun check --fabric` without a cluster: the findings' thresholds on hand-made reports
(rlrun/fabric/findings.py), the ranks and pairs the job plans (rlrun/fabric/job.py), the table, and the
files shipped as the job's working dir (every rlrun / trainer module they import is shipped with them)."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import pytest

from rlrun.fabric import check, findings, job
from rlrun.fabric.findings import SLOW_FRACTION, evaluate, has_errors, link_gbps

PROJECT = Path(__file__).resolve().parents[2]


def _node(address, speed=None, state="up", versions=None, env=None, ib=None, name="eth0"):
    return {"address": address, "gpus": 8, "env": env or {"NCCL_SOCKET_IFNAME": name},
            "versions": versions or {"torch": "2.11.0", "nccl": "2.28.9", "cuda": "13.0", "python": "3.12.3",
                                     "ray": "2.60.0"},
            "interfaces": {"lo": {"state": "unknown", "speed_mbps": None}, name: {"state": state, "speed_mbps": speed}},
            "infiniband": ib or []}


def _pair(a, b, gbps, transport="NET/Socket", interface="eth0", kind="inter", status="ok", **kw):
    return {"a": a, "b": b, "kind": kind, "status": status, "transport": transport, "interface": interface,
            "gbps": {"a->b": gbps, "b->a": gbps}, **kw}


def _report(nodes, pairs, backend="nccl", allreduce=None):
    return {"backend": backend, "nodes": nodes, "pairs": pairs, "allreduce": allreduce or {"status": "ok"},
            "problems": []}


IB_ACTIVE = [{"device": "mlx5_0", "ports": [{"port": "1", "state": "4: ACTIVE", "rate": "200 Gb/sec (4X HDR)",
                                              "link_layer": "InfiniBand"}]}]


def test_a_healthy_report_has_no_findings():
    nodes = [_node("10.0.0.1", 100_000), _node("10.0.0.2", 100_000)]
    assert evaluate(_report(nodes, [_pair("10.0.0.1", "10.0.0.2", 11.0)])) == []


@pytest.mark.parametrize(("gbps", "found"), [(2.4, True), (2.6, False), (11.0, False)])
def test_bandwidth_under_a_fifth_of_the_line_rate_is_a_warning(gbps, found):
    # 100 Gb/s = 12.5 GB/s; a fifth is 2.5 GB/s
    nodes = [_node("10.0.0.1", 100_000), _node("10.0.0.2", 100_000)]
    got = evaluate(_report(nodes, [_pair("10.0.0.1", "10.0.0.2", gbps)]))
    assert SLOW_FRACTION == 0.2
    if found:
        assert [(f.severity, f.check) for f in got] == [("warn", "bandwidth")] * 2
        assert got[0].where == "10.0.0.1 -> 10.0.0.2" and got[1].where == "10.0.0.2 -> 10.0.0.1"
        assert got[0].message == (f"{gbps:.2f} GB/s over NET/Socket on eth0, under 20% of its link's 100 Gb/s "
                                  "(12.5 GB/s)")
        assert not has_errors(got)
    else:
        assert got == []


def test_the_slower_end_sets_the_line_rate_and_unknown_speeds_say_nothing():
    nodes = [_node("10.0.0.1", 100_000), _node("10.0.0.2", 10_000)]  # 1.25 GB/s: 1 GB/s is fine there
    assert evaluate(_report(nodes, [_pair("10.0.0.1", "10.0.0.2", 1.0)])) == []
    unknown = [_node("127.0.0.7", None, name="lo"), _node("127.0.0.8", None, name="lo")]
    assert evaluate(_report(unknown, [_pair("127.0.0.7", "127.0.0.8", 0.01, interface="lo")])) == []
    intra = [_node("10.0.0.1", 100_000)]
    assert evaluate(_report(intra, [_pair("10.0.0.1 gpu0", "10.0.0.1 gpu1", 0.01, "P2P/CUMEM", None, "intra")])) == []


def test_an_ib_ports_rate_is_its_line_rate():
    node = _node("10.0.0.1", None, ib=IB_ACTIVE)
    assert link_gbps(node, "mlx5_0:1/IB") == 25.0
    assert link_gbps(node, "mlx5_9:1/IB") is None
    report = _report([node, _node("10.0.0.2", None, ib=IB_ACTIVE)],
                     [_pair("10.0.0.1", "10.0.0.2", 3.0, "NET/IB", "mlx5_0:1/IB")])
    assert [f.check for f in evaluate(report)] == ["bandwidth", "bandwidth"]


def test_infiniband_present_on_both_ends_but_nccl_used_sockets():
    nodes = [_node("10.0.0.1", 100_000, ib=IB_ACTIVE), _node("10.0.0.2", 100_000, ib=IB_ACTIVE)]
    got = evaluate(_report(nodes, [_pair("10.0.0.1", "10.0.0.2", 11.0)]))
    assert [(f.severity, f.check, f.where) for f in got] == [("warn", "infiniband", "10.0.0.1 <-> 10.0.0.2")]
    assert "NCCL used NET/Socket on eth0 though both nodes have active InfiniBand ports (mlx5_0:1; mlx5_0:1)" \
        in got[0].message
    # not when IB carried it, not on one end only, not with a port down, not for gloo
    assert evaluate(_report(nodes, [_pair("10.0.0.1", "10.0.0.2", 22.0, "NET/IB", "mlx5_0:1/IB")])) == []
    one = [_node("10.0.0.1", 100_000, ib=IB_ACTIVE), _node("10.0.0.2", 100_000)]
    assert evaluate(_report(one, [_pair("10.0.0.1", "10.0.0.2", 11.0)])) == []
    down = copy.deepcopy(IB_ACTIVE)
    down[0]["ports"][0]["state"] = "1: DOWN"
    assert evaluate(_report([_node("10.0.0.1", 100_000, ib=down), _node("10.0.0.2", 100_000, ib=IB_ACTIVE)],
                            [_pair("10.0.0.1", "10.0.0.2", 11.0)])) == []
    assert evaluate(_report(nodes, [_pair("10.0.0.1", "10.0.0.2", 11.0, "gloo/TCP")], backend="gloo")) == []


def test_nodes_that_disagree_on_versions():
    newer = {"torch": "2.13.0", "nccl": "2.28.9", "cuda": "13.0", "python": "3.12.3", "ray": "2.61.0"}
    nodes = [_node("10.0.0.1"), _node("10.0.0.2"), _node("10.0.0.3", versions=newer)]
    got = evaluate(_report(nodes, []))
    assert [(f.severity, f.message) for f in got] == [
        ("error", "the nodes disagree: torch 2.11.0 on 10.0.0.1, 10.0.0.2; torch 2.13.0 on 10.0.0.3"),
        ("warn", "the nodes disagree: ray 2.60.0 on 10.0.0.1, 10.0.0.2; ray 2.61.0 on 10.0.0.3")]
    assert has_errors(got)


def test_an_interface_the_inventory_names_missing_or_down():
    nodes = [_node("10.0.0.1", 100_000, env={"NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1"}),
             _node("10.0.0.2", 100_000, state="down", env={"NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "eth0"})]
    inventory = {"10.0.0.1": {"NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1"},
                 "10.0.0.2": {"NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "eth0"}}
    got = [(f.severity, f.where, f.message) for f in evaluate(_report(nodes, []), inventory)]
    assert got == [
        ("error", "10.0.0.1", "NCCL_SOCKET_IFNAME=eth1 (the inventory): no such interface on 10.0.0.1 (has: eth0, lo)"),
        ("error", "10.0.0.1", "GLOO_SOCKET_IFNAME=eth1 (the inventory): no such interface on 10.0.0.1 (has: eth0, lo)"),
        ("error", "10.0.0.2", "NCCL_SOCKET_IFNAME=eth (the inventory): eth0 is down on 10.0.0.2"),
        ("error", "10.0.0.2", "GLOO_SOCKET_IFNAME=eth0 (the inventory): eth0 is down on 10.0.0.2"),
    ]


def test_the_nodes_environment_when_the_inventory_names_nothing_and_a_stale_node():
    nodes = [_node("10.0.0.1", env={"NCCL_SOCKET_IFNAME": "^docker,lo"}),  # an exclusion list names no interface
             _node("10.0.0.2", env={"GLOO_SOCKET_IFNAME": "ens5"}), _node("10.0.0.3", env={})]
    inventory = {"10.0.0.1": {}, "10.0.0.2": {"NCCL_SOCKET_IFNAME": None}, "10.0.0.3": {"GLOO_SOCKET_IFNAME": "eth0"}}
    got = [(f.severity, f.where, f.message) for f in evaluate(_report(nodes, []), inventory)]
    assert got == [
        ("error", "10.0.0.2", "GLOO_SOCKET_IFNAME=ens5 (the node's environment): no such interface on 10.0.0.2 "
                              "(has: eth0, lo)"),
        ("warn", "10.0.0.3", "GLOO_SOCKET_IFNAME=eth0 in the inventory, but the node's Ray runs with "
                             "GLOO_SOCKET_IFNAME unset: re-run site.yml"),
    ]


def test_hangs_errors_skips_and_job_problems():
    line = "10.0.0.2 -> 10.0.0.1: no progress in 30 s (gloo on eth0; GLOO_SOCKET_IFNAME=eth0)"
    report = _report([], [
        _pair("10.0.0.1", "10.0.0.2", None, status="no-progress", line=line),
        _pair("10.0.0.1", "10.0.0.3", None, status="error", line="10.0.0.1 -> 10.0.0.3: connect: refused"),
        _pair("10.0.0.2", "10.0.0.3", None, status="skipped", why="10.0.0.2 gpu0 still hangs in an earlier test"),
    ], backend="gloo", allreduce={"status": "no-progress", "ranks": 3, "line": "all-reduce: no answer"})
    report["problems"] = [{"check": "placement", "message": "cannot place 3 ranks"}]
    got = [(f.severity, f.check, f.where, f.message) for f in evaluate(report)]
    assert got == [
        ("error", "placement", "cluster", "cannot place 3 ranks"),
        ("error", "link", "10.0.0.1 <-> 10.0.0.2", line),
        ("error", "link", "10.0.0.1 <-> 10.0.0.3", "10.0.0.1 -> 10.0.0.3: connect: refused"),
        ("warn", "link", "10.0.0.2 <-> 10.0.0.3", "not tested: 10.0.0.2 gpu0 still hangs in an earlier test"),
        ("error", "link", "all-reduce over 3 ranks", "all-reduce: no answer"),
    ]


# --- the job's plan ----------------------------------------------------------------------------------------
def test_one_rank_per_gpu_pairs_between_nodes_and_within_each():
    nodes = [{"address": "127.0.0.8", "node_id": "b", "gpus": 2}, {"address": "127.0.0.7", "node_id": "a", "gpus": 2}]
    ranks, pairs = job.plan(nodes, "nccl")
    assert [(r["address"], r["local_rank"]) for r in ranks] == [("127.0.0.7", 0), ("127.0.0.7", 1),
                                                                 ("127.0.0.8", 0), ("127.0.0.8", 1)]
    assert pairs == [(0, 2, "inter"), (0, 1, "intra"), (2, 3, "intra")]
    assert job._rounds([(a, b) for a, b, _ in pairs]) == [[(0, 2)], [(0, 1), (2, 3)]]
    assert job._label(ranks[1], ranks, "nccl", "1") == "127.0.0.7 gpu1"
    ranks, pairs = job.plan(nodes, "gloo")
    assert [r["address"] for r in ranks] == ["127.0.0.7", "127.0.0.8"] and pairs == [(0, 1, "inter")]
    assert job._label(ranks[0], ranks, "gloo") == "127.0.0.7"


def test_rounds_never_put_a_rank_in_two_pairs_and_cover_every_pair():
    nodes = [{"address": f"10.0.0.{i}", "node_id": str(i), "gpus": 1} for i in range(1, 7)]
    _, pairs = job.plan(nodes, "gloo")
    assert len(pairs) == 15
    rounds = job._rounds([(a, b) for a, b, _ in pairs])
    for r in rounds:
        ranks = [x for pair in r for x in pair]
        assert len(ranks) == len(set(ranks))
    assert sorted(p for r in rounds for p in r) == sorted((a, b) for a, b, _ in pairs)
    assert len(rounds) <= 7  # 5 would be optimal for 6 nodes; greedy stays close


def test_timed_loops_shrink_on_slow_links_so_they_never_near_the_deadline():
    from rlrun.fabric.rank import TIMED_S, _count

    assert TIMED_S == 2.0
    assert _count(0.001, 10) == 10  # fast: the most asked for
    assert _count(0.5, 10) == 4  # about 2 s in all
    assert _count(9.0, 10) == 1  # slow: one message, never none
    assert _count(0.0, 5) == 5


def test_the_table_shows_pairs_all_reduce_and_findings():
    full = {"cluster": "c", "job_id": "rlrun-probe-fabric-x", "backend": "nccl", "deadline_s": 30.0, "seconds": 12.3,
            "size_bytes": 256 << 20, "ranks": [{}] * 4, "nodes": [{}] * 2, "skipped_nodes": [],
            "pairs": [_pair("127.0.0.7", "127.0.0.8", 3.21, interface="lo", latency_us=41.0),
                      _pair("127.0.0.7 gpu0", "127.0.0.7 gpu1", 140.5, "P2P/CUMEM", None, "intra", latency_us=9.0)],
            "allreduce": {"status": "ok", "ranks": 4, "seconds": 0.0123, "algbw_gbps": 21.8, "busbw_gbps": 32.7,
                          "transports": {"P2P/CUMEM": 8, "NET/Socket": 4}}}
    text = check.render(full, [findings.Finding("warn", "bandwidth", "a -> b", "slow")])
    assert text.splitlines() == [
        "fabric of cluster c: 4 nccl ranks on 2 nodes, 256 MiB messages, deadline 30 s; 12.3 s in the job "
        "(its log: rlrun logs rlrun-probe-fabric-x)",
        "PAIR                               KIND   TRANSPORT   INTERFACE  A->B GB/s  B->A GB/s  LATENCY us  RESULT",
        "127.0.0.7 <-> 127.0.0.8            inter  NET/Socket  lo         3.21       3.21       41          ok",
        "127.0.0.7 gpu0 <-> 127.0.0.7 gpu1  intra  P2P/CUMEM   -          140.50     140.50     9           ok",
        "all-reduce over 4 ranks: 12.3 ms, algbw 21.80 GB/s, busbw 32.70 GB/s (connections: NET/Socket x4, "
        "P2P/CUMEM x8)",
        "SEVERITY  CHECK      WHERE   FINDING",
        "warn      bandwidth  a -> b  slow",
    ]


def test_parse_report_takes_the_last_fabric_line():
    log = "fabric: 2 gloo ranks\n@fabric {\"pairs\": []}\nnoise\n@fabric {\"pairs\": [1]}\n"
    assert check.parse_report(log) == {"pairs": [1]}
    assert check.parse_report("Traceback ...") is None


def test_the_inventorys_interface_names_per_node_address(tmp_path):
    """check.inventory_interfaces: roles/accel_env's variables as Ansible reads the inventory (group_vars,
    host_vars, templates), keyed by each host's cluster__node_address; unset ones are None."""
    from rlrun.inventory import load_cluster
    from tests.conftest import write_inventory

    inv = write_inventory(tmp_path, "ifc", "127.0.0.9", 9300,
                          group_vars={"accel_env__nccl_socket_ifname": "{{ 'en' ~ 'p' }}"},
                          workers={"w1": {"ansible_connection": "local", "cluster__node_address": "127.0.0.10",
                                          "accel_env__gloo_socket_ifname": "eth1"}})
    got = check.inventory_interfaces(load_cluster(inv))
    assert got == {"127.0.0.9": {"NCCL_SOCKET_IFNAME": "enp", "GLOO_SOCKET_IFNAME": "lo"},
                   "127.0.0.10": {"NCCL_SOCKET_IFNAME": "enp", "GLOO_SOCKET_IFNAME": "eth1"}}
    bare = write_inventory(tmp_path / "bare", "ifd", "127.0.0.9", 9300, group_vars={"accel_env__gloo_socket_ifname": None})
    assert check.inventory_interfaces(load_cluster(bare)) == {
        "127.0.0.9": {"NCCL_SOCKET_IFNAME": None, "GLOO_SOCKET_IFNAME": None}}


# --- what the job is shipped with ----------------------------------------------------------------------------
def _imports(path: Path, everywhere: bool) -> set[str]:
    """The rlrun / trainer modules `path` imports: at module level, or `everywhere` (functions included)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree) if everywhere else tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m.split(".")[0] in ("rlrun", "trainer")}


def test_every_project_module_the_job_imports_is_shipped_with_it(tmp_path):
    """The job's own modules and collective_deadline run in full on the cluster: every import counts, in
    functions too. Of trainer/learn/group.py the job calls rendezvous_listener only: its module-level
    imports count (it imports trainer.weights.shared inside a method the job never calls)."""
    shipped = {rel[:-3].replace("/", ".").removesuffix(".__init__") for rel in check.SHIPPED}
    for rel in check.SHIPPED:
        missing = _imports(PROJECT / rel, everywhere=rel != "trainer/learn/group.py") - shipped
        assert not missing, f"{rel} imports {sorted(missing)}, which rlrun/fabric/check.py's SHIPPED leaves out"
    out = check.ship(tmp_path)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.py")) == sorted(check.SHIPPED)
    assert check.JOB_PREFIX.startswith("rlrun-probe-")  # `rlrun list` leaves it out with the other probes


def test_the_gpu_verdict_wants_p2p_within_a_node_and_sockets_between(tmp_path):
    """bench/gpu/fabric_verdict.py on the x4 miniature's shape: PASS only with P2P/CUMEM inside each node and
    NET/Socket between them; a pair on another transport, or a kind of pair missing, fails it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fabric_verdict", PROJECT / "bench" / "gpu" / "fabric_verdict.py")
    verdict = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verdict)
    pairs = [_pair("127.0.0.7 gpu0", "127.0.0.8 gpu2", 3.0, "NET/Socket", "lo", evidence=["... via NET/Socket/0"]),
             _pair("127.0.0.7 gpu0", "127.0.0.7 gpu1", 150.0, "P2P/CUMEM", None, "intra"),
             _pair("127.0.0.8 gpu2", "127.0.0.8 gpu3", 150.0, "P2P/CUMEM", None, "intra")]
    report = {"pairs": pairs, "allreduce": {"status": "ok", "busbw_gbps": 5.0}, "findings": [], "seconds": 20}
    lines, evidence, passed = verdict.verdict("x4", report)
    assert passed and lines[-1] == "PASS" and "# 127.0.0.7 gpu0 <-> 127.0.0.8 gpu2 (inter)" in evidence
    shm = copy.deepcopy(report)
    shm["pairs"][2]["transport"] = "SHM"
    lines, _, passed = verdict.verdict("x4", shm)
    assert not passed and lines[2].startswith("FAIL 127.0.0.8 gpu2 <-> 127.0.0.8 gpu3 (intra): SHM")
    lines, _, passed = verdict.verdict("x4", {**report, "pairs": pairs[:1]})
    assert not passed and "FAIL: no intra pair in the report" in lines
    (tmp_path / "fabric.json").write_text(json.dumps(report))
    assert verdict.main(["fabric_verdict.py", "x4", str(tmp_path)]) == 0
    assert (tmp_path / "verdict.txt").read_text().endswith("PASS\n")
