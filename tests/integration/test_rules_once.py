"""The inventory rules are written once (rlrun/checks/) and every entry point reports the same problems.

One inventory, each of its hosts broken by one rule about a host's own values (rules that were only in the
cluster role's Jinja before, rules that were only in Python, rules both had), goes through:
- `rlrun validate` (the CLI, --json),
- the cluster role's assert alone (a play of the cluster role, as every play of the project starts), which
  fails on each host with the problems `cluster__problems` lists,
- `ansible-playbook site.yml --tags validate` (its first play),
and each reports the same problems on the same hosts. Nothing is reached: the hosts are SSH hosts on a port
nothing listens on, and no play gathers facts.

A role that checks its own inputs (reward_server, python_stack) asks the same rules through the cluster role's
lookup, on the values the role gets, role parameters included: its assert fails with the lines `rlrun validate`
prints for the same values written in the inventory.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from tests.conftest import BIN, PROJECT, ansible_env, playbook, write_inventory

pytestmark = pytest.mark.integration

P = 9700  # the inventory's ports (nothing binds them)
LONG_NAME = "n" * 41

# host -> (its own variables that break one rule, the variable the problem must name)
BROKEN = {
    # only roles/cluster's Jinja checked these before
    "w01": ({"cluster__rendezvous_max_port": P + 25}, "cluster__rendezvous_max_port"),
    "w02": ({"cluster__ephemeral_min_port": 60500}, "cluster__ephemeral_max_port"),
    "w03": ({"cluster__node_files": "yes"}, "cluster__node_files"),
    # only rlrun validate checked these before
    "w04": ({"cluster__ray_gcs_prot": P}, "cluster__ray_gcs_prot"),
    "w05": ({"ray_node__num_gpus": 2}, "ray_node__num_gpus"),
    "w06": ({"cluster__ray_spill_dir": "spill"}, "cluster__ray_spill_dir"),
    "w07": ({"cluster__token": "changeme"}, "cluster__token"),
    "w08": ({"accel_env__gloo_socket_ifname": "eth0,eth1"}, "accel_env__gloo_socket_ifname"),
    # both, in their own words before
    "w09": ({"cluster__ray_object_manager_port": 40000}, "cluster__ray_object_manager_port"),
    "w10": ({"cluster__ray_max_worker_port": P + 150}, "cluster__ray_max_worker_port"),
    "w11": ({"ray_node__gcs_port": P}, "ray_node__gcs_port"),
    "w12": ({"cluster__accelerator": "nvida"}, "cluster__accelerator"),
    "w13": ({"cluster__nofile_limit": 100}, "cluster__nofile_limit"),
    "w14": ({"cluster__node_address": "127.0.29.256"}, "cluster__node_address"),
    "w15": ({"cluster__auth_enabled": "false"}, "cluster__auth_enabled"),
    # a vaulted value (host_vars/w16.yml, below): each entry point opens the vault
    "w16": ({}, "cluster__reward_token"),
}
# The head, also the reward host: a head-only port in the ephemeral range (the role's check only, before),
# an unknown extraction strategy (rlrun validate's only).
HEAD = {"cluster__ray_dashboard_metrics_port": 40001, "reward_server__extract": ["boxed", "magic"],
        # the reward role's Jinja checked these, rlrun validate did not
        "reward_server__lenient": ["units", "unit"], "reward_server__prompt_template": "llama9",
        # and no problem: a value that refers to another role's default, there when that role runs (the
        # cluster role's assert refused it at first, on the GPU miniature's inventory)
        "python_stack__extra_paths": ["/tmp/site", "{{ python_stack__project_src }}"]}


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    root = tmp_path_factory.mktemp("rules-once")
    workers = {host: {"ansible_connection": "ssh", "ansible_host": f"127.0.29.{i}", "ansible_port": 1,
                      "cluster__node_address": f"127.0.29.{i}", **bad}
               for i, (host, (bad, _)) in enumerate(BROKEN.items(), start=1)}
    # Every host: a cluster name over 40 characters (rlrun validate's limit; the role had none), which also
    # makes the temp dirs too long for Ray's sockets.
    inv = write_inventory(root, LONG_NAME, "127.0.29.100", P, hosts_extra=HEAD, workers=workers)
    (root / "vault-pass").write_text("right\n")
    vaulted = subprocess.run([str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file",
                              str(root / "vault-pass"), "short", "--name", "cluster__reward_token"],
                             capture_output=True, text=True, check=True, env=ansible_env())
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "w16.yml").write_text(vaulted.stdout)
    return inv


def _vault(inv) -> list[str]:
    return ["--vault-password-file", str(inv.parent / "vault-pass")]


def _core(problem: dict) -> str:
    """`rlrun validate --json`'s problem without where it was written and on which hosts: the line the
    cluster role's assert prints."""
    where = f"{problem['file']}:{problem['line']}: " if problem["line"] else f"{problem['file']}: "
    on = f" (host {', '.join(problem['hosts'])})" if problem["hosts"] else ""
    message = problem["message"]
    assert message.startswith(where) and on in message, problem
    return message[len(where):].replace(on, "", 1)


