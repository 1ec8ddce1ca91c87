"""The node-start spec, evaluated from the roles' own files for a Slurm job.

A Ray node started by ``site.yml`` and one started inside a Slurm allocation
must be the same node: the same ``ray start`` flags, the same env files in the
same order (accelerator env, then Ray's auth / HOME / PATH env), the same
reward-service command. So nothing here restates them: this module evaluates
the very expressions the roles use (``roles/ray_node/vars/main.yml``'s
``ray_node__command``, ``ray_node__env_files``, its ``templates/ray.env.j2``,
``roles/accel_env``'s ``accel_env__vars`` and ``templates/accel.env.j2``,
``roles/reward_server/vars/main.yml``'s ``reward_server__command``) with
Ansible's own templar, with the precedence of a play that lists the cluster
role first: role defaults < the inventory's variables < role vars < the Slurm
job's values.

The values only the allocation knows (the node's name and address, the head's
address, the per-job ports, temp and state dirs, the user's home) enter as
placeholders ``@@rlrun:NAME@@`` and come out of :func:`shell_word` /
:func:`heredoc` as the shell variables ``${NAME}`` the sbatch script sets on
each node. Substituting a host's inventory values for them gives back the role's
command for that host; the golden test (tests/integration/test_slurm.py) checks
exactly that against ``ansible-playbook``'s own evaluation.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rlrun.checks import Roles, check_host
from rlrun.contract import open_contract
from rlrun.errors import RlrunError
from rlrun.inventory_view import InventoryView
from rlrun.slurm.ports import block_for_job, layout

PLACEHOLDER_RE = re.compile(r"@@rlrun:([A-Z][A-Z0-9_]*)@@")


def ph(name: str) -> str:
    """The placeholder for shell variable `name`."""
    return f"@@rlrun:{name}@@"


# Shell variables the script sets on each node before it uses the spec, and what they hold.
RUNTIME = {
    "NODE": "the Slurm node's name ($SLURMD_NODENAME): the role's inventory_hostname",
    "NODE_IP": "this node's address (explicit, per node): cluster__node_address",
    "HEAD_IP": "the head's address: cluster__head_address",
    "USER_HOME": "the user's home on the node: ansible_env.HOME",
    "USER_NAME": "the user's name: ansible_user_id",
    "STATE_DIR": "the node's per-job state dir (env files, tokens, HOME of Ray): cluster__state_dir",
    "TEMP_DIR": "the node's per-job Ray temp dir (short; sockets): cluster__ray_temp_dir",
    "SPILL_DIR": "the node's per-job object spilling dir: cluster__ray_spill_dir",
    "NUM_CPUS": "CPUs Slurm gave the job on this node ($SLURM_CPUS_ON_NODE): ray_node__num_cpus",
    "JOB_CKPT": "a --requeue batch job's checkpoint dir, the same for every run of its job id (batch step only)",
}  # and the job's port block: one PORT_* variable for each port and range end of the contract (PORT_VARS)


def __getattr__(name: str):
    """``PORT_VARS``: role variable -> shell variable, what the allocation decides instead of the inventory: every
    port and range end of the job's port block (rlrun/slurm/ports.py's layout, read from the cluster contract when
    first asked for)."""
    if name == "PORT_VARS":
        return layout().shell_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
ROLES = ("cluster", "ray_node", "accel_env", "reward_server")
MANAGED = "rendered by rlrun slurm from the roles' own templates"


@dataclass
class NodeSpec:
    """What a node of the Slurm job runs, with placeholders for the allocation's values."""

    cluster_name: str
    accelerator: str
    venv: str
    nofile_limit: str
    head_argv: list[str]
    worker_argv: list[str]
    env_files: list[str]  # loaded in this order before ray.env (ray_node__env_files)
    ray_env_file: str
    ray_env: str  # the text of ray.env (roles/ray_node/templates/ray.env.j2)
    accel_env_file: str
    accel_env: str  # the text of accel.env (roles/accel_env/templates/accel.env.j2)
    accel_vars: dict[str, str]
    token_file: str
    reward_argv: list[str]
    reward_token_file: str
    inventory: Path = field(default_factory=Path)
    head_host: str = ""
    deepspeed_ops: list[str] = field(default_factory=list)  # built on each node before its Ray starts


