"""An inventory as the checks see it (rlrun/checks/): every file parsed (YAML errors with file and line), the
groups, each host's variables as the user wrote them and where (file:line), and each host's value of any
variable resolved the way a play would (role defaults < inventory < role vars), without touching a host.

rlrun/contract.py reads the inventory (Ansible's own inventory, variable manager and vault, so group_vars,
host_vars, precedence and vault behave exactly as in `ansible-playbook`); this module only adds the
bookkeeping a validator needs. Facts (``ansible_env``, ``ansible_user_id``) do not exist offline: a value that
needs one is reported as unknown, never guessed, except ``ansible_user_id`` in socket-path lengths (see
rlrun/checks/paths.py). Inside a play (the cluster role's assert) the same view holds the play's variables
for the host it checks: :func:`play_view`.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlrun.contract import GROUPS_EXPECTED, Contract, YamlLoader, open_contract, role_files, role_names
from rlrun.errors import RlrunError, is_vault_error

UNKNOWN = object()  # a value that needs facts (or something else that only exists on a host)
# Variables that exist only while a play runs: a value built from one is not known offline.
PLAY_VARS = {"role_path", "role_name", "playbook_dir", "play_hosts", "ansible_play_hosts", "ansible_play_batch",
             "ansible_play_name", "ansible_role_names", "ansible_parent_role_names", "ansible_run_tags",
             "ansible_skip_tags", "ansible_check_mode", "ansible_loop", "item", "hostvars",
             # set by the inventory for its own hosts only: a play on the implicit localhost (the report plays) has
             # neither, and there they mean nothing the controller-side checks would use
             "inventory_dir", "inventory_file"}
# Lookups with side effects (write files, run commands, use the network): never run by a validation.
BLOCKED_LOOKUPS = {"password", "pipe", "url", "lines", "together_with_side_effects"}


class _BlockedLookup(Exception):
    pass


@contextlib.contextmanager
def offline_lookups():
    """Within: lookups with side effects fail (as _BlockedLookup) instead of running."""
    # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
    from ansible.plugins.loader import lookup_loader

    original = lookup_loader.get

    def get(name, *args, **kwargs):
        if str(name).rsplit(".", 1)[-1] in BLOCKED_LOOKUPS:
            raise _BlockedLookup(str(name))
        return original(name, *args, **kwargs)

    lookup_loader.get = get
    try:
        yield
    finally:
        del lookup_loader.get


def _blocked(exc: BaseException) -> str | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, _BlockedLookup):
            return str(exc)
        exc = exc.__cause__ or exc.__context__
    return None


@dataclass
class FileProblem:
    file: str
    line: int | None
    message: str


def _rel(path: str | os.PathLike, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def _yaml_files(root: Path) -> list[Path]:
    """The files Ansible reads for an inventory directory (or the one file)."""
    if root.is_file():
        return [root]
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).parts
        if path.is_dir() or any(p.startswith(".") for p in rel):
            continue
        if (rel[0] in ("group_vars", "host_vars") or len(rel) == 1) and \
                path.suffix in (".yml", ".yaml", ".json", "") and not path.name.endswith("~"):
            out.append(path)
    return out


def parse_files(root: Path) -> tuple[dict[tuple[str, str, str], tuple[str, int]], list[FileProblem], set[str]]:
    """Parse every inventory file with line numbers: ({(scope, name, var): (file, line)}, YAML problems,
    files that are vault-encrypted as a whole). scope is 'host' or 'group'."""
    index: dict[tuple[str, str, str], tuple[str, int]] = {}
    problems: list[FileProblem] = []
    vaulted: set[str] = set()
    base = root if root.is_dir() else root.parent
    for path in _yaml_files(root):
        rel = _rel(path, base)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(FileProblem(rel, None, f"cannot be read: {exc}"))
            continue
        if text.startswith("$ANSIBLE_VAULT"):
            vaulted.add(rel)
            continue
        if path.suffix == "" and path.parent == base and not text.lstrip().startswith(("---", "all:", "{")):
            continue  # an INI inventory: Ansible's own parser reports its problems
        try:
            node = yaml.compose(text, Loader=YamlLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
            line = mark.line + 1 if mark else None
            col = f", column {mark.column + 1}" if mark else ""
            what = " ".join(str(getattr(exc, "problem", None) or exc).split())
            if "'\\t'" in what:
                what = "a tab: YAML indents with spaces only"
            problems.append(FileProblem(rel, line, f"is not valid YAML (line {line}{col}: {what})"))
            continue
        if node is None:
            continue
        parts = path.relative_to(base).parts if root.is_dir() else (path.name,)
        if parts[0] in ("group_vars", "host_vars"):
            scope = "group" if parts[0] == "group_vars" else "host"
            name = parts[1].split(".")[0] if len(parts) == 2 else parts[1]
            if isinstance(node, yaml.MappingNode):
                for key, _value in node.value:
                    index.setdefault((scope, name, str(key.value)), (rel, key.start_mark.line + 1))
            else:
                problems.append(FileProblem(rel, node.start_mark.line + 1,
                                            "must be a mapping of variable: value (it is a "
                                            f"{node.tag.rsplit(':', 1)[-1]})"))
        else:
            _index_hosts_file(node, rel, index, problems)
    return index, problems, vaulted


def _index_hosts_file(node, rel: str, index: dict, problems: list[FileProblem]) -> None:
    """Walk a YAML inventory: groups with hosts / vars / children."""
    if not isinstance(node, yaml.MappingNode):
        problems.append(FileProblem(rel, node.start_mark.line + 1,
                                    "must be a mapping of groups (all: children: ...), e.g. "
                                    "examples/inventories/seed-2node/hosts.yml"))
        return

    def group(gname: str, gnode) -> None:
        if gnode is None or (isinstance(gnode, yaml.ScalarNode) and gnode.value in ("", "~", "null")):
            return
        if not isinstance(gnode, yaml.MappingNode):
            problems.append(FileProblem(rel, gnode.start_mark.line + 1,
                                        f"group {gname} must be a mapping with hosts:, vars: or children:"))
            return
        for key, value in gnode.value:
            if key.value == "hosts" and isinstance(value, yaml.MappingNode):
                for hkey, hvalue in value.value:
                    if isinstance(hvalue, yaml.MappingNode):
                        for vkey, _v in hvalue.value:
                            index.setdefault(("host", str(hkey.value), str(vkey.value)),
                                             (rel, vkey.start_mark.line + 1))
            elif key.value == "hosts" and isinstance(value, yaml.SequenceNode):
                problems.append(FileProblem(rel, value.start_mark.line + 1,
                                            f"group {gname}: hosts must be a mapping (host: or host: {{vars}}), "
                                            "not a list (- host)"))
            elif key.value == "vars" and isinstance(value, yaml.MappingNode):
                for vkey, _v in value.value:
                    index.setdefault(("group", gname, str(vkey.value)), (rel, vkey.start_mark.line + 1))
            elif key.value == "children" and isinstance(value, yaml.MappingNode):
                for ckey, cvalue in value.value:
                    group(str(ckey.value), cvalue)
            elif key.value not in ("hosts", "vars", "children"):
                problems.append(FileProblem(rel, key.start_mark.line + 1,
                                            f"group {gname}: '{key.value}' is not hosts, vars or children "
                                            f"(a group or host at the wrong indentation?)"))

    for key, value in node.value:
        group(str(key.value), value)


@dataclass
class InventoryView:
    """What an inventory says: read offline with :func:`read`, or inside a play with :func:`play_view`."""

    path: Path
    root: Path  # the directory file names are relative to
    contract: Contract | None = None  # None when a file could not be parsed (file_problems says why)
    file_problems: list[FileProblem] = field(default_factory=list)
    vaulted_files: set[str] = field(default_factory=set)
    index: dict = field(default_factory=dict)
    # host -> the play's variables (role defaults and vars, the inventory, role parameters, facts): inside a
    # play, a value on that host is resolved with them instead of the contract's.
    play_vars: dict[str, Any] = field(default_factory=dict)
    # host -> variables of a role's own that count as set there, whatever set them (the role's defaults, role
    # parameters, play vars): what a role's assert checks of its inputs (:func:`play_view`'s ``own``).
    play_set: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def groups(self) -> dict[str, list[str]]:
        return self.contract.groups if self.contract else {}

    @property
    def group_children(self) -> dict[str, list[str]]:
        return self.contract.group_children if self.contract else {}

    @property
    def hosts(self) -> list[str]:
        return self.contract.hosts if self.contract else []

    @property
    def vault_open(self) -> bool:
        return bool(self.contract and self.contract.vault_open)

    @property
    def hosts_file(self) -> str:
        """The file the groups are written in (relative to root), for problems about the groups."""
        if self.path.is_file():
            return self.path.name
        for name in ("hosts.yml", "hosts.yaml", "hosts", "inventory.yml"):
            if (self.root / name).exists():
                return name
        return "."

    # --- what the user wrote --------------------------------------------------------------------------
    def raw(self, host: str) -> dict[str, Any]:
        """The host's variables from the inventory (group_vars, host_vars, hosts file), untemplated; in a role's
        view (``play_set``), the role's own variables as the play gives them too."""
        own = self.contract.own(host)
        return {**own, **self.play_set[host]} if self.play_set.get(host) else own

    def user_set(self, host: str) -> list[str]:
        """Names of the variables the inventory sets for `host` (not Ansible's magic ones)."""
        groups = set(self.groups_of(host)) | {"all"}
        names = {var for (scope, name, var) in self.index
                 if (scope == "host" and name == host) or (scope == "group" and name in groups)}
        raw = self.raw(host)
        names |= {k for k in raw if "__" in k and not k.startswith("ansible_")}
        return sorted(n for n in names if n in raw)

    def groups_of(self, host: str) -> list[str]:
        return [g for g, members in self.groups.items() if host in members]

    def where(self, host: str, var: str) -> tuple[str, int | None]:
        """(file, line) of the definition of `var` that applies to `host`."""
        try:
            # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
            from ansible._internal._datatag._tags import Origin

            origin = Origin.get_tag(self.raw(host).get(var))
        except Exception:  # noqa: BLE001 - no origin: fall back to the index
            origin = None
        if origin is not None and origin.path:
            return _rel(origin.path, self.root), origin.line_num
        keys = [("host", host, var)]
        depth = {g: self._depth(g) for g in self.groups_of(host)}
        keys += [("group", g, var) for g in sorted(depth, key=lambda g: -depth[g])]
        keys.append(("group", "all", var))
        for key in keys:
            if key in self.index:
                return self.index[key]
        return _rel(self.path, self.root) if self.path.is_file() else ".", None

    def _depth(self, group: str) -> int:
        parents = [p for p, kids in self.group_children.items() if group in kids]
        return 0 if group == "all" or not parents else 1 + max(self._depth(p) for p in parents)

    # --- what a play would see -----------------------------------------------------------------------
    def resolve(self, host: str, var: str, default: Any = None, extra: dict | None = None) -> tuple[Any, str | None]:
        """(value, None) as a play on `host` would see it (with `extra` on top), (UNKNOWN, why) when it needs
        facts, or (None, error) when it cannot be templated (an undefined variable, a vaulted value without
        password, a template error)."""
        # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
        from ansible.errors import AnsibleError, AnsibleUndefinedVariable
        from ansible.template import Templar

        if host in self.play_vars:
            variables = {**self.play_vars[host], **(extra or {})}
        else:
            variables = self.contract.variables(host, extra)
        if var not in variables:
            return default, None
        templar = Templar(loader=self.contract.loader, variables=variables)
        try:
            with offline_lookups():
                return templar.template(variables[var]), None
        except AnsibleUndefinedVariable as exc:
            text = " ".join(str(exc).split())
            missing = re.findall(r"'([A-Za-z_][A-Za-z0-9_]*)' is undefined", text)
            if any(m.startswith("ansible_") or m in PLAY_VARS for m in missing):
                return UNKNOWN, f"needs {', '.join(missing)} (known only on the host or in a play)"
            defaults = {name for d in role_files("defaults").values() for name in (d or {})}
            if missing and all(m in defaults for m in missing):  # another role's default: set when it runs
                return UNKNOWN, f"refers to {', '.join(missing)}, a role's default known when that role runs"
            return None, f"refers to {', '.join(repr(m) for m in missing) or 'an undefined variable'}, which is not defined"
        except AnsibleError as exc:

            if _blocked(exc):
                return UNKNOWN, f"uses the {_blocked(exc)} lookup, which a validation does not run"
            if is_vault_error(exc):
                if self.vault_open:
                    return None, "is vault-encrypted, and the vault password given does not open it"
                return None, ("is vault-encrypted: pass --vault-password-file FILE (or ANSIBLE_VAULT_PASSWORD_FILE), "
                              "as ansible-playbook needs it too")
            text = " ".join(str(getattr(exc, "message", exc)).split())
            return None, f"cannot be templated: {text[:200]}"


