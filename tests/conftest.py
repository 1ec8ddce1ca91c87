"""Shared helpers: the project's paths, a throwaway cluster inventory, and the session's shared
clusters (a private Ray for trainer runs)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

PROJECT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    """SIGTERM ends the run as Ctrl-C does: pytest then tears the session's fixtures down (the shared clusters,
    the network-namespace and Slurm labs). Its default would end the process at once and leave them running
    (what a CI runner's cancel, or scripts/lanes.sh passing TERM on, sends)."""
    signal.signal(signal.SIGTERM, _terminate)


def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(PROJECT / "ansible.cfg")
    env["ANSIBLE_ROLES_PATH"] = str(PROJECT / "roles")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def playbook(inventory: Path, path: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run one of the project's playbooks against `inventory`; output captured as text."""
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(PROJECT / path), *args],
                          capture_output=True, text=True, env=ansible_env(), timeout=timeout, cwd=PROJECT)


def rlrun(inventory: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "rlrun"), "-i", str(inventory), *args], capture_output=True, text=True,
                          env=ansible_env(), timeout=timeout, cwd=PROJECT)


def write_inventory(root: Path, name: str, address: str, base_port: int, hosts_extra: dict | None = None,
                    group_vars: dict | None = None, heads: list[str] | None = None,
                    workers: dict | None = None) -> Path:
    """A one-node (by default) local inventory for cluster `name` on ports base_port.. ."""
    heads = heads or ["localhost"]
    head_hosts = {h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                      "cluster__node_address": address, **(hosts_extra or {})} for h in heads}
    inv = {"all": {"children": {"ray_cluster": {"children": {
        "ray_head": {"hosts": head_hosts},
        "ray_workers": {"hosts": workers or {}}}},
        # The reward service beside the head, on base_port + 50.
        "reward_servers": {"hosts": {heads[0]: None}}}}}
    p = base_port
    gv = {
        "cluster__name": name,
        "cluster__venv": sys.prefix,
        "cluster__state_dir": f"{root}/state/{{{{ inventory_hostname }}}}",
        "python_stack__project_install": "editable",
        "python_stack__project_src": str(PROJECT),
        "ray_node__num_cpus": 1, "ray_node__num_gpus": 0, "ray_node__object_store_memory": 300_000_000,
        "cluster__ray_gcs_port": p, "cluster__ray_dashboard_port": p + 1, "cluster__ray_client_server_port": p + 2,
        "cluster__ray_node_manager_port": p + 10, "cluster__ray_object_manager_port": p + 11,
        "cluster__ray_dashboard_agent_listen_port": p + 12, "cluster__ray_dashboard_agent_grpc_port": p + 13,
        "cluster__ray_runtime_env_agent_port": p + 14, "cluster__ray_metrics_export_port": p + 15,
        "cluster__ray_dashboard_metrics_port": p + 16, "cluster__ray_autoscaler_metrics_port": p + 17,
        "cluster__rendezvous_min_port": p + 20, "cluster__rendezvous_max_port": p + 49,
        "cluster__ray_min_worker_port": p + 100, "cluster__ray_max_worker_port": p + 399,
        "cluster__ray_temp_dir": f"/tmp/rlrun-{os.getuid()}/{name}-{{{{ inventory_hostname }}}}",
        "cluster__accelerator": "cpu", "accel_env__gloo_socket_ifname": "lo",
        "cluster__expected_nodes": None, "cluster__expected_gpus": None,
        "cluster__reward_port": p + 50, "reward_server__verify_processes": 1,
        **(group_vars or {}),
    }
    inv_dir = root / "inventory"
    (inv_dir / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    (inv_dir / "hosts.yml").write_text(yaml.safe_dump(inv, sort_keys=False))
    (inv_dir / "group_vars" / "all" / "main.yml").write_text(yaml.safe_dump(gv, sort_keys=False))
    return inv_dir


# The session's one-node cluster (site.yml on this machine, beside any other cluster).
LOCAL_NAME, LOCAL_ADDRESS, LOCAL_PORT = "pytest", "127.0.0.4", 8600


class Shared:
    """A costly resource that tests of several files share (a fixture of the same name hands it out):
    started by the first test that asks for it, stopped right after the last one (pytest_runtest_teardown)
    or at the end of the session. pytest_collection_modifyitems runs the tests that use it one after the
    other, so it is started once and lives only while they run."""

    def __init__(self, start):
        self._start = start  # a generator function: yields the resource, then stops it
        self._gen = None
        self.value = None

    def get(self, tmp_path_factory):
        if self._gen is None:
            gen = self._start(tmp_path_factory)
            self.value = next(gen)
            self._gen = gen
        return self.value

    def stop(self):
        if self._gen is not None:
            gen, self._gen, self.value = self._gen, None, None
            next(gen, None)


def _local_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    inv = write_inventory(root, LOCAL_NAME, LOCAL_ADDRESS, LOCAL_PORT, group_vars={"ray_node__num_cpus": 2})
    up = playbook(inv, "site.yml")
    state = root / "state" / "localhost"
    yield {"inv": inv, "root": root, "state": state, "up": up,
           "pidfile": state / "service" / f"rlrun-{LOCAL_NAME}-ray-head.pid",
           "url": f"http://{LOCAL_ADDRESS}:{LOCAL_PORT + 1}"}
    playbook(inv, "playbooks/teardown.yml")


def _private_ray(tmp_path_factory):
    root = tempfile.mkdtemp(prefix="rle", dir="/tmp")  # Ray's socket paths must stay short
    gcs, client, nm, om, agent, agent_grpc, renv, metrics = _free_ports(8)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "HOME": root}
    env.pop("RAY_ADDRESS", None)
    log = open(os.path.join(root, "head.log"), "w")  # noqa: SIM115 (closed at teardown)
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--block", "--head", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
         "--include-dashboard", "false", "--ray-client-server-port", str(client), "--node-manager-port", str(nm),
         "--object-manager-port", str(om), "--dashboard-agent-listen-port", str(agent),
         "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(renv),
         "--metrics-export-port", str(metrics), "--temp-dir", os.path.join(root, "ray"), "--num-cpus", "8",
         "--num-gpus", "0", "--object-store-memory", "300000000", "--disable-usage-stats"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    address = f"127.0.0.1:{gcs}"
    try:
        deadline = time.monotonic() + 90
        while True:
            status = subprocess.run([str(BIN / "ray"), "status", "--address", address], env=env,
                                    capture_output=True, text=True)  # fmt: skip
            if status.returncode == 0:
                break
            assert head.poll() is None and time.monotonic() < deadline, Path(log.name).read_text()[-3000:]
            time.sleep(2)
        yield {"address": address, "env": env, "root": root}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(head.pid, signal.SIGTERM)  # `ray start --block` stops the node's processes itself
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # anything of its session still there
        head.wait(timeout=30)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


