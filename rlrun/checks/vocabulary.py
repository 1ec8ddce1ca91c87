"""What the checks know by name: roles/cluster's contract variables (named once in :data:`N`), the groups
rlrun reads, the roles' namespaces, and what the roles declare about their variables (defaults, derived vars,
argument specs, renamed names, the port maps and the ranges' fewest ports), read from the roles themselves so
that a new role variable, port or range is checked without touching the checks."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from rlrun.contract import role_file, role_files, role_specs

N = SimpleNamespace(
    cluster_name="cluster__name",
    node_address="cluster__node_address",
    accelerator="cluster__accelerator",
    min_worker_port="cluster__ray_min_worker_port",
    max_worker_port="cluster__ray_max_worker_port",
    reward_port="cluster__reward_port",
    retriever_port="cluster__retriever_port",
    retriever_corpus="retriever__corpus",
    retriever_index="retriever__index_dir",
    temp_dir="cluster__ray_temp_dir",
    node_paths=("cluster__ray_spill_dir", "cluster__state_dir", "cluster__venv", "accel_env__hf_home",
                "reward_server__dataset", "retriever__index_dir", "retriever__embedding_model"),
    controller_paths=("cluster__token_store", "cluster__reward_token_store", "cluster__reward_tls_store",
                      "cluster__retriever_token_store", "python_stack__project_src", "retriever__corpus"),
    auth_enabled="cluster__auth_enabled",
    token="cluster__token",
    reward_token="cluster__reward_token",
    retriever_token="cluster__retriever_token",
    reward_tls="cluster__reward_tls",
    node_files="cluster__node_files",
    num_gpus="ray_node__num_gpus",
    num_cpus="ray_node__num_cpus",
    object_store_memory="ray_node__object_store_memory",
    resources="ray_node__resources",
    deepspeed_ops="ray_node__deepspeed_ops",
    expected_nodes="cluster__expected_nodes",
    expected_gpus="cluster__expected_gpus",
    nofile_limit="cluster__nofile_limit",
    visible_devices="accel_env__visible_devices",
    gloo_ifname="accel_env__gloo_socket_ifname",
    nccl_ifname="accel_env__nccl_socket_ifname",
    nccl_debug="accel_env__nccl_debug",
    ib_gid_index="accel_env__nccl_ib_gid_index",
    rocm_version="accel_env__rocm_version",
    reward_workers=("reward_server__workers", "reward_server__threads"),
    reward_timeout="reward_server__timeout",
    reward_extract="reward_server__extract",
    reward_lenient="reward_server__lenient",
    reward_prompt_template="reward_server__prompt_template",
    reward_auth="reward_server__auth_enabled",
)
# Names the inventory may set although no role's defaults or argument specs list them.
INVENTORY_NAMES: set[str] = set()
NAMESPACES = ("rlrun__", "ray_node__", "reward_server__", "accel_env__", "python_stack__", "node_service__",
              "preflight__", "cluster__", "retriever__")
GROUPS = ("ray_cluster", "ray_head", "ray_workers", "reward_servers", "retrievers")


@dataclass(frozen=True)
class PortRange:
    """One of roles/cluster's port ranges (cluster__port_range_specs): its variables and fewest ports."""

    name: str
    first: str
    last: str
    min_span: int
    why: str


@functools.cache
def _cluster_vars() -> dict[str, Any]:
    return role_file("cluster", "vars")


def head_ports() -> tuple[str, ...]:
    """The fixed ports of the head only (roles/cluster's cluster__ray_head_ports)."""
    return tuple(_cluster_vars()["cluster__ray_head_ports"])


def node_ports() -> tuple[str, ...]:
    """The fixed ports of every Ray node (roles/cluster's cluster__ray_node_ports)."""
    return tuple(_cluster_vars()["cluster__ray_node_ports"])


def port_ranges() -> tuple[PortRange, ...]:
    """The ranges of a Ray node, worker first (roles/cluster's cluster__port_range_specs)."""
    return tuple(PortRange(name, spec["vars"][0], spec["vars"][1], int(spec["min_span"]), spec["why"])
                 for name, spec in _cluster_vars()["cluster__port_range_specs"].items())


def renamed() -> dict[str, str]:
    """roles/cluster's cluster__renamed: old name -> new name."""
    return dict(_cluster_vars().get("cluster__renamed") or {})


@functools.cache
def specific() -> frozenset[str]:
    """Variables with a rule of their own (a clearer message than the type from argument_specs). The
    rendezvous and ephemeral bounds keep their type's rule ("must be a whole number"); their range is checked
    with the ports."""
    return frozenset({*head_ports(), *node_ports(), N.min_worker_port, N.max_worker_port, N.reward_port,
                      N.retriever_port, N.num_gpus, N.num_cpus, N.object_store_memory, N.resources,
                      N.visible_devices, N.nofile_limit, N.ib_gid_index, *N.reward_workers, N.reward_timeout,
                      N.expected_nodes, N.expected_gpus, N.accelerator, N.gloo_ifname, N.nccl_ifname, N.nccl_debug,
                      N.temp_dir, *N.node_paths, *N.controller_paths, N.cluster_name, N.node_address, N.token,
                      N.reward_token, N.retriever_token, N.reward_extract, N.reward_lenient, N.reward_prompt_template,
                      N.node_files})


@functools.cache
def _known() -> tuple[dict[str, dict[str, Any]], frozenset[str], frozenset[str]]:
    specs = role_specs()
    defaults = {k: v for values in role_files("defaults").values() for k, v in values.items()}
    # A variable without an argument spec gets the type of its default (a role without
    # meta/argument_specs.yml, such as cluster): a bool default wants a bool, an int default an int.
    for var, default in defaults.items():
        if var not in specs and isinstance(default, bool | int | list | dict):
            kind = {bool: "bool", int: "int", list: "list", dict: "dict"}[type(default)]
            specs[var] = {"type": kind, "role": "defaults"}
    derived = frozenset(k for values in role_files("vars").values() for k in values)
    return specs, frozenset(defaults), derived


def specs() -> dict[str, dict[str, Any]]:
    """{variable: its type and choices}: the roles' argument specs, else the type of its default."""
    return _known()[0]


def defaults() -> frozenset[str]:
    """Every variable a role has a default for."""
    return _known()[1]


def derived() -> frozenset[str]:
    """Every variable a role derives (its vars/main.yml)."""
    return _known()[2]
