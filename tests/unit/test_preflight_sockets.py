"""The preflight's port-map check (roles/preflight/library/preflight_node.py): every socket the
cluster's processes listen on lies in the host's port map; the ranges are for jobs' processes only."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from unittest import mock

import pytest

MODULE = Path(__file__).resolve().parents[2] / "roles" / "preflight" / "library" / "preflight_node.py"
spec = importlib.util.spec_from_file_location("preflight_node", MODULE)
node = importlib.util.module_from_spec(spec)
# The module imports AnsibleModule, and importing ansible.module_utils.basic patches sys.intern for the whole
# process (which breaks torch._dynamo's import in later tests): the pure functions tested here need a stand-in only.
_stub = types.ModuleType("ansible.module_utils.basic")
_stub.AnsibleModule = object
with mock.patch.dict(sys.modules, {"ansible.module_utils.basic": _stub}):
    spec.loader.exec_module(node)

CFG = {
    "fixed_ports": {"cluster__ray_gcs_port": 9100, "cluster__ray_dashboard_port": "9101",
                    "cluster__ray_metrics_export_port": 9115},
    "port_ranges": {
        "worker": {"vars": ["cluster__ray_min_worker_port", "cluster__ray_max_worker_port"], "bounds": [9200, 9399]},
        "rendezvous": {"vars": ["cluster__rendezvous_min_port", "cluster__rendezvous_max_port"], "bounds": [9120, 9149]},
        "ephemeral": {"vars": ["cluster__ephemeral_min_port", "cluster__ephemeral_max_port"], "bounds": [32768, 60999]},
    },
}
COMMANDS = {
    10: "/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/x",
    11: "/venv/bin/python -u /venv/lib/python3.11/site-packages/ray/autoscaler/_private/monitor.py --logs-dir=/x",
    12: "ray::Rank.all_reduce",
    13: "/venv/bin/python -c import socket",  # a job's driver
    14: "ray::DashboardAgent",
    99: "python stranger.py",
}


@pytest.fixture(autouse=True)
def commands(monkeypatch):
    monkeypatch.setattr(node, "cmdline", lambda pid: COMMANDS.get(pid, ""))


def test_the_port_map_holds_daemons_on_fixed_ports_and_jobs_in_the_ranges():
    listeners = {9100: [("::", "a")], 9101: [("10.0.0.5", "b")], 9210: [("::", "c")], 9149: [("10.0.0.5", "d")],
                 41000: [("10.0.0.5", "e")], 9115: [("10.0.0.5", "f")]}
    owners = {"a": 10, "b": 11, "c": 12, "d": 12, "e": 12, "f": 14}
    assert node.unmapped_sockets(CFG, listeners, owners, own={10, 11, 12, 14}) == []


def test_unpinned_ports_and_daemons_in_the_ranges_are_reported_by_process():
    listeners = {44217: [("0.0.0.0", "a")], 44227: [("0.0.0.0", "b")], 9500: [("::", "c")], 9600: [("0.0.0.0", "d")],
                 33000: [("127.0.0.1", "e")]}
    owners = {"a": 11, "b": 11, "c": 12, "d": 99, "e": 14}
    found = node.unmapped_sockets(CFG, listeners, owners, own={11, 12, 14})
    assert len(found) == 3, found
    # Ray's unpinned metrics ports (44217, 44227) lie in the kernel's ephemeral range, where only jobs may listen.
    assert found[0].startswith("pid 11 (/venv/bin/python -u /venv/lib/python3.11/site-packages/ray/autoscaler/_private/"
                               "monitor.py --logs-dir) listens on 0.0.0.0:44217, 0.0.0.0:44227: inside the ephemeral "
                               "range, which is for jobs' processes, not the node's daemons"), found[0]
    assert "(fixed ports 9100, 9101, 9115; worker 9200-9399, rendezvous 9120-9149, ephemeral 32768-60999)" in found[0]
    assert found[1].startswith("pid 12 (ray::Rank.all_reduce) listens on :::9500: not in the inventory's port map")
    # A daemon in the ephemeral range: only jobs' processes may listen there.
    assert found[2].startswith("pid 14 (ray::DashboardAgent) listens on 127.0.0.1:33000: inside the ephemeral range, "
                               "which is for jobs' processes, not the node's daemons")
    # Port 9600 belongs to a process that is not the cluster's: preflight's other check ("ports") is about those.


@pytest.mark.parametrize("command,daemon", [
    ("/x/ray/core/src/ray/raylet/raylet --raylet_socket_name=/t", True),
    ("/x/bin/python /x/ray/dashboard/dashboard.py --host=10.0.0.5", True),
    ("/x/bin/python -m ray.util.client.server --address=10.0.0.5:9100", True),
    ("ray::RuntimeEnvAgent", True),
    ("/x/bin/python -m trainer.reward.server --port 5001", True),
    ("ray::IDLE", False),
    ("ray::VllmEngine.generate", False),
    ("/x/bin/python -m trainer.train_ppo_ray --pretrain m", False),
    ("python my_monitor.py", False),
])
def test_daemons_are_told_from_jobs_by_their_command_line(command, daemon):
    assert node.is_daemon(command) is daemon


def test_an_agent_in_the_worker_range_is_a_ray_worker_not_a_problem():
    # Seen in the multinode scenario: ray::DashboardAgent's core-worker port comes from the worker range, on ::.
    listeners = {9314: [("::", "a")], 9130: [("::", "b")]}
    owners = {"a": 14, "b": 14}
    found = node.unmapped_sockets(CFG, listeners, owners, own={14})
    assert len(found) == 1 and "listens on :::9130: inside the rendezvous range" in found[0], found


def test_a_job_driver_in_a_session_of_its_own_is_the_clusters(monkeypatch):
    # Ray's job supervisor starts the driver in a new session: it is the cluster's through its parent.
    sessions = {100: 100, 101: 100, 102: 102, 103: 102, 200: 200}
    parents = {100: 1, 101: 100, 102: 101, 103: 102, 200: 1}
    monkeypatch.setattr(node, "all_pids", lambda: list(sessions))
    monkeypatch.setattr(node, "session_of", lambda pid: sessions.get(pid))
    monkeypatch.setattr(node, "cgroup_of", lambda pid: "")
    monkeypatch.setattr(node, "parent_of", lambda pid: parents.get(pid))
    monkeypatch.setattr(node, "service_state", lambda svc: (True, 100, 100))
    assert node.own_pids([{"name": "rlrun-x-ray-head"}]) == {100, 101, 102, 103}
