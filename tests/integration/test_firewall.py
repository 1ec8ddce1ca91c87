"""The firewall role for real, with nftables inside network-namespace hosts (lab 53), reached over SSH.

Hosts a (head, reward service) and b (worker) are the members of cluster fwa; host out is in no
group of fwa's inventory. A second cluster fwb on the same hosts (head a, workers b and out, its own
ports) has its own table (its members include fwa's: both tables close the kernel's ephemeral range,
see roles/firewall/README.md); host a also holds a table of "the host's own" (hostfw). Listeners that
the test starts in a's namespace stand for the cluster's sockets (Ray is not needed to show who can
open a connection to them). Checks: members reach every cluster port, the outsider none of fwa's
(the SYN is dropped: the attempt times out) but ssh, a port outside the port map and fwb's ports
(it is fwb's member), the controller only the client ports; a re-run changes nothing; the boot
unit is written only where systemd runs; teardown removes fwa's table and nothing else."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import PROJECT, playbook
from tests.lab.inventory import write_cluster_inventory
from tests.lab.netns import Lab

pytestmark = pytest.mark.integration

HOSTS = {"a": "10.244.53.11", "b": "10.244.53.12", "out": "10.244.53.20"}
A, B = "10.244.53.11", "10.244.53.12"
SCAN = PROJECT / "molecule" / "multinode" / "files" / "port_scan.py"
# fwa: ports 9100.. (tests/lab/inventory.py): GCS 9100, dashboard 9101, rendezvous 9120-9149,
# reward 9150, workers 9200-9399; the kernel's ephemeral range 32768-60999. fwb: 9400.., workers 9500-9599.
FWA_PORTS = {"gcs": 9100, "dashboard": 9101, "rendezvous": 9130, "reward": 9150, "worker": 9250, "ephemeral": 40000}
OTHER = 7000  # in no port map: the firewall must leave it alone
FWB_GCS = 9400

PLAY = [{"name": "The firewall alone (with the cluster role, as in site.yml)", "hosts": "ray_cluster:reward_servers",
         "gather_facts": True, "gather_subset": ["min"],
         "roles": [{"role": "cluster", "vars": {"cluster__node_files": "present"}}, {"role": "firewall"}]}]


def _scan(lab: Lab, source: str | None, targets: list[tuple[str, int]]) -> dict:
    """Connect to every target from `source`'s namespace (None: the controller, this namespace)."""
    argv = [sys.executable, str(SCAN), "--timeout", "1.5", "--targets", ",".join(f"{h}:{p}" for h, p in targets)]
    if source is not None:
        argv = ["ip", "netns", "exec", lab.netns(source), *argv]
    out = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout)["hosts"]
    return {host: {"open": found["open"], "timeout": found["timeout"]} for host, found in out.items()}


def _tables(lab: Lab, host: str) -> list[str]:
    return lab.exec(host, ["nft", "list", "tables"]).stdout.split("\n")[:-1]


def _recap_changes(out: str) -> dict[str, int]:
    return {line.split()[0]: int(line.split("changed=")[1].split()[0]) for line in out.splitlines()
            if "changed=" in line and " : ok=" in line}