def _by_host(problems: list[dict]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for p in problems:
        assert p["hosts"], f"a problem about no one host (this inventory breaks only per-host rules): {p}"
        for host in p["hosts"]:
            out.setdefault(host, set()).add(_core(p))
    return out


def test_rlrun_validate_and_the_cluster_roles_assert_report_the_same_problems(broken, tmp_path):
    cli = subprocess.run([str(BIN / "rlrun"), "-i", str(broken), *_vault(broken), "validate", "--json"],
                         capture_output=True, text=True, timeout=120, env=ansible_env(), cwd=PROJECT)
    assert cli.returncode == 1, cli.stderr
    offline = _by_host(json.loads(cli.stdout)["problems"])
    for host, (_, variable) in BROKEN.items():
        assert any(m.startswith(variable) for m in offline.get(host, ())), f"{host}: no {variable} in {offline.get(host)}"
    assert any(m.startswith("cluster__ray_dashboard_metrics_port = 40001") for m in offline["localhost"])
    for var in ("reward_server__extract", "reward_server__lenient", "reward_server__prompt_template"):
        assert any(m.startswith(var) for m in offline["localhost"]), f"no {var} in {offline['localhost']}"
    assert all(any(m.startswith(f"cluster__name = '{LONG_NAME}'") for m in found) for found in offline.values())
    assert "cluster__reward_token = (hidden): is 5 characters: use at least 32 (openssl rand -hex 32)" in offline["w16"]

    # The cluster role alone, as each play starts: its assert fails on every host; the rescue prints the list it
    # failed on.
    play = tmp_path / "cluster_assert.yml"
    play.write_text(yaml.safe_dump([{
        "name": "The cluster role's assert", "hosts": "ray_cluster:reward_servers", "gather_facts": False,
        "tasks": [{"block": [{"ansible.builtin.import_role": {"name": "cluster"}}],
                   "rescue": [{"ansible.builtin.debug": {
                       "msg": "PROBLEMS {{ ansible_failed_task.name }} {{ cluster__problems | to_json }}"}}]}]}],
        sort_keys=False))
    env = {**ansible_env(), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    result = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(broken), *_vault(broken), str(play)],
                            capture_output=True, text=True, env=env, timeout=300, cwd=PROJECT)
    out = result.stdout + result.stderr
    in_play: dict[str, set[str]] = {}
    for host, text in re.findall(r'ok: \[([\w.-]+)\] => \{\s*"msg": ("PROBLEMS .*")\s*\}', out):
        message = json.loads(text)
        assert message.startswith("PROBLEMS Check the cluster contract "), message
        in_play[host] = set(json.loads(message.removeprefix("PROBLEMS Check the cluster contract ")))
    assert in_play == offline, f"\nrlrun validate: {offline}\nthe cluster role: {in_play}\n{out[-3000:]}"
    assert "unreachable=1" not in out and "changed=1" not in out


def test_site_yml_tags_validate_reports_what_rlrun_validate_does(broken):
    cli = subprocess.run([str(BIN / "rlrun"), "-i", str(broken), *_vault(broken), "validate"], capture_output=True,
                         text=True, timeout=120, env=ansible_env(), cwd=PROJECT)
    offline = sorted(re.findall(r"^  - (.*)$", cli.stderr, re.M))
    assert cli.returncode == 1 and len(offline) >= len(BROKEN), cli.stderr
    result = playbook(broken, "site.yml", "--tags", "validate", *_vault(broken), timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "nothing was done on any host:" in out, out[-3000:]
    listed = out.split("nothing was done on any host:", 1)[1].split("\nOrigin:", 1)[0]
    assert sorted(re.findall(r"^- (.*)$", listed, re.M)) == offline


# Each role's inputs, given to it as role parameters (not in the inventory), each breaking one of its rules.
ROLE_INPUTS = {
    "reward_server": {"reward_server__extract": ["boxed", "magic"], "reward_server__lenient": ["unit"],
                      "reward_server__prompt_template": "llama9", "reward_server__workers": 0,
                      "reward_server__timeout": -1},
    "python_stack": {"cluster__accelerator": "nvida", "cluster__venv": "venv", "python_stack__project_install": "pip"},
}


@pytest.mark.parametrize("role", sorted(ROLE_INPUTS))
def test_a_roles_assert_checks_its_role_parameters_by_rlrun_validates_rules(role, tmp_path):
    values = ROLE_INPUTS[role]
    # rlrun validate, the same values written in the inventory
    written = write_inventory(tmp_path / "written", "rules-role", "127.0.29.200", P, hosts_extra=values)
    cli = subprocess.run([str(BIN / "rlrun"), "-i", str(written), "validate", "--json"], capture_output=True,
                         text=True, timeout=120, env=ansible_env(), cwd=PROJECT)
    expected = [_core(p) for p in json.loads(cli.stdout)["problems"] if p["variable"] in values]
    assert {m.split(" ", 1)[0] for m in expected} == set(values), cli.stdout

    # the role's own assert, the values given as role parameters on a right inventory
    right = write_inventory(tmp_path / "right", "rules-role", "127.0.29.200", P)
    play = tmp_path / "role_assert.yml"
    play.write_text(yaml.safe_dump([{
        "name": f"{role}'s assert", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"ansible.builtin.import_role": {"name": "cluster"}},
                  {"block": [{"ansible.builtin.include_role": {"name": role, "tasks_from": "assert.yml"},
                              "vars": values}],
                   "rescue": [{"ansible.builtin.debug": {"msg": "FAILED {{ ansible_failed_result.msg }}"}}]}]}],
        sort_keys=False))
    env = {**ansible_env(), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    result = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(right), str(play)], capture_output=True,
                            text=True, env=env, timeout=300, cwd=PROJECT)
    out = result.stdout + result.stderr
    failed = [json.loads(m) for m in re.findall(r'"msg": ("FAILED .*")', out)]
    assert len(failed) == 1, out[-3000:]
    assert failed[0] == "FAILED localhost: " + "; ".join(expected), f"\nrlrun validate: {expected}\n{out[-3000:]}"


