"""What rlrun needs to know about a cluster, read from its Ansible inventory.

The inventory is the hand-over document: rlrun reads it through the one reader of
the cluster contract (rlrun/contract.py: Ansible's own inventory, vault and
templar, under the cluster role's defaults/ and vars/ and nothing else), so the
dashboard URL, the token's location, the reward URLs and the retrieval services'
URLs are the very expressions the roles use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rlrun.checks.cluster import token_problem
from rlrun.checks.problems import show
from rlrun.contract import ANSIBLE_DIR, open_contract
from rlrun.errors import RlrunError, is_vault_error, vault_message

# The project's Ansible tree (rlrun/contract.py finds it: a checkout, or the copy a wheel ships); provision.py
# runs its playbooks from there.
PROJECT_DIR = ANSIBLE_DIR


@dataclass
class Cluster:
    """A cluster as described by an inventory."""

    name: str
    inventory: Path
    head: str
    dashboard_url: str
    auth_enabled: bool
    nodes: list[str] = field(default_factory=list)
    token_store: Path | None = None
    explicit_token: str | None = None
    reward_urls: list[str] = field(default_factory=list)
    reward_hosts: list[str] = field(default_factory=list)
    # What `rlrun status` holds the live cluster to: each host's address and GPUs (None = not pinned),
    # and the totals the inventory expects (cluster__expected_nodes / cluster__expected_gpus; None = derive).
    node_addresses: dict[str, str] = field(default_factory=dict)
    node_gpus: dict[str, float | None] = field(default_factory=dict)
    node_cpus: dict[str, float | None] = field(default_factory=dict)
    expected_nodes: int | None = None
    expected_gpus: float | None = None
    reward_token_store: Path | None = None
    explicit_reward_token: str | None = None
    reward_ca: Path | None = None  # the reward service's CA certificate (cluster__reward_tls), else None
    # The retrieval services (group retrievers, or every Ray node by default): each host's URL, the URL a
    # job uses (its own node's, `{node_ip}` left for the trainer) and the Ray nodes without one.
    retriever_hosts: list[str] = field(default_factory=list)
    retriever_urls: dict[str, str] = field(default_factory=dict)
    retriever_job_url: str | None = None

    @property
    def token(self) -> str | None:
        """The cluster token: the inventory's value (e.g. from a vault), else the
        controller's token file written by the first `rlrun up`."""
        return self._token(self.explicit_token, self.token_store, "cluster token", "cluster__token")

    @property
    def reward_token(self) -> str | None:
        """The reward service's own token (not the cluster token): the inventory's value, else
        the controller's file written by the first `rlrun up`; None when auth is off."""
        return self._token(self.explicit_reward_token, self.reward_token_store, "reward token",
                           "cluster__reward_token")

    def _token(self, explicit: str | None, store: Path | None, what: str, var: str) -> str | None:
        if not self.auth_enabled:
            return None
        if explicit:
            return explicit
        assert store is not None
        try:
            return store.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            raise RlrunError(f"no {what} at {store}: the cluster described by {self.inventory} has not been "
                             f"provisioned from this controller (run `rlrun up`), or set {var} in the inventory") from None
        except OSError as exc:
            raise RlrunError(f"cannot read the {what} {store}: {exc.strerror}") from None


def _explicit_token(inventory: Path, var: str, value) -> str:
    """The token the inventory sets, refused in one line by the rule `rlrun validate` applies (an empty token
    would otherwise reach the cluster as no token at all)."""
    problem = token_problem(var, value)
    if problem:
        hidden, expected = problem
        shown = "" if hidden else f" = {show(value)}"
        raise RlrunError(f"inventory {inventory}: {var}{shown}: {expected} (`rlrun validate` names the file and "
                         "line)")
    return value


def default_inventory() -> Path:
    """$RLRUN_INVENTORY, else ./inventory, else the project's embedded inventory."""
    env = os.environ.get("RLRUN_INVENTORY")
    if env:
        return Path(env)
    local = Path.cwd() / "inventory"
    return local if local.exists() else PROJECT_DIR / "inventory"


def load_cluster(inventory: str | os.PathLike | None = None, vault_password_file: str | None = None) -> Cluster:
    """Read the cluster from `inventory` (a file or directory). Errors name the path and the problem."""
    inv_path = Path(inventory) if inventory else default_inventory()
    if not inv_path.exists():
        raise RlrunError(f"inventory {inv_path} does not exist (expected an Ansible inventory file or directory; "
                         "pass --inventory or set RLRUN_INVENTORY)")
    # Ansible imports are slow (~0.5 s): keep them out of `rlrun --help`.
    from ansible.errors import AnsibleError

    try:
        contract = open_contract(inv_path, vault_password_file)
        head = contract.head()

        def get(var: str, host: str = head):
            contract.refuse_renamed(host)
            return contract.get(host, var)

        auth = bool(get("cluster__auth_enabled"))
        cluster = Cluster(
            name=str(get("cluster__name")),
            inventory=inv_path,
            head=head,
            # The cluster role's own definition, so rlrun and the nodes agree by construction.
            dashboard_url=str(get("cluster__dashboard_url")),
            auth_enabled=auth,
            nodes=sorted(contract.groups.get("ray_cluster", [])),
        )
        if auth:
            if contract.is_set(head, "cluster__token"):
                cluster.explicit_token = _explicit_token(inv_path, "cluster__token", get("cluster__token"))
            else:
                cluster.token_store = Path(get("cluster__token_store"))
            if contract.is_set(head, "cluster__reward_token"):
                cluster.explicit_reward_token = _explicit_token(inv_path, "cluster__reward_token",
                                                                get("cluster__reward_token"))
            else:
                cluster.reward_token_store = Path(get("cluster__reward_token_store"))
        if bool(get("cluster__reward_tls")):
            cluster.reward_ca = Path(get("cluster__reward_ca_store"))
        cluster.reward_hosts = sorted(contract.groups.get("reward_servers", []))
        cluster.reward_urls = [str(get("cluster__reward_url", h)) for h in cluster.reward_hosts]
        cluster.retriever_hosts = sorted(get("cluster__retriever_hosts"))
        cluster.retriever_urls = {h: str(get("cluster__retriever_url", h)) for h in cluster.retriever_hosts}
        if cluster.retriever_hosts:
            cluster.retriever_job_url = str(get("cluster__retriever_job_url", cluster.retriever_hosts[0]))
        for name in cluster.nodes:
            cluster.node_addresses[name] = str(get("cluster__node_address", name))
            for var, into in (("ray_node__num_gpus", cluster.node_gpus), ("ray_node__num_cpus", cluster.node_cpus)):
                value = get(var, name) if contract.is_set(name, var) else None
                into[name] = None if value in (None, "") else float(value)
        own = contract.own(head)
        if own.get("cluster__expected_nodes") not in (None, ""):
            cluster.expected_nodes = int(get("cluster__expected_nodes"))
        if own.get("cluster__expected_gpus") not in (None, ""):
            cluster.expected_gpus = float(get("cluster__expected_gpus"))
        return cluster
    except AnsibleError as exc:

        if is_vault_error(exc):
            raise RlrunError(f"inventory {inv_path}: {vault_message(vault_password_file)}") from None
        raise RlrunError(f"inventory {inv_path}: {' '.join(str(exc.message).split())}") from None
    except (ValueError, TypeError) as exc:
        raise RlrunError(f"inventory {inv_path}: {exc} (`rlrun validate` names the variable)") from None