def read(path: str | os.PathLike, vault_password_file: str | None = None) -> InventoryView:
    """Read `path` (an inventory directory or file) offline. An empty inventory reads as one without groups
    (the checks say what it lacks); a missing one is an RlrunError."""
    # Ansible is heavy (~0.5 s): imported only where an inventory or template is read
    from ansible.errors import AnsibleError


    path = Path(path)
    if not path.exists():
        raise RlrunError(f"inventory {path} does not exist (expected an Ansible inventory file or directory)")
    root = path if path.is_dir() else path.parent
    view = InventoryView(path=path, root=root)
    view.index, view.file_problems, view.vaulted_files = parse_files(path)
    if path.is_dir() and not any(p.is_file() and not p.name.startswith(".") for p in path.iterdir()):
        view.file_problems.append(FileProblem(".", None, f"holds no hosts file: expected one (hosts.yml) with "
                                              f"{GROUPS_EXPECTED}"))
    if view.file_problems:
        return view  # Ansible would stop at the first of them; report them all, with lines
    try:
        view.contract = open_contract(path, vault_password_file, roles=tuple(role_names()), allow_empty=True)
    except AnsibleError as exc:  # Ansible's parse errors: one problem naming the file
        text = " ".join(str(getattr(exc, "message", exc)).split())
        view.file_problems.append(FileProblem(_rel(path, root) if path.is_file() else ".", None,
                                              f"is not an inventory Ansible can read: {text[:400]}"))
    return view