# Hosts reached locally (their accelerator env file goes to the inventory's state dir), each breaking one rule
# of the accelerator env file, or none.
ACCEL = {
    "a1": {"accel_env__rocm_version": "6.2"},  # on a cpu host: accel_env's own assert held this rule alone before
    "a2": {"accel_env__gloo_socket_ifname": "eth0,eth1"},
    "a3": {"accel_env__nccl_debug": "WARN", "accel_env__extra": {"NCCL_DEBUG": "INFO"}},
    "a4": {"cluster__accelerator": "amd", "accel_env__rocm_version": "6.10"},  # right
}


def test_the_accel_env_roles_assert_reports_what_rlrun_validate_does(tmp_path):
    workers = {host: {"ansible_connection": "local", "ansible_python_interpreter": str(BIN / "python"),
                      "cluster__node_address": f"127.0.29.{i}", **bad}
               for i, (host, bad) in enumerate(ACCEL.items(), start=1)}
    inv = write_inventory(tmp_path / "inv", "accel", "127.0.29.100", P, workers=workers)
    cli = subprocess.run([str(BIN / "rlrun"), "-i", str(inv), "validate", "--json"], capture_output=True, text=True,
                         timeout=120, env=ansible_env(), cwd=PROJECT)
    assert cli.returncode == 1, cli.stderr
    offline = _by_host(json.loads(cli.stdout)["problems"])
    assert set(offline) == {"a1", "a2", "a3"}, offline
    assert offline["a1"] == {"accel_env__rocm_version = '6.2': is only for AMD GPUs, and this host's "
                             "cluster__accelerator is cpu: remove it, or set cluster__accelerator to amd"}

    # accel_env alone after the cluster role (its assert skipped as passed): the role's own first task fails on
    # exactly those hosts with exactly those problems; a4 goes on and writes its file.
    play = tmp_path / "accel_assert.yml"
    play.write_text(yaml.safe_dump([{
        "name": "accel_env's assert", "hosts": "ray_workers", "gather_facts": False,
        "vars": {"cluster__checked": True},
        "roles": [{"role": "cluster", "vars": {"cluster__node_files": "present"}}],
        "tasks": [{"block": [{"ansible.builtin.import_role": {"name": "accel_env"}}],
                   "rescue": [{"ansible.builtin.debug": {
                       "msg": "PROBLEMS {{ ansible_failed_task.name }} {{ query('accel_env_problems') | to_json }}"}}]}]}],
        sort_keys=False))
    env = {**ansible_env(), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    result = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(play)], capture_output=True,
                            text=True, env=env, timeout=300, cwd=PROJECT)
    out = result.stdout + result.stderr
    in_play: dict[str, set[str]] = {}
    for host, text in re.findall(r'ok: \[([\w.-]+)\] => \{\s*"msg": ("PROBLEMS .*")\s*\}', out):
        message = json.loads(text)
        assert message.startswith("PROBLEMS Check accel_env inputs "), message
        in_play[host] = set(json.loads(message.removeprefix("PROBLEMS Check accel_env inputs ")))
    assert in_play == offline, f"\nrlrun validate: {offline}\naccel_env: {in_play}\n{out[-3000:]}"
    env_file = tmp_path / "inv" / "state" / "a4" / "accel.env"
    assert "HSA_NO_SCRATCH_RECLAIM='1'" in env_file.read_text(), out[-3000:]
    assert not (tmp_path / "inv" / "state" / "a1" / "accel.env").exists()