def evaluate(inventory: Path, vault_password_file: str | None = None, *, num_cpus: str | int | None = None,
             num_gpus: int | None = None, object_store_memory: int | None = None,
             spill_dir: str | None = None) -> NodeSpec:
    """The spec for a Slurm job of the cluster `inventory` describes (its head host's variables).

    num_cpus / num_gpus / object_store_memory replace the inventory's ray_node__* values when given;
    CPUs default to what Slurm gives the job on each node. spill_dir replaces the per-job default
    (<state dir>/spill) with a path on the nodes that may use ${NODE} etc.
    """
    # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
    from ansible.errors import AnsibleError

    try:
        contract = open_contract(inventory, vault_password_file, roles=ROLES)
        host = contract.head()
        _refuse_placeholders(contract.own(host), inventory)
        contract.refuse_renamed(host)
        job = {
            "inventory_hostname": ph("NODE"),
            "ansible_env": {"HOME": ph("USER_HOME")},
            "ansible_user_id": ph("USER_NAME"),
            "ansible_managed": MANAGED,
            "groups": contract.groups,
            "cluster__node_address": ph("NODE_IP"),
            "cluster__head_address": ph("HEAD_IP"),
            "cluster__state_dir": ph("STATE_DIR"),
            "cluster__ray_temp_dir": ph("TEMP_DIR"),
            "cluster__ray_spill_dir": spill_dir or ph("SPILL_DIR"),
            # Every service of a job on shared nodes is behind its job's token.
            "cluster__auth_enabled": True,
            "reward_server__auth_enabled": True,
            # Slurm binds the GPUs of the allocation (CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES per step);
            # a device list from the inventory would fight it.
            "accel_env__visible_devices": [],
            "ray_node__num_cpus": str(num_cpus) if num_cpus is not None else ph("NUM_CPUS"),
            **{var: ph(name) for var, name in layout().shell_names().items()},
        }
        if num_gpus is not None:
            job["ray_node__num_gpus"] = num_gpus
        if object_store_memory is not None:
            job["ray_node__object_store_memory"] = object_store_memory

        def get(name: str, extra: dict | None = None):
            return contract.get(host, name, {**job, **(extra or {})})

        def render(template: str, extra: dict | None = None) -> str:
            return contract.render(host, template, {**job, **(extra or {})})

        head, worker = {"cluster__is_head": True}, {"cluster__is_head": False}
        _check_contract(contract, host, job, inventory)
        if get("cluster__reward_tls") is True:
            raise RlrunError(f"inventory {inventory}: cluster__reward_tls = true, but a Slurm job has no CA on its "
                             "nodes: its reward service serves plain HTTP behind the job's own reward token; "
                             "give rlrun slurm an inventory with cluster__reward_tls: false")
        # The reward service's own token (the role's cluster__reward_token_file in the job's state dir), one per
        # job, never the cluster token.
        reward_token = str(get("cluster__reward_token_file"))
        spec = NodeSpec(
            cluster_name=str(get("cluster__name")),
            accelerator=str(get("cluster__accelerator")),
            venv=str(get("cluster__venv")),
            nofile_limit=str(get("cluster__nofile_limit")),
            head_argv=[str(a) for a in get("ray_node__command", head)],
            worker_argv=[str(a) for a in get("ray_node__command", worker)],
            env_files=[str(f) for f in get("ray_node__env_files", worker)],
            ray_env_file=str(get("ray_node__env_file", worker)),
            ray_env=render("ray_node/templates/ray.env.j2", worker),
            accel_env_file=str(get("cluster__accel_env_file")),
            accel_env=render("accel_env/templates/accel.env.j2"),
            accel_vars={str(k): str(v) for k, v in get("accel_env__vars").items()},
            token_file=str(get("cluster__token_file")),
            reward_argv=[str(a) for a in get("reward_server__command")],
            reward_token_file=reward_token,
            inventory=inventory,
            head_host=host,
            deepspeed_ops=list(dict.fromkeys(get("ray_node__deepspeed_ops"))),  # names checked by the contract's rules
        )
    except AnsibleError as exc:
        raise RlrunError(f"inventory {inventory}: {exc.message}") from None
    _check_accel_inputs(spec, get)
    return spec


