"""The one reader of the cluster contract (rlrun/contract.py) and the rules that were written twice before
(rlrun/checks/): a host's values as a play sees them, a missing or empty inventory refused by every reader,
the roles' own port maps and ranges checked, a Slurm job's values held to the same rules."""

import pytest
import yaml

from rlrun import contract as C
from rlrun.checks import vocabulary as V
from rlrun.errors import RlrunError
from rlrun.inventory import load_cluster
from rlrun.slurm.spec import evaluate
from rlrun.validate import validate_inventory
from tests.conftest import PROJECT, write_inventory


def _problems(inv) -> str:
    return "\n".join(map(str, validate_inventory(inv).problems))


def test_a_host_sees_role_defaults_then_the_inventory_then_role_vars(tmp_path):
    inv = write_inventory(tmp_path, "prec", "127.0.0.9", 9300,
                          group_vars={"cluster__dashboard_url": "http://elsewhere:1", "cluster__reward_tls": True})
    contract = C.open_contract(inv)
    assert contract.get("localhost", "cluster__nofile_limit") == 65535  # the role's default
    assert contract.get("localhost", "cluster__name") == "prec"  # the inventory over the default
    assert contract.get("localhost", "cluster__dashboard_url") == "http://127.0.0.9:9301"  # role vars win
    assert contract.get("localhost", "cluster__reward_url") == "https://127.0.0.9:9350/get_reward"
    assert contract.get("localhost", "cluster__name", {"cluster__name": "x"}) == "x"  # extra on top
    assert contract.is_set("localhost", "cluster__name") and not contract.is_set("localhost", "cluster__venv_x")


def test_renamed_names_are_refused_by_every_reader(tmp_path):
    inv = write_inventory(tmp_path, "ren", "127.0.0.9", 9300, group_vars={"ray_node__gcs_port": 9300})
    with pytest.raises(RlrunError, match=r"ray_node__gcs_port is set for localhost, but renamed: write "
                                         r"cluster__ray_gcs_port \(roles/cluster/README.md\)"):
        load_cluster(inv)
    with pytest.raises(RlrunError, match=r"ray_node__gcs_port is set for localhost, but renamed"):
        evaluate(inv)
    assert "ray_node__gcs_port = 9300 (host localhost): was renamed: write cluster__ray_gcs_port" in _problems(inv)


@pytest.mark.parametrize("kind", ["missing", "empty file", "empty directory", "no hosts"])
def test_a_missing_or_empty_inventory_is_refused_by_every_reader(tmp_path, kind):
    inv = tmp_path / "inv"
    if kind == "empty file":
        inv.write_text("")
    elif kind == "empty directory":
        inv.mkdir()
    elif kind == "no hosts":
        inv.write_text(yaml.safe_dump({"all": {"children": {"ray_cluster": {"children": {"ray_head": {}}}}}}))
    said = r"does not exist \(expected an Ansible inventory file or directory" if kind == "missing" else \
        r"holds no hosts(?: file)?: expected .*the groups ray_head \(one host\)"
    for read in (load_cluster, evaluate, C.open_contract):
        with pytest.raises(RlrunError, match=said):
            read(inv)
    if kind == "missing":
        with pytest.raises(RlrunError, match=said):
            validate_inventory(inv)
    else:
        problems = validate_inventory(inv).problems
        assert len(problems) == 1 and problems[0].variable == "(file)", problems
        assert "holds no hosts" in problems[0].expected


def test_without_the_roles_the_reader_names_both_places_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "_CHECKOUT", tmp_path / "checkout")
    monkeypatch.setattr(C, "_SHIPPED", tmp_path / "pkg" / "_ansible")
    with pytest.raises(RlrunError) as exc:
        C.ansible_dir()
    text = str(exc.value)
    assert "\n" not in text and "roles/cluster/defaults/main.yml" in text
    assert str(tmp_path / "pkg" / "_ansible") in text and str(tmp_path / "checkout") in text
    with pytest.raises(RlrunError, match="cannot find the Ansible roles"):
        C.open_contract(PROJECT / "inventory")


def test_the_checks_read_the_port_maps_and_ranges_from_the_cluster_role():
    derived = yaml.safe_load((PROJECT / "roles" / "cluster" / "vars" / "main.yml").read_text())
    assert V.head_ports() == tuple(derived["cluster__ray_head_ports"])
    assert V.node_ports() == tuple(derived["cluster__ray_node_ports"])
    assert [(r.name, r.first, r.last, r.min_span) for r in V.port_ranges()] == [
        (name, *spec["vars"], spec["min_span"]) for name, spec in derived["cluster__port_range_specs"].items()]
    # No rule is written in the role's Jinja: its check is a call of these rules.
    assert derived["cluster__problems"] == "{{ query('cluster_problems') }}"
    assert "{%" not in (PROJECT / "roles" / "cluster" / "vars" / "main.yml").read_text().split("cluster__problems:")[1]


@pytest.mark.parametrize("group_vars,expected", [
    # checked only by the cluster role's Jinja before
    ({"cluster__rendezvous_max_port": 9325},
     "cluster__rendezvous_max_port = 9325 (host localhost): must be at least cluster__rendezvous_min_port + 9 = 9329"),
    ({"cluster__ephemeral_min_port": 60500},
     "cluster__ephemeral_max_port = 60999 (host localhost): must be at least cluster__ephemeral_min_port + 999"),
    ({"cluster__ephemeral_max_port": 70000},
     "cluster__ephemeral_max_port = 70000 (host localhost): must be a port number"),
    ({"cluster__ray_autoscaler_metrics_port": 9301},
     "cluster__ray_autoscaler_metrics_port = 9301 (host localhost): is also cluster__ray_dashboard_port on this host"),
    ({"cluster__ray_dashboard_metrics_port": 40000},
     "cluster__ray_dashboard_metrics_port = 40000 (host localhost): lies inside the ephemeral port range"),
    ({"cluster__node_files": "yes"}, "cluster__node_files = 'yes' (host localhost): must be present, absent or null"),
])
def test_rules_once_only_in_the_roles_jinja_are_rlrun_validates_now(tmp_path, group_vars, expected):
    assert expected in _problems(write_inventory(tmp_path, "jinja", "127.0.0.9", 9300, group_vars=group_vars))


@pytest.mark.parametrize("group_vars,expected", [
    ({"cluster__rendezvous_max_port": 9325}, "cluster__rendezvous_max_port = 9325: must be at least"),
    ({"cluster__name": "n" * 41}, f"cluster__name = '{'n' * 41}': must be 1-40 letters"),
    ({"cluster__ray_gcs_prot": 1}, "cluster__ray_gcs_prot = 1: is not a variable of any role"),
])
def test_a_slurm_job_is_held_to_the_same_rules(tmp_path, group_vars, expected):
    inv = write_inventory(tmp_path, "sj", "127.0.0.9", 9300, group_vars=group_vars)
    with pytest.raises(RlrunError) as exc:
        evaluate(inv)
    assert expected in str(exc.value)


def test_a_good_inventory_gives_a_slurm_spec(tmp_path):
    assert evaluate(write_inventory(tmp_path, "sj", "127.0.0.9", 9300)).cluster_name == "sj"

