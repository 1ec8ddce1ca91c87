"""playbooks/validate.yml refuses bad inventories before touching a host, naming variable and value: its first
play (rlrun.validate, the same check as `rlrun validate`) catches the inventory's problems with file and line
(the cluster role's assert in its second play runs the same rules, rlrun/checks/, per host); the services'
own asserts in the second play catch the rest (firewall lists)."""

import pytest

from tests.conftest import playbook, write_inventory

pytestmark = pytest.mark.integration

CASES = [
    ("two heads", dict(heads=["a", "b"]),
     r"group ray_head = \['a', 'b'\]: must hold exactly one host, the Ray head \(2 found\)"),
    ("head is also worker", dict(workers={"localhost": {}}),
     r"groups ray_head and ray_workers = \['localhost'\]: share hosts"),
    ("duplicate address", dict(workers={"w1": {"cluster__node_address": "127.0.0.9"}}),
     r"cluster__node_address = '127.0.0.9' \(host w1\): is also the address of localhost"),
    ("boolean as string", dict(group_vars={"cluster__auth_enabled": "false"}),
     r"cluster__auth_enabled = 'false' \(host localhost\): is a string: write the boolean false without quotes"),
    ("port collision", dict(group_vars={"cluster__ray_dashboard_port": 9310}),
     r"cluster__ray_node_manager_port = 9310 \(host localhost\): is also cluster__ray_dashboard_port on this host"),
    ("port in worker range", dict(group_vars={"cluster__ray_metrics_export_port": 9450}),
     r"cluster__ray_metrics_export_port = 9450 \(host localhost\): lies inside the worker port range 9400-9699"),
    ("port not a number", dict(group_vars={"cluster__ray_gcs_port": "eighty"}),
     r"cluster__ray_gcs_port = 'eighty' \(host localhost\): must be a port number"),
    ("port out of range", dict(group_vars={"cluster__ray_client_server_port": 70000}),
     r"cluster__ray_client_server_port = 70000 \(host localhost\): must be a port number: a whole number from 1024 to 65535"),
    ("tiny worker range", dict(group_vars={"cluster__ray_max_worker_port": 9420}),
     r"cluster__ray_max_worker_port = 9420 \(host localhost\): must be at least cluster__ray_min_worker_port \+ 99 = 9499"),
    ("reward port on a Ray port", dict(group_vars={"cluster__reward_port": 9301}),
     r"cluster__reward_port = 9301 \(host localhost\): is also cluster__ray_dashboard_port on this host"),
    ("reward port in the worker range", dict(group_vars={"cluster__reward_port": 9500}),
     r"cluster__reward_port = 9500 \(host localhost\): lies inside the worker port range 9400-9699"),
    ("reward TLS as string", dict(group_vars={"cluster__reward_tls": "yes"}),
     r"cluster__reward_tls = 'yes' \(host localhost\): is a string: write the boolean true without quotes"),
    ("old reward token name", dict(group_vars={"reward_server__auth_token": "ab" * 32}),
     r"reward_server__auth_token = '[a-z]+' \(host localhost\): was renamed: write cluster__reward_token"),
    ("unknown extraction strategy", dict(group_vars={"reward_server__extract": ["boxed", "magic"]}),
     r"reward_server__extract = \['boxed', 'magic'\] \(host localhost\): must be null \(the service's "
     r"default order\) or a non-empty list of boxed, answer_tag"),
    ("reward auth as string", dict(group_vars={"reward_server__auth_enabled": "yes"}),
     r"reward_server__auth_enabled = 'yes' \(host localhost\): is a string: write the boolean true without quotes"),
    ("address not an IP", dict(hosts_extra={"cluster__node_address": "head.example"}),
     r"cluster__node_address = 'head.example' \(host localhost\): must be an IPv4 address"),
    ("address out of range", dict(hosts_extra={"cluster__node_address": "127.0.0.256"}),
     r"cluster__node_address = '127.0.0.256' \(host localhost\): must be an IPv4 address: each of the four numbers is 0-255"),
    ("old variable name", dict(group_vars={"ray_node__gcs_port": 9300}),
     r"ray_node__gcs_port = 9300 \(host localhost\): was renamed: write cluster__ray_gcs_port"),
    ("accelerator typo", dict(group_vars={"cluster__accelerator": "nvdia"}),
     r"cluster__accelerator = 'nvdia' \(host localhost\): must be nvidia, amd or cpu"),
    ("metrics port in the ephemeral range", dict(group_vars={"cluster__ray_dashboard_metrics_port": 40000}),
     r"cluster__ray_dashboard_metrics_port = 40000 \(host localhost\): lies inside the ephemeral port range "
     r"32768-60999 \(cluster__ephemeral_min_port-cluster__ephemeral_max_port; the kernel hands them to outgoing "
     r"connections"),
    ("rendezvous range over the worker range", dict(group_vars={"cluster__rendezvous_max_port": 9450}),
     r"the rendezvous port range 9320-9450 \(cluster__rendezvous_min_port\.\.cluster__rendezvous_max_port\) "
     r"overlaps the worker port range 9400-9699"),
    ("tiny rendezvous range", dict(group_vars={"cluster__rendezvous_max_port": 9323}),
     r"cluster__rendezvous_max_port = 9323 \(host localhost\): must be at least cluster__rendezvous_min_port \+ 9 "
     r"= 9329: the rendezvous range needs a few ports per job and node \(10 at least\)"),
    ("ephemeral range not numbers", dict(group_vars={"cluster__ephemeral_max_port": "auto"}),
     r"cluster__ephemeral_max_port = 'auto' \(host localhost\): must be a whole number"),
    ("firewall switch as string", dict(group_vars={"firewall__enabled": "yes"}),
     r"firewall__enabled = 'yes' \(host localhost\): is a string: write the boolean true without quotes"),
    ("firewall CIDR", dict(group_vars={"firewall__allowed_cidrs": ["10.1.0.0/16", "10.0.0.0/33", "fe80::/10"]}),
     r'firewall__allowed_cidrs: "10.0.0.0/33" is not an IPv4 address or CIDR \(e.g. 10.20.0.0/16\); '
     r'firewall__allowed_cidrs: "fe80::/10" is not an IPv4 address or CIDR'),
    ("firewall CIDRs not a list", dict(group_vars={"firewall__allowed_cidrs": "10.0.0.0/8"}),
     r"firewall__allowed_cidrs = '10.0.0.0/8' \(host localhost\): must be a list"),
    ("firewall client port unknown", dict(group_vars={"firewall__client_ports": ["cluster__ssh_port"]}),
     r'firewall__client_ports: "cluster__ssh_port" is not one of the cluster\'s port variables \(cluster__ray_gcs_port'),
]