# Values standing for the allocation's in the contract's check (the rules want an address, paths, numbers).
SAMPLE = {"NODE": "node1", "NODE_IP": "10.0.0.1", "HEAD_IP": "10.0.0.1", "USER_HOME": "/home/user",
          "USER_NAME": "user", "STATE_DIR": "/tmp/rlrun-user/job-0/state", "TEMP_DIR": "/tmp/rlrun-user/job-0/ray",
          "SPILL_DIR": "/tmp/rlrun-user/job-0/spill", "NUM_CPUS": "1"}


def _check_contract(contract, host: str, job: dict, inventory: Path) -> None:
    """The contract's own per-host rules (rlrun/checks: names, types, ports and ranges, paths, switches), on
    the job's values with a sample of the allocation's: job 0's port block, an address, short paths. A node of
    the job as the worker it is on most nodes; it runs the reward service where the inventory's head does, and
    no retrieval service."""

    sample = {**SAMPLE, **{name: str(port) for name, port in block_for_job(0).ports().items()}}
    values = {k: _substituted(v, sample) for k, v in job.items()}
    values = {**values, "inventory_hostname": host, "cluster__is_head": False, "cluster__is_node": True}
    root = inventory if inventory.is_dir() else inventory.parent
    view = InventoryView(path=inventory, root=root, contract=contract,
                         play_vars={host: contract.variables(host, values)})
    roles = Roles(node=True, head=False, reward=host in contract.groups.get("reward_servers", []), retriever=False)
    problems = check_host(view, host, roles)
    if problems:
        raise RlrunError(f"inventory {inventory}: " + "; ".join(p.message for p in problems))


def _substituted(value, sample: dict[str, str]):
    if isinstance(value, str):
        return substitute(value, sample)
    if isinstance(value, dict):
        return {k: _substituted(v, sample) for k, v in value.items()}
    return value


def _check_accel_inputs(spec: NodeSpec, get) -> None:
    """The accel_env role's own input check (its tasks/main.yml), which a Slurm job cannot run."""
    extra = get("accel_env__extra") or {}
    clash = sorted(set(extra) & set(spec.accel_vars))
    if clash:
        raise RlrunError(f"accel_env__extra may not redefine {clash}, which accel_env computes")
    ifname = get("accel_env__gloo_socket_ifname")
    if ifname and re.search(r"[,^ ]", str(ifname)):
        raise RlrunError(f"accel_env__gloo_socket_ifname = {ifname}: GLOO_SOCKET_IFNAME takes one interface name")


def _refuse_placeholders(values, inventory: Path) -> None:
    for key, value in values.items():
        if isinstance(value, str) and "@@rlrun:" in value:
            raise RlrunError(f"inventory {inventory}: {key} holds '@@rlrun:', which rlrun slurm uses for its own "
                             "placeholders; remove it")


def placeholders(text: str) -> set[str]:
    return set(PLACEHOLDER_RE.findall(text))


def _unknown(text: str) -> None:
    unknown = placeholders(text) - set(RUNTIME) - set(layout().shell_names().values())
    if unknown:
        raise RlrunError(f"internal: placeholders {sorted(unknown)} have no shell variable")


def shell_word(value: str) -> str:
    """One shell word: quoted literally, or double-quoted with ${NAME} for each placeholder."""
    _unknown(value)
    if not PLACEHOLDER_RE.search(value):
        return shlex.quote(value)
    out, pos = ['"'], 0
    for m in PLACEHOLDER_RE.finditer(value):
        out.append(_dq_escape(value[pos:m.start()]))
        out.append("${" + m.group(1) + "}")
        pos = m.end()
    out.append(_dq_escape(value[pos:]))
    out.append('"')
    return "".join(out)


def _dq_escape(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


def heredoc(text: str) -> str:
    """Text for an unquoted heredoc: literal except for ${NAME} at each placeholder."""
    _unknown(text)
    out, pos = [], 0
    for m in PLACEHOLDER_RE.finditer(text):
        out.append(re.sub(r"([\\$`])", r"\\\1", text[pos:m.start()]))
        out.append("${" + m.group(1) + "}")
        pos = m.end()
    out.append(re.sub(r"([\\$`])", r"\\\1", text[pos:]))
    return "".join(out)


def substitute(value: str, values: dict[str, str]) -> str:
    """`value` with each placeholder replaced by values[NAME] (what the shell would do)."""
    return PLACEHOLDER_RE.sub(lambda m: str(values[m.group(1)]), value)