SHARED = {"local_cluster": Shared(_local_cluster), "private_ray": Shared(_private_ray)}


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory):
    """The one-node cluster the tests share: `site.yml` on this machine (cluster "pytest" on 127.0.0.4,
    ports 8600-8999, 2 CPUs, the reward service on 8650), brought up once for test_cluster_lifecycle and
    test_presets_cluster; its tests that restart, reconfigure or tear it down (mark `changes_cluster`)
    run after the others, which find it as site.yml left it."""
    return SHARED["local_cluster"].get(tmp_path_factory)


@pytest.fixture(scope="session")
def private_ray(tmp_path_factory):
    """A private one-node Ray (no token, no dashboard) for the trainer runs of test_train_loop and
    test_estimators_loop, which join it with RAY_ADDRESS instead of each starting a Ray of its own.
    8 logical CPUs: without GPUs each actor asks for 0.25, and runs go three at a time."""
    return SHARED["private_ray"].get(tmp_path_factory)


def pytest_collection_modifyitems(items):
    """The tests that use a shared resource run one after the other, where the first of them was;
    among the local cluster's, those marked `changes_cluster` run last, in their own order."""
    for name in SHARED:
        users = [item for item in items if name in item.fixturenames]
        if not users:
            continue
        first = items.index(users[0])
        others = [item for item in items if name not in item.fixturenames]
        users.sort(key=lambda item: item.get_closest_marker("changes_cluster") is not None)
        items[:] = others[:first] + users + others[first:]


def pytest_runtest_teardown(item, nextitem):
    """Stop a shared resource as soon as the next test does not use it."""
    for name, shared in SHARED.items():
        if name in item.fixturenames and (nextitem is None or name not in nextitem.fixturenames):
            shared.stop()


def pytest_sessionfinish(session):
    for shared in SHARED.values():
        shared.stop()


@pytest.fixture
def project() -> Path:
    return PROJECT


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RewardProc:
    """A real `python -m trainer.reward.server` on loopback, started by us (ended by PID)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None, scheme: str = "http",
                 ca: str | None = None, port: int | None = None):
        self.port = port or free_port()  # a given port: the same service started again where its clients look
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainer.reward.server", "--host", "127.0.0.1", "--port", str(self.port),
                 *args], cwd=PROJECT, env=env, stdout=out, stderr=out)
        self.returncode: int | None = None
        import time

        import requests

        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"reward server exited with {self.proc.returncode}:\n{log.read_text()}")
            try:
                if requests.get(f"{self.url}/health_check", timeout=2, verify=ca or True).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"reward server did not answer /health_check within 60 s:\n{log.read_text()}")
            time.sleep(0.2)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 30 s; returns the exit code (-9 when it had to be killed)."""
        self.proc.terminate()
        try:
            self.returncode = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.returncode = self.proc.wait()
        return self.returncode


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