@pytest.mark.parametrize("label,kwargs,message", CASES, ids=[c[0] for c in CASES])
def test_bad_inventory_is_refused_with_the_variable_named(tmp_path, label, kwargs, message):
    inv = write_inventory(tmp_path, "val", "127.0.0.9", 9300, **kwargs)
    result = playbook(inv, "playbooks/validate.yml", timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode != 0, f"{label}: validate passed\n{out[-2000:]}"
    import re

    assert re.search(message, " ".join(out.split())), f"{label}: message not found\n{out[-3000:]}"


def test_good_inventory_passes(tmp_path):
    inv = write_inventory(tmp_path, "val", "127.0.0.9", 9300)
    result = playbook(inv, "playbooks/validate.yml", timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.parametrize("inventory", ["inventory", "examples/inventories/seed-2node"])
def test_shipped_inventories_pass_without_facts_or_connections(project, inventory):
    """The embedded inventory and the seed example keep the cluster role's fact-based default
    paths: the validate play (no facts, no host touched; the seed's hosts do not exist) passes."""
    result = playbook(project / inventory, "playbooks/validate.yml", timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]


def test_a_second_groupless_source_is_not_the_cluster_inventory(tmp_path):
    """Molecule passes its own inventory (hosts and how to reach them, no groups) next to the scenario's:
    the sources that declare the cluster's groups are checked, the other one does not count as a second,
    empty cluster. Alone, a groupless inventory is refused for what it lacks."""
    inv = write_inventory(tmp_path, "val", "127.0.0.9", 9300)
    connection_only = tmp_path / "molecule_inventory.yml"
    connection_only.write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n")
    both = playbook(inv, "playbooks/validate.yml", "-i", str(connection_only), timeout=120)
    assert both.returncode == 0, both.stdout[-3000:]
    alone = playbook(connection_only, "playbooks/validate.yml", timeout=120)
    out = " ".join((alone.stdout + alone.stderr).split())
    assert alone.returncode != 0 and "group ray_head = []: must hold exactly one host" in out, out[-2000:]


@pytest.mark.parametrize("entry", ["playbooks/validate.yml", "site.yml", "rlrun up", "rlrun status"])
def test_a_missing_or_empty_inventory_is_an_error(tmp_path, entry):
    """Ansible alone only warns that it parsed no inventory, and a play then runs on no host and passes."""
    from tests.conftest import rlrun

    (tmp_path / "empty.yml").write_text("")
    for inv, said in ((tmp_path / "NO-SUCH-PATH", f"inventory {tmp_path / 'NO-SUCH-PATH'} does not exist"),
                      (tmp_path / "empty.yml", "holds no hosts: expected the groups ray_head (one host)")):
        if entry.startswith("rlrun"):
            result = rlrun(inv, entry.split()[1], timeout=120)
        else:
            result = playbook(inv, entry, timeout=120)
        out = " ".join((result.stdout + result.stderr).split())
        assert result.returncode != 0, f"{entry} -i {inv.name} passed:\n{out[-2000:]}"
        assert said in out and "inventory ok" not in out, out[-2000:]