def play_view(loader, inventory, host: str, variables: dict[str, Any], own: tuple[str, ...] = ()) -> InventoryView:
    """The view inside a play, for the checks of `host` (the cluster role's lookup_plugins/cluster_problems.py):
    the play's inventory, and `host`'s values as the play resolves them (`variables`: its facts included).

    `own`: names or prefixes (``reward_server__``) of variables a role checks as its inputs: those of them the
    roles know (defaults, argument specs) count as set with the play's values, wherever the play took them from
    (the inventory, the role's defaults, role parameters), so that the rules check what the role will use."""
    from rlrun.checks.vocabulary import defaults, specs  # the checks read this module: imported when used

    contract = Contract.from_inventory(loader, inventory, roles=tuple(role_names()))
    root = contract.path if contract.path.is_dir() else contract.path.parent
    known = defaults() | set(specs())
    mine = {var: value for var, value in variables.items() if var in known and owned(var, own)} if own else {}
    return InventoryView(path=contract.path, root=root, contract=contract, play_vars={host: variables},
                         play_set={host: mine} if mine else {})


def owned(var: str, own: tuple[str, ...]) -> bool:
    """Whether `var` is one of `own`: a name, or a prefix ending in ``__`` (a role's namespace)."""
    return any(var == name or (name.endswith("__") and var.startswith(name)) for name in own)
