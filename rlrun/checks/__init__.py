"""The inventory rules, once: everything that can be known about an inventory without touching a host.

One rule book for every entry point. `rlrun validate` and the validate play (the first play of site.yml,
playbooks/lookup_plugins/rlrun_validate.py) run :func:`check_inventory` on the whole inventory, offline. The
cluster role's assert, first task of every play, runs :func:`check_host` on its host's values as the play sees
them (roles/cluster/lookup_plugins/cluster_problems.py): the same per-host rules, without the ones that compare
hosts (groups, one address per node, the head's name, tokens and modes, `rlrun status`'s totals), which need
the whole inventory. rlrun/slurm/spec.py runs check_host on a Slurm job's values.

Each module holds one concern: groups, variables (names and types), addresses, ports, paths, node (resources,
vendor), accel (the accelerator env file: devices, fabric, ROCm, extra variables; roles/accel_env's own assert
runs these alone, :func:`check_accel`), services (reward, retrieval), cluster (identity, agreement with the
head, expectations). Every
problem goes through one recorder (problems.py) and names the file and line, the variable, its value and what
is expected.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlrun.checks.accel import check_accel_env
from rlrun.checks.addresses import check_address, check_addresses
from rlrun.checks.cluster import check_agreement, check_expected, check_identity
from rlrun.checks.groups import check_groups
from rlrun.checks.node import check_accelerator, check_resources, check_vendor
from rlrun.checks.paths import check_paths
from rlrun.checks.ports import check_ports
from rlrun.checks.problems import Problem, Recorder
from rlrun.checks.services import check_retriever, check_retriever_ports, check_reward, retriever_hosts
from rlrun.checks.variables import check_names, check_types
from rlrun.inventory_view import InventoryView

__all__ = ["Problem", "Roles", "check_accel", "check_host", "check_inventory"]


@dataclass(frozen=True)
class Roles:
    """What a host is in the cluster (roles/cluster's cluster__is_node, _is_head, _is_reward, _is_retriever)."""

    node: bool
    head: bool
    reward: bool
    retriever: bool

    @classmethod
    def of(cls, view: InventoryView, host: str) -> Roles:
        g = view.groups
        nodes = g.get("ray_cluster", [])
        return cls(node=host in nodes, head=host in g.get("ray_head", []), reward=host in g.get("reward_servers", []),
                   retriever=host in retriever_hosts(view, nodes))

    @property
    def member(self) -> bool:
        return self.node or self.reward


def _host(r: Recorder, host: str, roles: Roles) -> None:
    """The rules about one host's own values."""
    if not roles.member:
        return
    check_address(r, host)
    check_ports(r, host, is_node=roles.node, is_head=roles.head, is_reward=roles.reward, is_retriever=roles.retriever)
    check_paths(r, host, is_node=roles.node)
    check_vendor(r, host)
    if roles.node:
        check_resources(r, host)
        check_accelerator(r, host)
        check_accel_env(r, host)
    if roles.reward:
        check_reward(r, host)
    if roles.retriever:
        check_retriever(r, host)
    check_identity(r, host)


def check_inventory(view: InventoryView) -> list[Problem]:
    """Every problem of the inventory `view` reads (rlrun.inventory_view.read)."""
    r = Recorder(view)
    for fp in view.file_problems:
        r.file(fp.file, fp.line, fp.message)
    if view.file_problems:
        return r.problems
    if view.vaulted_files and not view.vault_open:
        for rel in sorted(view.vaulted_files):
            r.file(rel, None, "is vault-encrypted: pass --vault-password-file FILE (or ANSIBLE_VAULT_PASSWORD_FILE) "
                   "to check it, as ansible-playbook needs it too")
        return r.problems  # Ansible cannot read the inventory's variables without it
    check_groups(r)
    for host in view.hosts:
        check_names(r, host)
        check_types(r, host)
    nodes = view.groups.get("ray_cluster", [])
    members = sorted(set(nodes) | set(view.groups.get("reward_servers", [])))
    for host in members:
        _host(r, host, Roles.of(view, host))
    check_agreement(r, members)
    check_addresses(r, nodes)
    check_expected(r, nodes)
    check_retriever_ports(r, retriever_hosts(view, nodes))
    return r.problems


def check_host(view: InventoryView, host: str, roles: Roles | None = None) -> list[Problem]:
    """The problems of `host`'s own values (what the cluster role asserts on each host); `roles` what the host
    is, when not what the inventory's groups say (a Slurm job's node)."""
    r = Recorder(view)
    check_names(r, host)
    check_types(r, host)
    _host(r, host, roles or Roles.of(view, host))
    return r.problems


def check_accel(view: InventoryView, host: str) -> list[Problem]:
    """The problems of `host`'s accelerator env file settings: what roles/accel_env asserts first
    (lookup_plugins/accel_env_problems.py), the same rules as check_host's."""
    r = Recorder(view)
    check_accel_env(r, host)
    return r.problems
