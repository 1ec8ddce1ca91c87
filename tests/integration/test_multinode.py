"""Multi-node for real: three hosts made of network namespaces (lab 52), each with
its own address, port space and sshd; the playbooks reach them over SSH and the
Ray nodes talk over TCP. Preflight before and while the cluster runs, `rlrun check --fabric` on the
healthy cluster and with one link blocked by nftables (the trainer's groups name it too), and the
safety behaviours: a re-run under a running job, a change to one worker, a
worker killed by a signal, teardown beside a second cluster on the same hosts."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from rlrun.dashboard import get_json, list_nodes
from tests.conftest import BIN, ansible_env, playbook, rlrun, write_inventory
from tests.lab.inventory import set_host_vars, write_cluster_inventory
from tests.lab.netns import Lab

pytestmark = pytest.mark.integration

LAB = Path(__file__).resolve().parents[1] / "lab" / "netns.py"
HOSTS = {"head": "10.244.52.11", "worker1": "10.244.52.12", "worker2": "10.244.52.13"}
A, A_PORT = "mna", 9100  # the cluster under test: ports 9100-9399, reward service on the head at 9150
B, B_PORT = "mnb", 9400  # a second cluster on the same hosts: ports 9400-9599 (workers 9500-9599)


@pytest.fixture(scope="module")
def lab():
    # Never a silent skip: `make test` installs what the lab needs first (scripts/system-deps.sh).
    check = subprocess.run([str(Path(__file__).resolve().parents[2] / "scripts" / "system-deps.sh"), "--check"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        pytest.fail(f"the namespace lab cannot run here: {check.stderr.strip()}", pytrace=False)
    lab = Lab(52, dict(HOSTS), owner=f"pytest-{os.getpid()}").create()
    try:
        yield lab
    finally:
        lab.destroy()
        assert lab.leftovers() == []


def _only_sshd_left(lab: Lab) -> dict[str, list[str]]:
    """Per host, the processes of its namespace other than sshd (empty lists: nothing left)."""
    out = {}
    for host in lab.hosts:
        pids = [str(p) for p in lab.pids(host)]
        rows = subprocess.run(["ps", "-o", "comm=,args=", "-p", ",".join(pids)], capture_output=True,
                              text=True).stdout.splitlines() if pids else []
        out[host] = [r for r in rows if not r.startswith("sshd")]
    return out


def _inventory(root: Path, lab: Lab, name: str, port: int, **kw) -> Path:
    return write_cluster_inventory(root, lab, name, port, head="head", workers=["worker1", "worker2"],
                                   worker_ports=200 if port == A_PORT else 100, **kw)


@pytest.fixture(scope="module")
def inv_a(lab, tmp_path_factory) -> Path:
    return _inventory(tmp_path_factory.mktemp("mna") / "inventory", lab, A, A_PORT)


@pytest.fixture(scope="module")
def cluster_a(lab, inv_a):
    up = playbook(inv_a, "site.yml")
    assert up.returncode == 0, up.stdout[-5000:]
    yield inv_a
    playbook(inv_a, "playbooks/teardown.yml")


def _token(inv: Path, name: str) -> str:
    return (inv / ".secrets" / f"{name}-ray.token").read_text().strip()


def _dashboard(port: int) -> str:
    return f"http://{HOSTS['head']}:{port + 1}"


def _alive(inv: Path, name: str, port: int) -> dict[str, object] | None:
    """node ip -> Node for the alive nodes of a cluster when there is one per host, else None
    (a node that died stays ALIVE until the GCS's health checks give up on it)."""
    nodes = [n for n in list_nodes(_dashboard(port), _token(inv, name)) if n.alive]
    by_ip = {n.node_ip: n for n in nodes}
    return by_ip if len(by_ip) == len(nodes) == len(HOSTS) and set(by_ip) == set(HOSTS.values()) else None


def _changed(output: str) -> dict[str, int]:
    """changed= per host from a playbook's recap."""
    found = dict(re.findall(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", output, re.M))
    assert found, output[-3000:]
    return {host: int(n) for host, n in found.items()}


def _pids(lab: Lab, name: str) -> dict[str, tuple[int, int]]:
    """host -> (supervisor PID, `ray start` PID) of cluster `name`'s Ray node on each host."""
    out = {}
    for host in lab.hosts:
        role = "head" if host == "head" else "worker"
        pidfile = lab.dir / "state" / name / host / "service" / f"rlrun-{name}-ray-{role}.pid"
        supervisor = int(pidfile.read_text())
        children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(supervisor)], capture_output=True,
                                  text=True).stdout.split()
        out[host] = (supervisor, int(children[0]) if children else -1)
    return out


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(1)


def test_preflight_on_a_local_inventory_finds_a_port_taken_by_a_stranger(tmp_path):
    """The same preflight on a one-node inventory of this machine (ansible_connection: local)."""
    inv = write_inventory(tmp_path, "pflocal", "127.0.0.9", 9100)
    clean = rlrun(inv, "check", timeout=600)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
    assert "no problems on 1 host (localhost)" in clean.stdout
    stranger = subprocess.Popen([sys.executable, "-c", "import socket, time; s = socket.socket(); "
                                 "s.bind(('127.0.0.9', 9110)); s.listen(); time.sleep(600)"])
    try:
        _wait(lambda: f":{9110:04X} ".encode() in Path("/proc/net/tcp").read_bytes(), 30, "the stranger's port")
        taken = rlrun(inv, "check", timeout=600)
    finally:
        stranger.kill()
        stranger.wait()
    out = " ".join((taken.stdout + taken.stderr).split())
    assert taken.returncode == 1, out[-3000:]
    assert re.search(rf"localhost +ports +127\.0\.0\.9:9110 \(cluster__ray_node_manager_port\) is held by "
                     rf"pid {stranger.pid} ", out), out[-3000:]
    assert "1 problem on 1 host" in out


def test_preflight_passes_before_bringup_and_leaves_nothing(lab, inv_a):
    check = rlrun(inv_a, "check", timeout=600)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    found = re.search(r"no problems on 3 hosts \(head, worker1, worker2\); (\d+) probes", check.stdout)
    # Each host reaches the other two hosts' ports: on a worker 10 (its fixed ports and the ends of the worker
    # and rendezvous ranges), on the head 16 (the same, the head's ports and its two metrics ports).
    assert found and int(found.group(1)) == 2 * (16 + 10) + 2 * 10, check.stdout
    # Its temporary listeners are gone again; nothing else of it runs.
    assert _only_sshd_left(lab) == {h: [] for h in lab.hosts}


def test_preflight_passes_on_the_running_cluster(cluster_a):
    check = rlrun(cluster_a, "check", timeout=600)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    assert "no problems on 3 hosts" in check.stdout


# --- rlrun check --fabric (issue 32) and the trainer's collective deadlines --------------------------------
FABRIC_JOB = """
import sys, time, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from trainer.learn.group import DistributedWorker
ray.init()
nodes = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
class Member(DistributedWorker):
    def join_sync(self, addr, port):
        from trainer.weights.broadcast import make_sync_group
        make_sync_group(addr, port, self.rank, 2, "gloo", master_listen_fd=self.take_listen_fd(port))
W = ray.remote(num_cpus=0)(Member)
runs = []
for name, method in (("GROUP", "init_process_group"), ("SYNC", "join_sync")):
    ws = [W.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[ip], soft=False)).remote(r, 2)
          for r, ip in enumerate(sys.argv[1:3])]
    addr, port = ray.get(ws[0].rendezvous_address.remote())
    args = (addr, port, "gloo") if name == "GROUP" else (addr, port)
    runs.append((name, time.monotonic(), [getattr(w, method).remote(*args) for w in ws]))
for name, t0, refs in runs:
    try:
        ray.get(refs)
        print(name, "formed", flush=True)
    except Exception as exc:
        print(name, f"{time.monotonic() - t0:.0f} s:", str(exc).strip().splitlines()[-1], flush=True)
"""


def _fabric_gone(lab: Lab, inv: Path, dirs_before: set[str], timeout: float) -> list[str]:
    """Wait until the fabric check's (and the groups job's) ranks are gone; what is left then."""
    deadline = time.monotonic() + timeout
    while (left := _fabric_left(lab, inv, dirs_before)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


def _fabric_left(lab: Lab, inv: Path, dirs_before: set[str]) -> list[str]:
    """What the fabric checks left: rank processes in the lab, live actors or placement groups of theirs,
    their NCCL log dirs in /tmp (empty: nothing)."""
    left = [f"{host}: {row}" for host, rows in _only_sshd_left(lab).items() for row in rows
            if "ray::Rank" in row or "ray::Member" in row]
    state = f"{_dashboard(A_PORT)}/api/v0"
    actors = get_json(f"{state}/actors?limit=1000", _token(inv, A))["data"]["result"]["result"]
    left += [f"actor {a['class_name']} {a['state']}" for a in actors
             if a["class_name"] in ("Rank", "Member") and a["state"] != "DEAD"]
    groups = get_json(f"{state}/placement_groups?limit=1000", _token(inv, A))["data"]["result"]["result"]
    left += [f"placement group {g['name']} {g['state']}" for g in groups
             if g["name"] == "rlrun-fabric-check" and g["state"] != "REMOVED"]
    left += sorted({str(p) for p in Path("/tmp").glob("rlrun-fabric-*")} - dirs_before)
    return left


def _run_groups(lab: Lab, inv: Path, job: str, a: str, b: str) -> subprocess.CompletedProcess:
    """Run FABRIC_JOB as job `job` (a trainer group and a weight-sync group between nodes a and b, deadline
    10 s) and follow it to its end."""
    workdir = lab.dir / "fabric-job"
    workdir.mkdir(exist_ok=True)
    (workdir / "groups.py").write_text(FABRIC_JOB)
    return rlrun(inv, "submit", "--follow", "--submission-id", job, "--working-dir", str(workdir),
                 "--env", "RLRUN_COLLECTIVE_DEADLINE_S=10", "--env", "RAY_IGNORE_UNHANDLED_ERRORS=1", "--",
                 "python", "groups.py", a, b)


def test_fabric_check_measures_every_pair_of_nodes_and_leaves_nothing(lab, cluster_a):
    dirs = {str(p) for p in Path("/tmp").glob("rlrun-fabric-*")}
    started = time.monotonic()
    check = rlrun(cluster_a, "check", "--fabric", "--json", timeout=300)
    took = time.monotonic() - started
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    report = json.loads(check.stdout)
    assert report["backend"] == "gloo" and report["cluster"] == A
    assert sorted(n["address"] for n in report["nodes"]) == sorted(HOSTS.values())
    ips = sorted(HOSTS.values())
    assert [(p["a"], p["b"]) for p in report["pairs"]] == [(ips[0], ips[1]), (ips[0], ips[2]), (ips[1], ips[2])]
    for pair in report["pairs"]:
        # gloo's own sockets of the pair, seen from both ends: on eth0 (GLOO_SOCKET_IFNAME of the inventory)
        assert (pair["status"], pair["transport"], pair["interface"]) == ("ok", "gloo/TCP", "eth0"), pair
        assert pair["gbps"]["a->b"] > 0 and pair["gbps"]["b->a"] > 0 and pair["latency_us"] > 0, pair
        assert re.fullmatch(rf"{re.escape(pair['a'])}:\d+ \(eth0\) <-> {re.escape(pair['b'])}:\d+ \(eth0\)",
                            pair["evidence"][0]), pair
    assert report["allreduce"]["status"] == "ok" and report["allreduce"]["ranks"] == 3
    assert report["allreduce"]["busbw_gbps"] > 0
    node = next(n for n in report["nodes"] if n["address"] == HOSTS["head"])
    assert node["env"]["GLOO_SOCKET_IFNAME"] == "eth0" and node["interfaces"]["eth0"]["addresses"] == [HOSTS["head"]]
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    assert took < 90, f"rlrun check --fabric took {took:.0f} s on 3 healthy nodes (target: <= 60 s on 2)"
    assert _fabric_gone(lab, cluster_a, dirs, 30) == []


def test_a_blocked_link_is_named_within_the_deadline_by_the_check_and_the_trainers_groups(lab, cluster_a):
    """worker2 drops new TCP connections to and from the head on the kernel's ephemeral ports (where gloo
    listens; Ray's pinned ports and the rendezvous range stay open, so Ray itself carries on): the check
    names that link, both nodes and the interface, within 60 s, and still measures the two healthy pairs; the
    trainer's group formation (trainer/learn/group.py) and the weight-sync group (trainer/weights/broadcast.py) name it
    too, after their deadline. Nothing of either is left running."""
    dirs = {str(p) for p in Path("/tmp").glob("rlrun-fabric-*")}
    low, high = lab.exec("worker2", ["cat", "/proc/sys/net/ipv4/ip_local_port_range"]).stdout.split()
    head = HOSTS["head"]
    rules = (f"table inet fabric_test {{\n chain input {{\n  type filter hook input priority 0; policy accept;\n"
             f"  ip saddr {head} tcp dport {low}-{high} ct state new drop\n }}\n"
             f" chain output {{\n  type filter hook output priority 0; policy accept;\n"
             f"  ip daddr {head} tcp dport {low}-{high} ct state new drop\n }}\n}}\n")
    subprocess.run(["ip", "netns", "exec", lab.netns("worker2"), "nft", "-f", "/dev/stdin"], input=rules, text=True,
                   check=True)
    job, pool, groups = f"fabric-groups-{os.getpid()}-{int(time.time())}", ThreadPoolExecutor(max_workers=1), None
    try:
        started = time.monotonic()
        proc = subprocess.Popen([str(BIN / "rlrun"), "-i", str(cluster_a), "check", "--fabric", "--deadline", "15"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ansible_env(),
                                cwd=Path(__file__).resolve().parents[2])
        named, progress, link = None, [], re.compile(
            rf"({re.escape(head)} -> {re.escape(HOSTS['worker2'])}|{re.escape(HOSTS['worker2'])} -> {re.escape(head)})"
            r": no progress in 15 s \(gloo on eth0; GLOO_SOCKET_IFNAME=eth0\)")
        for line in proc.stderr:  # the progress lines, as they come
            progress.append(f"{time.monotonic() - started:5.1f} s: {line.rstrip()}")
            if named is None and link.search(line):
                named = time.monotonic() - started
            if groups is None and "ranks up:" in line:  # the check's ranks run: the groups' job starts meanwhile
                groups = pool.submit(_run_groups, lab, cluster_a, job, head, HOSTS["worker2"])
        out, _ = proc.communicate(timeout=300)
        # Within the deadline: the pair's line comes at most 15 s (+ the probes) after the test before it ended
        # (rounds run one after the other). Within 60 s of `rlrun check` starting is the target on a quiet
        # machine (docs/fabric.md has the figures); 120 s bounds it here, where other work shares the 2 cores
        # (without deadlines the pair would wait for gloo's 30-minute timeout).
        hang = next((i for i, line in enumerate(progress) if link.search(line)), len(progress))
        job_times = [float(m.group(1)) for line in progress[: hang + 1]
                     if (m := re.search(r"\[ *([\d.]+) s\]", line))]
        assert len(job_times) >= 2 and job_times[-1] - job_times[-2] <= 15 + 3 * 3 + 2, "\n".join(progress)
        assert named is not None and named <= 120, "\n".join(progress)
        assert proc.returncode == 1, out[-3000:]
        table = " ".join(out.split())
        assert re.search(rf"error link {re.escape(head)} <-> {re.escape(HOSTS['worker2'])} " + link.pattern, table), out
        for a, b in (("head", "worker1"), ("worker1", "worker2")):
            assert re.search(rf"{re.escape(HOSTS[a])} <-> {re.escape(HOSTS[b])} inter gloo/TCP eth0 [\d.]+ [\d.]+ "
                             r"\d+ ok", table), out
        assert "all-reduce over 3 ranks: skipped (1 pair test failed" in table, out
        assert groups is not None, "\n".join(progress)
        # The trainer's groups over the same link (their job started once the check's ranks were up).
        followed = groups.result(timeout=300)
        assert followed.returncode == 0 and f"job {job}: SUCCEEDED" in followed.stderr, followed.stderr[-3000:]
        log = rlrun(cluster_a, "logs", job).stdout
        for name in ("GROUP", "SYNC"):  # after actor start-up (and deepspeed's import), far from the 30 min
            found = re.search(rf"^{name} (\d+) s: trainer\.collective_deadline\.NoProgress: " + link.pattern.replace(
                "15 s", "10 s"), log, re.M)
            assert found and int(found.group(1)) < 120, log[-3000:]
    finally:
        lab.exec("worker2", ["nft", "delete", "table", "inet", "fabric_test"], check=False)
        if groups is not None and not groups.done():
            rlrun(cluster_a, "stop", job)
        pool.shutdown(wait=True)
    assert _fabric_gone(lab, cluster_a, dirs, 60) == []


def test_preflight_reports_every_problem_in_one_table(lab, cluster_a, tmp_path):
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    inv = tmp_path / "inventory"
    shutil.copytree(cluster_a, inv)
    set_host_vars(inv, {
        "head": {"preflight__min_shm_bytes": 2**50},
        # (A nofile limit above fs.nr_open and GPUs on a cpu host are refused offline by the validate play
        # before the preflight runs: tests/integration/test_validate_inventory.py.)
        "worker1": {"accel_env__gloo_socket_ifname": "eth9"},
        "worker2": {"cluster__accelerator": "nvidia", "ray_node__num_gpus": 1, "cluster__venv": str(bare)},
    })
    # A stranger listening inside worker1's worker port range, and worker2 cut off from the head.
    stranger = subprocess.Popen(
        ["ip", "netns", "exec", lab.netns("worker1"), sys.executable, "-c",
         "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 9300)); s.listen(); time.sleep(600)"])
    lab.exec("worker2", ["ip", "route", "add", "blackhole", f"{HOSTS['head']}/32"])
    try:
        _wait(lambda: f":{9300:04X} ".encode() in Path(f"/proc/{stranger.pid}/net/tcp").read_bytes(), 30, "the stranger's port")
        check = rlrun(inv, "check", timeout=600)
    finally:
        lab.exec("worker2", ["ip", "route", "del", "blackhole", f"{HOSTS['head']}/32"], check=False)
        stranger.kill()
        stranger.wait()
    out = " ".join((check.stdout + check.stderr).split())  # rich wraps long lines
    assert check.returncode == 1, out[-3000:]
    for host, what in [
        ("head", r"/dev/shm /dev/shm is [\d.]+ GiB, at least 1048576\.00 GiB needed \(preflight__min_shm_bytes\)"),
        ("worker1", r"interface GLOO_SOCKET_IFNAME=eth9: no such interface here \(have: eth0, lo\)"),
        ("worker1", rf"ports 1 ports of the worker range 9200-9399 are taken: 9300 held by pid {stranger.pid} "),
        ("worker2", r"gpus the inventory gives this node 1 GPUs \(ray_node__num_gpus\), 0 nvidia GPUs are usable"),
        ("worker2", r"versions ray missing here, 2\.60\.0 on head"),
        ("worker2", r"reachable cannot reach head 10\.244\.52\.11:9100 \(cluster__ray_gcs_port\)"),
        ("worker2", r"reward reward service of head \(http://10\.244\.52\.11:9150/health_check\) does not answer"),
        ("head", r"reachable cannot reach worker2 10\.244\.52\.13:9110 \(cluster__ray_node_manager_port\)"),
    ]:
        assert re.search(rf"{host} +{what}", out), f"{host}: {what} not in:\n{out[-4000:]}"


def test_preflight_of_the_seed_inventory_on_two_lab_hosts(lab, tmp_path):
    """examples/inventories/seed-2node as shipped, with only its placeholders (addresses,
    SSH user) pointed at two lab hosts: the preflight finds what differs from the seed's
    machines (no GPUs here) and nothing else: ports 8100-8115 and the worker range free
    and reachable both ways, eth0 present, and no venv yet on either host (a fresh cluster)."""
    seed = Path(__file__).resolve().parents[2] / "examples" / "inventories" / "seed-2node"
    override = tmp_path / "placeholders.yml"
    override.write_text(yaml.safe_dump({"all": {"hosts": {
        name: {**lab.ansible_vars(host), "ansible_python_interpreter": "/usr/bin/python3",
               "cluster__node_address": HOSTS[host]}
        for name, host in (("gpu005", "head"), ("gpu004", "worker1"))}}}))
    check = playbook(seed, "playbooks/preflight.yml", "-i", str(override))
    out = " ".join(check.stdout.split())
    assert check.returncode == 2, out[-3000:]
    assert "preflight: 2 problems on 2 hosts" in out, out[-3000:]
    for host in ("gpu004", "gpu005"):
        assert re.search(rf"{host} +gpus +the inventory gives this node 8 GPUs \(ray_node__num_gpus\), "
                         r"0 nvidia GPUs are usable", out), out[-3000:]


JOB = """
import time, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init()
@ray.remote(num_cpus=0.1)
class Beat:
    def where(self):
        return ray.util.get_node_ip_address()
nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
beats = [Beat.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes]
for i in range(900):
    print("beat", i, " ".join(sorted(ray.get([b.where.remote() for b in beats]))), flush=True)
    time.sleep(1)
"""


def _beats(inv: Path, job: str) -> list[int]:
    """The beat numbers a job printed in which all three nodes answered."""
    logs = rlrun(inv, "logs", job).stdout
    both = " ".join(sorted(HOSTS.values()))
    return [int(m.group(1)) for m in re.finditer(r"^beat (\d+) (.*)$", logs, re.M) if m.group(2) == both]


def test_rerun_while_a_job_runs_keeps_the_job_running_and_every_pid(lab, cluster_a):
    sub = rlrun(cluster_a, "submit", "--no-working-dir", "--", "python", "-c", JOB)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    try:
        _wait(lambda: _beats(cluster_a, job), 180, "the job's actors on all three nodes")
        pids = _pids(lab, A)
        again = playbook(cluster_a, "site.yml")
        assert again.returncode == 0, again.stdout[-4000:]
        assert _changed(again.stdout) == {"head": 0, "worker1": 0, "worker2": 0, "localhost": 0}
        assert _pids(lab, A) == pids
        assert rlrun(cluster_a, "status", job).stdout.startswith(f"{job}: RUNNING"), job
        last = max(_beats(cluster_a, job))
        _wait(lambda: max(_beats(cluster_a, job)) >= last + 3, 60, "more beats from all three nodes")
    finally:
        rlrun(cluster_a, "stop", job)


def test_changing_one_workers_variables_restarts_that_worker_only(lab, cluster_a):
    before = _pids(lab, A)
    set_host_vars(cluster_a, {"worker2": {"ray_node__num_cpus": 2}})
    again = playbook(cluster_a, "site.yml")
    assert again.returncode == 0, again.stdout[-4000:]
    changed = _changed(again.stdout)
    assert changed["head"] == 0 and changed["worker1"] == 0 and changed["worker2"] > 0, changed
    after = _pids(lab, A)
    assert after["head"] == before["head"] and after["worker1"] == before["worker1"]
    assert after["worker2"][0] != before["worker2"][0] and after["worker2"][1] != before["worker2"][1]
    nodes = _wait(lambda: _alive(cluster_a, A, A_PORT), 120, "one alive node per host")
    assert nodes[HOSTS["worker2"]].cpus == 2 and nodes[HOSTS["worker1"]].cpus == 1


def test_a_worker_killed_by_a_signal_is_restarted_and_rejoins(lab, cluster_a):
    supervisor, ray_start = _pids(lab, A)["worker1"]
    old = _wait(lambda: _alive(cluster_a, A, A_PORT), 120, "one alive node per host")[HOSTS["worker1"]].node_id
    os.kill(ray_start, signal.SIGKILL)

    def rejoined():
        node = (_alive(cluster_a, A, A_PORT) or {}).get(HOSTS["worker1"])
        return node if node and node.node_id != old else None

    # A new node from worker1, and the killed one no longer alive: one node per host.
    node = _wait(rejoined, 180, "worker1 to rejoin as a new node, the old one dead")
    assert node.cpus == 1
    after = _pids(lab, A)["worker1"]
    assert after[0] == supervisor and after[1] not in (ray_start, -1)


def test_handover_as_inventory_and_vaulted_token_runs_the_cluster_unchanged(lab, cluster_a, tmp_path):
    """Ops hand a cluster over as its inventory plus a vault holding the tokens (no .secrets/):
    with the vault password the recipient sees the cluster and re-runs site.yml without a change."""
    inv = tmp_path / "handed-over"
    shutil.copytree(cluster_a, inv, ignore=shutil.ignore_patterns(".secrets"))
    password = tmp_path / "vault-password"
    password.write_text("correct horse battery staple\n")
    password.chmod(0o600)
    token = _token(cluster_a, A)
    reward_token = (cluster_a / ".secrets" / f"{A}-reward.token").read_text().strip()
    vault = "---\n"
    for name, value in (("cluster__token", token), ("cluster__reward_token", reward_token)):
        vault += subprocess.run([str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file", str(password),
                                 "--name", name, value], capture_output=True, text=True, check=True,
                                env=ansible_env()).stdout
    (inv / "group_vars" / "all" / "vault.yml").write_text(vault)
    assert token not in vault and reward_token not in vault
    pids = _pids(lab, A)

    status = rlrun(inv, "--vault-password-file", str(password), "status")
    assert status.returncode == 0, status.stderr[-2000:]
    assert "3 alive of 3 in the inventory" in status.stdout
    up = rlrun(inv, "--vault-password-file", str(password), "up", timeout=900)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    rows = dict(re.findall(r"^│ (\S+)\s+│ \d+\s+│ (\d+)\s+│ 0\s+│ 0\s+│$", up.stdout, re.M))
    assert rows == {"head": "0", "worker1": "0", "worker2": "0", "localhost": "0"}, up.stdout
    assert _pids(lab, A) == pids
    assert not (inv / ".secrets").exists()

    without = rlrun(inv, "status")
    assert without.returncode == 1 and "Traceback" not in without.stderr
    assert "vault" in without.stderr.lower(), without.stderr


def test_teardown_leaves_a_second_cluster_on_the_same_hosts_running(lab, cluster_a, tmp_path_factory):
    inv_b = _inventory(tmp_path_factory.mktemp("mnb") / "inventory", lab, B, B_PORT)
    up = playbook(inv_b, "site.yml")
    assert up.returncode == 0, up.stdout[-4000:]
    try:
        assert _alive(inv_b, B, B_PORT)
        pids_b = _pids(lab, B)
        down = playbook(cluster_a, "playbooks/teardown.yml")
        assert down.returncode == 0, down.stdout[-4000:]
        # Nothing of cluster A is left on any host...
        for host, rows in _only_sshd_left(lab).items():
            assert not [r for r in rows if f"/{A}-{host}" in r or f"/state/{A}/" in r], (host, rows)
        assert not list((lab.dir / "state" / A).glob("*/service/*.pid"))
        # ...and cluster B runs on, with the same processes.
        assert _alive(inv_b, B, B_PORT)
        assert _pids(lab, B) == pids_b
    finally:
        down_b = playbook(inv_b, "playbooks/teardown.yml")
    assert down_b.returncode == 0, down_b.stdout[-4000:]
    assert _only_sshd_left(lab) == {h: [] for h in lab.hosts}


def test_the_lab_refuses_to_be_created_twice(lab):
    again = subprocess.run([sys.executable, str(LAB), "create", "--index", "52",
                            "--host", "x=10.244.52.20"], capture_output=True, text=True)
    assert again.returncode == 1
    assert "lab 52 (10.244.52.0/24) cannot be created, these exist already: namespace rlrun52-" in again.stderr
    other = subprocess.run([sys.executable, str(LAB), "destroy", "--index", "52",
                            "--owner", "someone-else"], capture_output=True, text=True)
    assert other.returncode == 1 and f"belongs to 'pytest-{os.getpid()}'" in other.stderr
    assert json.loads((lab.dir / "lab.json").read_text())["hosts"].keys() == HOSTS.keys()
