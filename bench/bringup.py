"""Bring-up time of a cluster over SSH, for 2, 4 and 8 nodes made of network namespaces.

    sudo .venv/bin/python bench/bringup.py                 # 2, 4, 8 nodes (as memory allows)
    sudo .venv/bin/python bench/bringup.py --nodes 2 --profile

For each size: a lab of N hosts (tests/lab/netns.py, lab 58), an inventory
(head + N-1 workers, the reward service on the head, 1 CPU and 128 MiB of
object store per node), then wall time of `ansible-playbook site.yml` fresh
(the Python stack is already installed: the hosts share this checkout's venv),
again with nothing changed, and of teardown.yml; the lab is removed after each
size. Beside them, in the same run on the same hosts: bare `ray start` (the head
with `--block` in its namespace, the workers once its GCS accepts, until every node
is alive on the dashboard): what the machine takes, at its present load, for what
site.yml wraps. (Its stop is not a figure: bare Ray nodes sent SIGTERM took ~30 s
to end here, against 1-3 s under node_service; not understood yet.) Prints the curve, the targets (2 nodes fresh <= 25 s, no-change
<= 10 s, teardown <= 10 s; 8 nodes fresh <= 60 s), the CPU seconds
ansible-playbook itself used (with its workers: the controller's share, which the
machine's load does not inflate much) and the machine's load average, which the
wall times depend on. --profile adds the slowest tasks of each run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from rlrun.dashboard import wait_nodes_alive  # noqa: E402
from tests.lab.inventory import write_cluster_inventory  # noqa: E402
from tests.lab.netns import Lab, LabError  # noqa: E402

# Resident memory of one idle node of this size (raylet, GCS/dashboard on the
# head, agents, one prestarted worker), measured here: ~0.5 GiB; 0.8 with margin.
NODE_GIB = 0.8
TARGETS = {(2, "fresh"): 25.0, (2, "rerun"): 10.0, (2, "teardown"): 10.0, (8, "fresh"): 60.0}
BASE_PORT = 9100

TASKTIME = '''
import time
from ansible.plugins.callback import CallbackBase
class CallbackModule(CallbackBase):
    CALLBACK_VERSION, CALLBACK_TYPE, CALLBACK_NAME, CALLBACK_NEEDS_ENABLED = 2.0, "aggregate", "tasktime", True
    def __init__(self):
        super().__init__(); self.times, self.task, self.t0 = {}, None, 0.0
    def _close(self):
        if self.task:
            self.times[self.task] = self.times.get(self.task, 0.0) + time.monotonic() - self.t0
    def v2_playbook_on_task_start(self, task, is_conditional):
        self._close(); self.task, self.t0 = task.get_name(), time.monotonic()
    def v2_playbook_on_stats(self, stats):
        self._close()
        for name, secs in sorted(self.times.items(), key=lambda kv: -kv[1])[:8]:
            self._display.display(f"TASKTIME {secs:6.1f} s  {name}")
'''


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def run(inventory: Path, playbook: str, env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds, CPU seconds of ansible-playbook and its workers (the controller's own work), the process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                           str(PROJECT / playbook)], capture_output=True, text=True, env=env, cwd=PROJECT)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def bare_ray(lab: Lab, head: str, workers: list[str]) -> tuple[float, float]:
    """(seconds from the head's `ray start` until every node is alive, seconds to stop them all): plain `ray start
    --block` in each host's namespace on the cluster's ports, no token, no supervisor, no Ansible."""
    ray = str(Path(sys.executable).parent / "ray")
    procs: list[subprocess.Popen] = []

    def start(host: str, *flags: str) -> None:
        home = lab.dir / "bare" / host
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
        argv = ["ip", "netns", "exec", lab.netns(host), ray, "start", "--block", "--disable-usage-stats",
                "--node-ip-address", lab.hosts[host], "--num-cpus", "1", "--num-gpus", "0",
                "--object-store-memory", str(128 * 2**20), "--temp-dir", str(lab.dir / "bare" / f"ray-{host}"),
                *flags]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))

    address = lab.hosts[head]
    hosts = [head, *workers]
    before = {h: set(lab.pids(h)) for h in hosts}

    def left(on: list[str] = hosts) -> list[int]:
        """The processes the bare nodes of hosts `on` started that have not exited (zombies have). The lab's sshd
        sessions are not theirs (one lingers ~30 s after the lab's readiness check)."""
        return [pid for h in on for pid in set(lab.pids(h)) - before[h] if _running(pid) and not _sshd(pid)]

    t0 = time.monotonic()
    try:
        start(head, "--head", "--port", str(BASE_PORT), "--dashboard-host", address,
              "--dashboard-port", str(BASE_PORT + 1))
        while True:  # the workers join the head's GCS: start them once it accepts, as site.yml does
            try:
                socket.create_connection((address, BASE_PORT), timeout=1).close()
                break
            except OSError:
                if time.monotonic() - t0 > 120:
                    raise RuntimeError("bare ray start: the head's GCS did not accept within 120 s") from None
                time.sleep(0.1)
        for w in workers:
            start(w, "--address", f"{address}:{BASE_PORT}")
        nodes = wait_nodes_alive(f"http://{address}:{BASE_PORT + 1}", None, len(hosts), 120, interval=0.1)
        if sum(n.alive for n in nodes) != len(hosts):
            raise RuntimeError(f"bare ray start: {sum(n.alive for n in nodes)} of {len(hosts)} nodes alive")
        up = time.monotonic() - t0
    finally:
        t1 = time.monotonic()
        # The workers, then the head (as teardown.yml: a worker whose GCS is gone first waits out Ray's timeouts);
        # every process of a node at once, as its supervisor's stop does.
        for group in (workers, [head]):
            for pid in left(group):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            while left(group) and time.monotonic() - t1 < 60:
                time.sleep(0.1)
        down = time.monotonic() - t1
        for pid in left():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in procs:
            p.wait()
    return up, down


def _sshd(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sshd")
    except OSError:
        return False


def _running(pid: int) -> bool:
    """Whether process `pid` has not exited (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def changed(output: str) -> int:
    return sum(int(n) for n in re.findall(r"^\S+\s+:\s+ok=\d+\s+changed=(\d+)", output, re.M))


def bench(n: int, index: int, profile: bool, work: Path) -> dict:
    hosts = {f"n{i}": f"10.244.{index}.{10 + i}" for i in range(1, n + 1)}
    lab = Lab(index, hosts, owner=f"bench-{os.getpid()}")
    t0 = time.monotonic()
    lab.create()
    result = {"nodes": n, "lab": time.monotonic() - t0}
    try:
        workers = [h for h in hosts if h != "n1"]
        result["bare_up"], result["bare_down"] = bare_ray(lab, "n1", workers)
        inv = write_cluster_inventory(work / f"n{n}" / "inventory", lab, "bench", BASE_PORT, head="n1",
                                      workers=workers)
        env = {**os.environ, "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg"),
               "ANSIBLE_ROLES_PATH": str(PROJECT / "roles"), "ANSIBLE_NOCOLOR": "1",
               "RAY_USAGE_STATS_ENABLED": "0",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        if profile:
            (work / "cb").mkdir(exist_ok=True)
            (work / "cb" / "tasktime.py").write_text(TASKTIME)
            env.update(ANSIBLE_CALLBACK_PLUGINS=str(work / "cb"), ANSIBLE_CALLBACKS_ENABLED="tasktime")
        for phase, playbook in (("fresh", "site.yml"), ("rerun", "site.yml"), ("teardown", "playbooks/teardown.yml")):
            secs, cpu, proc = run(inv, playbook, env)
            if proc.returncode != 0:
                raise RuntimeError(f"{n} nodes, {phase}: {playbook} failed:\n{proc.stdout[-3000:]}")
            result[phase] = secs
            result[f"{phase}_cpu"] = cpu
            result[f"{phase}_load"] = os.getloadavg()[0]
            result[f"{phase}_changed"] = changed(proc.stdout)
            if profile:
                print(f"  {n} nodes, {phase} ({secs:.1f} s), slowest tasks:")
                for line in re.findall(r"^TASKTIME (.*)$", proc.stdout, re.M):
                    print(f"    {line}")
    finally:
        lab.destroy()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="2,4,8", help="comma-separated cluster sizes (default 2,4,8)")
    parser.add_argument("--index", type=int, default=58, help="lab index: subnet 10.244.INDEX.0/24 (default 58)")
    parser.add_argument("--profile", action="store_true", help="print each run's slowest tasks")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.nodes.split(",")]
    except ValueError:
        parser.error(f"--nodes {args.nodes!r}: expected comma-separated integers, e.g. 2,4,8")
    if any(not 2 <= s <= 200 for s in sizes):
        parser.error(f"--nodes {args.nodes!r}: each size must be between 2 and 200")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlrun-bench-") as tmp:
        for n in sizes:
            need, have = n * NODE_GIB + 1, mem_available_gib()
            if have < need:
                print(f"{n} nodes: skipped, needs ~{need:.1f} GiB, {have:.1f} GiB available")
                continue
            try:
                row = bench(n, args.index, args.profile, Path(tmp))
            except (LabError, RuntimeError) as exc:
                print(f"{n} nodes: failed: {exc}", file=sys.stderr)
                return 1
            rows.append(row)
            print(f"{n} nodes: fresh {row['fresh']:.1f} s, no-change {row['rerun']:.1f} s "
                  f"({row['rerun_changed']} changed), teardown {row['teardown']:.1f} s; bare ray start "
                  f"{row['bare_up']:.1f} s; load average "
                  f"{row['fresh_load']:.1f} / {row['rerun_load']:.1f} / {row['teardown_load']:.1f} after each", flush=True)
    print(f"load average at end:   {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    print("nodes  fresh s  no-change s  changed  teardown s  | bare ray start s  | lab s  "
          "| controller CPU s: fresh  no-change  teardown")
    for r in rows:
        print(f"{r['nodes']:>5}  {r['fresh']:>7.1f}  {r['rerun']:>11.1f}  {r['rerun_changed']:>7}  "
              f"{r['teardown']:>10.1f}  | {r['bare_up']:>16.1f}  | {r['lab']:>5.1f}  "
              f"| {r['fresh_cpu']:>22.1f}  {r['rerun_cpu']:>9.1f}  {r['teardown_cpu']:>8.1f}")
    for (n, phase), target in TARGETS.items():
        row = next((r for r in rows if r["nodes"] == n), None)
        if row:
            verdict = "met" if row[phase] <= target else "MISSED"
            print(f"target {n} nodes {phase}: <= {target:.0f} s, measured {row[phase]:.1f} s: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
