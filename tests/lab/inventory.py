"""Inventories for clusters on a lab's namespace hosts (tests and bench/bringup.py).

Every host of a lab has its own address and port space, so every node of a
cluster uses the same ports, as on real machines; a second cluster on the same
hosts needs other ports, another name and other directories, exactly as it
would on real machines. Nodes' state and Ray temp dirs live in the lab's
directory, so destroying the lab removes them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tests.lab.netns import Lab

PROJECT = Path(__file__).resolve().parent.parent.parent


def cluster_vars(lab: Lab, name: str, base_port: int, worker_ports: int = 200) -> dict:
    """group_vars/all of cluster `name` on `lab`: ports base_port.. (fixed ports
    base..base+17, rendezvous range base+20..base+49, reward service base+50, worker
    range base+100 .. +worker_ports)."""
    p = base_port
    return {
        "cluster__name": name,
        # The hosts share this machine's filesystem: they reuse the project's venv.
        "cluster__venv": sys.prefix,
        "python_stack__project_install": "editable",
        "python_stack__project_src": str(PROJECT),
        "cluster__state_dir": f"{lab.dir}/state/{name}/{{{{ inventory_hostname }}}}",
        "cluster__ray_temp_dir": f"{lab.dir}/ray/{name}-{{{{ inventory_hostname }}}}",
        "ray_node__num_cpus": 1,
        "ray_node__num_gpus": 0,
        "ray_node__object_store_memory": 128 * 2**20,
        "cluster__ray_gcs_port": p,
        "cluster__ray_dashboard_port": p + 1,
        "cluster__ray_client_server_port": p + 2,
        "cluster__ray_node_manager_port": p + 10,
        "cluster__ray_object_manager_port": p + 11,
        "cluster__ray_dashboard_agent_listen_port": p + 12,
        "cluster__ray_dashboard_agent_grpc_port": p + 13,
        "cluster__ray_runtime_env_agent_port": p + 14,
        "cluster__ray_metrics_export_port": p + 15,
        "cluster__ray_dashboard_metrics_port": p + 16,
        "cluster__ray_autoscaler_metrics_port": p + 17,
        "cluster__rendezvous_min_port": p + 20,
        "cluster__rendezvous_max_port": p + 49,
        "cluster__ray_min_worker_port": p + 100,
        "cluster__ray_max_worker_port": p + 100 + worker_ports - 1,
        "cluster__accelerator": "cpu",
        "accel_env__nccl_socket_ifname": "eth0",
        "accel_env__gloo_socket_ifname": "eth0",
        "cluster__expected_nodes": None,
        "cluster__expected_gpus": None,
        "cluster__reward_port": p + 50,
        "reward_server__verify_processes": 1,
    }


def write_cluster_inventory(root: Path, lab: Lab, name: str, base_port: int, head: str, workers: list[str],
                            reward: list[str] | None = None, worker_ports: int = 200,
                            group_vars: dict | None = None, host_vars: dict[str, dict] | None = None) -> Path:
    """Write an inventory directory `root` for cluster `name` on `lab`'s hosts; returns it.

    `reward` lists the reward service's hosts (default: the head); `host_vars`
    maps host -> extra variables written to host_vars/<host>.yml.
    """
    for host in [head, *workers, *(reward or [])]:
        if host not in lab.hosts:
            raise ValueError(f"host {host!r} is not in lab {lab.index} (hosts: {sorted(lab.hosts)})")

    def entry(host: str) -> dict:
        return {**lab.ansible_vars(host), "ansible_python_interpreter": "/usr/bin/python3",
                "cluster__node_address": lab.hosts[host]}

    reward = reward or [head]
    inv = {"all": {"children": {
        "ray_cluster": {"children": {
            "ray_head": {"hosts": {head: entry(head)}},
            "ray_workers": {"hosts": {w: entry(w) for w in workers}}}},
        "reward_servers": {"hosts": {r: (None if r in [head, *workers] else entry(r)) for r in reward}}}}}
    (root / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    (root / "hosts.yml").write_text(yaml.safe_dump(inv, sort_keys=False))
    gv = {**cluster_vars(lab, name, base_port, worker_ports), **(group_vars or {})}
    (root / "group_vars" / "all" / "main.yml").write_text(yaml.safe_dump(gv, sort_keys=False))
    set_host_vars(root, host_vars or {})
    return root


def set_host_vars(root: Path, host_vars: dict[str, dict]) -> None:
    """Write host_vars/<host>.yml for each host given (replacing what was there)."""
    (root / "host_vars").mkdir(exist_ok=True)
    for host, values in host_vars.items():
        (root / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(values, sort_keys=False))
