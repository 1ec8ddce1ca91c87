"""The one reader of the cluster contract: an inventory as a play that lists the roles sees it.

roles/cluster holds the contract (``defaults/``: what an inventory sets; ``vars/``: what is derived from it);
ray_node, accel_env and reward_server add how a node starts. A play that lists those roles sees, on each host,
the roles' defaults < the inventory's variables (group_vars, host_vars, the hosts file, vault) < the roles'
vars. :func:`open_contract` gives each host exactly that, through Ansible's own inventory, variable manager,
vault and templar, so what rlrun computes is what the roles compute, and it renders the roles' templates the
same way. rlrun/inventory.py (the CLI's view of a cluster), rlrun/inventory_view.py (the offline validation)
and rlrun/slurm/spec.py (a node start inside a Slurm job) read inventories only through here.

Where the roles are: the checkout's ``roles/`` beside ``rlrun/``, else the copy an installed wheel carries
as ``rlrun/_ansible/`` (setup.py puts ansible.cfg, site.yml, playbooks/ and roles/ there). With neither,
:func:`ansible_dir` says so in one line.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from rlrun.errors import RlrunError

_CHECKOUT = Path(__file__).resolve().parent.parent
_SHIPPED = Path(__file__).resolve().parent / "_ansible"
_MARK = Path("roles") / "cluster" / "defaults" / "main.yml"
# What a hosts file must hold, for the errors that say it is missing.
GROUPS_EXPECTED = ("the groups ray_head (one host) and ray_workers under ray_cluster, and reward_servers "
                   "(see examples/inventories/seed-2node/hosts.yml)")


def _find_ansible_dir() -> Path | None:
    for base in (_CHECKOUT, _SHIPPED):
        if (base / _MARK).is_file():
            return base
    return None


def ansible_dir() -> Path:
    """The directory that holds ansible.cfg, site.yml, playbooks/ and roles/ (the checkout, or the wheel's copy)."""
    found = _find_ansible_dir()
    if found is None:
        raise RlrunError(f"rlrun cannot find the Ansible roles it reads ({_MARK}): not in {_SHIPPED} (the copy its "
                         f"wheel ships) nor in {_CHECKOUT} (a checkout around rlrun/); reinstall rlrun from its "
                         "wheel, or run it from a checkout of the project")
    return found


# The project's Ansible tree for callers that need a path at import time (provision's playbooks): the checkout
# or the wheel's copy; ansible_dir() raises where neither exists.
ANSIBLE_DIR = _find_ansible_dir() or _CHECKOUT


def roles_dir() -> Path:
    return ansible_dir() / "roles"


def role_names() -> list[str]:
    return sorted(p.name for p in roles_dir().iterdir() if p.is_dir())


class YamlLoader(yaml.SafeLoader):
    """Plain YAML with Ansible's tags accepted (!vault, !unsafe)."""


YamlLoader.add_constructor("!vault", lambda loader, node: "<vault>")
YamlLoader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


@functools.cache
def _role_file(role: str, kind: str) -> dict[str, Any]:
    path = roles_dir() / role / kind / "main.yml"
    if not path.is_file():
        return {}
    return yaml.load(path.read_text(encoding="utf-8"), Loader=YamlLoader) or {}


def role_file(role: str, kind: str) -> dict[str, Any]:
    """roles/<role>/<kind>/main.yml (kind: defaults or vars), untemplated; {} when the role has none. Shared:
    do not change what it returns."""
    return _role_file(role, kind)


def role_files(kind: str) -> dict[str, dict[str, Any]]:
    """{role: its defaults/main.yml or vars/main.yml} for every role of the project (raw, untemplated)."""
    return {role: role_file(role, kind) for role in role_names()}


@functools.cache
def _role_specs() -> dict[str, dict[str, Any]]:
    specs: dict[str, dict[str, Any]] = {}
    for role in role_names():
        path = roles_dir() / role / "meta" / "argument_specs.yml"
        if not path.exists():
            continue
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for entry in (data.get("argument_specs") or {}).values():
            for name, spec in ((entry or {}).get("options") or {}).items():
                specs.setdefault(name, {**(spec or {}), "role": role})
    return specs


def role_specs() -> dict[str, dict[str, Any]]:
    """{variable: its option spec (type, choices, ...)} from every role's meta/argument_specs.yml (a copy)."""
    return {name: dict(spec) for name, spec in _role_specs().items()}


def trusted(value: Any) -> Any:
    """`value` with every string trusted as a template, as Ansible trusts the roles' own files in a play."""
    # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [trusted(v) for v in value]
    return value


# --- vault ----------------------------------------------------------------------------------------------
def open_vault(loader, password_file: str) -> None:
    """Give `loader` the vault secrets of `password_file` (kept when this process already has them)."""
    # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
    from ansible.cli import CLI
    from ansible.errors import AnsibleError

    try:
        secrets = CLI.setup_vault_secrets(loader, vault_ids=[], vault_password_files=[password_file])
    except RuntimeError:  # already set in this process (a second read): keep them
        return
    except AnsibleError as exc:
        raise RlrunError(f"--vault-password-file {password_file}: {' '.join(str(exc.message).split())}") from None
    for secret in secrets:
        loader.set_vault_secrets([secret])


def vault_context_active() -> bool:
    """Inside ansible-playbook (the validate play), the play's vault secrets are already set."""
    try:
        # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
        from ansible.parsing.vault import VaultSecretsContext

        context = VaultSecretsContext.current(optional=True)
        return context is not None and bool(context.secrets)
    except Exception:  # noqa: BLE001 - no such context in this ansible-core: no secrets
        return False


# --- the contract of one inventory ----------------------------------------------------------------------
class Contract:
    """Each host's variables as a play that lists `roles` (cluster first) sees them. Build it with
    :func:`open_contract`, or :meth:`from_inventory` on an inventory Ansible already holds (a play's)."""

    def __init__(self, path: Path, loader, inventory, roles: tuple[str, ...] = ("cluster",),
                 vault_open: bool = False):
        # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
        from ansible.vars.hostvars import HostVars
        from ansible.vars.manager import VariableManager

        self.path, self.loader, self.inventory, self.roles = path, loader, inventory, roles
        self.vault_open = vault_open
        self.varmgr = VariableManager(loader=loader, inventory=inventory)
        self.hostvars = HostVars(inventory=inventory, variable_manager=self.varmgr, loader=loader)
        self.groups: dict[str, list[str]] = {g: list(h) for g, h in inventory.get_groups_dict().items()}
        self.group_children = {g.name: [c.name for c in g.child_groups] for g in inventory.groups.values()}
        self.hosts: list[str] = sorted(h.name for h in inventory.get_hosts())
        self.defaults = {k: v for role in roles for k, v in trusted(role_file(role, "defaults")).items()}
        self.derived = {k: v for role in roles for k, v in trusted(role_file(role, "vars")).items()}
        self._own: dict[str, dict[str, Any]] = {}

    @classmethod
    def from_inventory(cls, loader, inventory, roles: tuple[str, ...] = ("cluster",)) -> Contract:
        sources = getattr(inventory, "_sources", None) or ["."]
        return cls(Path(sources[0]), loader, inventory, roles, vault_open=vault_context_active())

    @property
    def heads(self) -> list[str]:
        return list(self.groups.get("ray_head", []))

    def head(self) -> str:
        """The one host of ray_head (RlrunError otherwise)."""
        if len(self.heads) != 1:
            raise RlrunError(f"inventory {self.path}: group ray_head must hold exactly one host, found {self.heads}")
        return self.heads[0]

    @property
    def renamed_names(self) -> dict[str, str]:
        """roles/cluster's cluster__renamed: old name -> new name."""
        return dict(role_file("cluster", "vars").get("cluster__renamed") or {})

    def own(self, host: str) -> dict[str, Any]:
        """The host's variables from the inventory (and Ansible's magic variables), untemplated."""
        if host not in self._own:
            self._own[host] = self.varmgr.get_vars(host=self.inventory.get_host(host))
        return self._own[host]

    def renamed(self, host: str) -> dict[str, str]:
        """The old names of contract variables that the inventory still sets for `host`: old -> new."""
        own = self.own(host)
        return {old: new for old, new in self.renamed_names.items() if old in own}

    def refuse_renamed(self, host: str) -> None:
        renamed = self.renamed(host)
        if renamed:
            raise RlrunError(f"inventory {self.path}: {', '.join(renamed)} {'is' if len(renamed) == 1 else 'are'} "
                             f"set for {host}, but renamed: write {', '.join(renamed.values())} "
                             "(roles/cluster/README.md)")

    def variables(self, host: str, extra: dict | None = None) -> dict[str, Any]:
        """What a play on `host` templates with: role defaults < inventory < role vars < `extra`."""
        return {**self.defaults, **self.own(host), "hostvars": self.hostvars, **self.derived, **(extra or {})}

    def templar(self, host: str, extra: dict | None = None):
        # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
        from ansible.template import Templar

        return Templar(loader=self.loader, variables=self.variables(host, extra))

    def get(self, host: str, var: str, extra: dict | None = None) -> Any:
        """`var` on `host`, templated (AnsibleError when it cannot be; KeyError when nothing defines it)."""
        # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
        from ansible.template import Templar

        variables = self.variables(host, extra)
        return Templar(loader=self.loader, variables=variables).template(variables[var])

    def is_set(self, host: str, var: str) -> bool:
        """Whether the inventory sets `var` for `host` (not a role's default)."""
        return var in self.own(host)

    def render(self, host: str, template: str, extra: dict | None = None) -> str:
        """roles/<template> rendered for `host` as ansible.builtin.template does (trim_blocks, "\\n" lines)."""
        # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
        from ansible.template import trust_as_template

        text = (roles_dir() / template).read_text(encoding="utf-8")
        out = self.templar(host, extra).template(trust_as_template(text), escape_backslashes=False,
                                                 overrides={"trim_blocks": True, "lstrip_blocks": False,
                                                            "newline_sequence": "\n"})
        return out or ""


def empty_inventory_message(path: Path | str) -> str:
    return f"inventory {path} holds no hosts: expected {GROUPS_EXPECTED}"


def open_contract(path: str | os.PathLike, vault_password_file: str | None = None,
                  roles: tuple[str, ...] = ("cluster",), allow_empty: bool = False) -> Contract:
    """Open the inventory at `path` (a file or directory) as Ansible does, with the vault password file if given.

    RlrunError when it does not exist or holds no host (unless allow_empty); Ansible's AnsibleError when
    Ansible cannot read it (callers name the inventory).
    """
    path = Path(path)
    if not path.exists():
        raise RlrunError(f"inventory {path} does not exist (expected an Ansible inventory file or directory)")
    if not allow_empty and path.is_dir() and not any(p.is_file() and not p.name.startswith(".")
                                                     for p in path.iterdir()):
        raise RlrunError(empty_inventory_message(path))
    ansible_dir()  # the roles are needed below: say where they are missing before Ansible's own errors
    # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
    from ansible import constants as C
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader  # Ansible: heavy
    from ansible.plugins.loader import init_plugin_loader  # Ansible: heavy
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder  # Ansible: heavy

    if not any(isinstance(f, _AnsibleCollectionFinder) for f in sys.meta_path):
        init_plugin_loader()  # what ansible-playbook does first: lookups such as ansible.builtin.env resolve
    loader = DataLoader()
    if vault_password_file:
        open_vault(loader, vault_password_file)
    unparsed = C.INVENTORY_ANY_UNPARSED_IS_FAILED
    C.INVENTORY_ANY_UNPARSED_IS_FAILED = True  # a source Ansible cannot read is an error, not a warning
    try:
        inventory = InventoryManager(loader=loader, sources=[str(path)])
    finally:
        C.INVENTORY_ANY_UNPARSED_IS_FAILED = unparsed
    contract = Contract(path, loader, inventory, roles,
                        vault_open=bool(vault_password_file) or vault_context_active())
    if not contract.hosts and not allow_empty:
        raise RlrunError(empty_inventory_message(path))
    return contract