@pytest.fixture(scope="module")
def lab():
    check = subprocess.run([str(PROJECT / "scripts" / "system-deps.sh"), "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.fail(f"the namespace lab cannot run here: {check.stderr.strip()}", pytrace=False)
    lab = Lab(53, dict(HOSTS), owner=f"pytest-{os.getpid()}").create()
    listener = None
    try:
        # The host's own table on a: the role must never touch it.
        subprocess.run(["ip", "netns", "exec", lab.netns("a"), "nft", "-f", "/dev/stdin"], check=True, text=True,
                       input="table ip hostfw {\n chain input {\n  type filter hook input priority 10; policy accept;\n"
                             "  tcp dport 9999 counter accept\n }\n}\n")
        ports = [*FWA_PORTS.values(), OTHER, FWB_GCS]
        listener = subprocess.Popen(
            ["ip", "netns", "exec", lab.netns("a"), sys.executable, "-c",
             "import socket, sys, time\nsocks = []\nfor p in sys.argv[1:]:\n"
             "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
             "    s.bind(('0.0.0.0', int(p))); s.listen(64); socks.append(s)\nprint('READY', flush=True)\n"
             "time.sleep(3600)\n", *map(str, ports)], stdout=subprocess.PIPE, text=True)
        assert listener.stdout.readline().strip() == "READY"
        yield lab
    finally:
        if listener is not None:
            listener.kill()
            listener.wait()
        lab.destroy()
        assert lab.leftovers() == []


@pytest.fixture(scope="module")
def inventories(lab, tmp_path_factory):
    root = tmp_path_factory.mktemp("fw")
    fwa = write_cluster_inventory(root / "fwa", lab, "fwa", 9100, head="a", workers=["b"],
                                  group_vars={"firewall__enabled": True})
    fwb = write_cluster_inventory(root / "fwb", lab, "fwb", 9400, head="a", workers=["b", "out"], worker_ports=100,
                                  group_vars={"firewall__enabled": True})
    play = root / "firewall.yml"
    play.write_text(yaml.safe_dump(PLAY, sort_keys=False))
    return fwa, fwb, play


@pytest.fixture(scope="module")
def applied(lab, inventories):
    fwa, fwb, play = inventories
    started = time.monotonic()
    for inv in (fwa, fwb):
        result = playbook(inv, str(play), timeout=300)
        assert result.returncode == 0, result.stdout[-3000:]
    return {"seconds": time.monotonic() - started}


def test_each_cluster_has_its_own_table_beside_the_hosts(lab, applied):
    assert _tables(lab, "a") == ["table ip hostfw", "table inet rlrun_fwa", "table inet rlrun_fwb"]
    assert _tables(lab, "b") == ["table inet rlrun_fwa", "table inet rlrun_fwb"]
    assert _tables(lab, "out") == ["table inet rlrun_fwb"]
    rules = lab.exec("a", ["nft", "list", "table", "inet", "rlrun_fwa"]).stdout
    # The members: fwa's hosts, not out (nft merges neighbouring addresses and ports into ranges).
    for address, member in ((A, True), (B, True), (HOSTS["out"], False)):
        found = lab.exec("a", ["nft", "get", "element", "inet", "rlrun_fwa", "members", f"{{ {address} }}"], check=False)
        assert (found.returncode == 0) is member, (address, found.stdout, found.stderr)
    assert "32768-60999" in rules and "9200-9399" in rules and "9120-9150" in rules, rules


def test_members_reach_every_cluster_port_the_outsider_none(lab, applied):
    targets = [(A, p) for p in FWA_PORTS.values()]
    member = _scan(lab, "b", targets)[A]
    assert member["open"] == sorted(FWA_PORTS.values()), member
    outsider = _scan(lab, "out", [*targets, (A, 22), (A, OTHER), (A, FWB_GCS)])[A]
    # Dropped, not refused: the attempt times out. ssh, a port of no cluster, and fwb's (out is its member) stay open.
    assert outsider["timeout"] == sorted(FWA_PORTS.values()), outsider
    assert outsider["open"] == sorted([22, OTHER, FWB_GCS]), outsider


def test_the_controller_reaches_the_client_ports_only(lab, applied):
    found = _scan(lab, None, [(A, p) for p in FWA_PORTS.values()])[A]
    assert found["open"] == [FWA_PORTS["dashboard"], FWA_PORTS["reward"]], found
    assert found["timeout"] == sorted(set(FWA_PORTS.values()) - {FWA_PORTS["dashboard"], FWA_PORTS["reward"]}), found


def test_a_second_run_changes_nothing(lab, inventories, applied):
    fwa, _, play = inventories
    result = playbook(fwa, str(play), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert set(_recap_changes(result.stdout).values()) == {0}, result.stdout[-3000:]


def test_no_boot_unit_without_systemd(lab, applied):
    # The lab's hosts run no systemd (this machine's PID 1 is not systemd): the table lives until reboot.
    assert not Path("/etc/systemd/system/rlrun-fwa-firewall.service").exists()
    assert not Path("/etc/rlrun/rlrun_fwa.nft").exists()


def test_a_table_changed_by_hand_is_put_back(lab, inventories, applied):
    fwa, _, play = inventories
    lab.exec("b", ["nft", "flush", "chain", "inet", "rlrun_fwa", "input"])
    assert _scan(lab, "out", [(B, 9110)])[B]["timeout"] == [], "flushed chain still drops"
    result = playbook(fwa, str(play), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert _recap_changes(result.stdout)["b"] == 1 and _recap_changes(result.stdout)["a"] == 0, result.stdout[-3000:]
    assert _scan(lab, "out", [(B, 9110)])[B]["timeout"] == [9110]


def test_teardown_removes_this_clusters_table_only(lab, inventories, applied):
    fwa, _, _ = inventories
    result = playbook(fwa, "playbooks/teardown.yml", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert _tables(lab, "a") == ["table ip hostfw", "table inet rlrun_fwb"]
    assert _tables(lab, "b") == ["table inet rlrun_fwb"]
    assert _tables(lab, "out") == ["table inet rlrun_fwb"]
    outsider = _scan(lab, "out", [(A, p) for p in FWA_PORTS.values()])[A]
    assert outsider["open"] == sorted(FWA_PORTS.values()), outsider


def test_the_boot_unit_for_systemd_hosts_is_valid(tmp_path):
    """Where systemd runs, boot.yml installs this unit (this machine runs no systemd: the unit the
    role's template makes is checked with `systemd-analyze verify`, as systemd would load it)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: scripts/system-deps.sh installs it (Debian package systemd)",
                    pytrace=False)
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    units = tmp_path / "units"
    play = tmp_path / "unit.yml"
    play.write_text(yaml.safe_dump([{
        "name": "The firewall's boot unit", "hosts": "localhost", "gather_facts": False,
        "vars": {"cluster__name": "fw-unit"},
        "vars_files": [str(PROJECT / "roles/firewall/defaults/main.yml"), str(PROJECT / "roles/firewall/vars/main.yml")],
        "tasks": [{"name": "Render the unit", "ansible.builtin.template": {
            "src": str(PROJECT / "roles/firewall/templates/etc/systemd/system/firewall.service.j2"),
            "dest": f"{units}/{{{{ firewall__unit }}}}.service", "mode": "0644"}}]}], sort_keys=False))
    units.mkdir()
    result = playbook(inv, str(play), timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    unit = units / "rlrun-fw-unit-firewall.service"
    text = unit.read_text()
    assert "ExecStart=/usr/sbin/nft -f /etc/rlrun/rlrun_fw-unit.nft" in text, text
    assert "ExecStop=-/usr/sbin/nft delete table inet rlrun_fw-unit" in text, text
    env = {**os.environ, "SYSTEMD_LOG_COLOR": "0"}
    check = subprocess.run([analyze, "verify", "--man=no", "--system", str(unit)], capture_output=True, text=True,
                           env=env, timeout=60)
    assert check.returncode == 0 and not check.stderr.strip(), check.stderr
