"""Shared helpers: the project's paths and a throwaway cluster inventory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PROJECT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


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

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
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
                if requests.get(f"{self.url}/health_check", timeout=2).status_code == 200:
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
