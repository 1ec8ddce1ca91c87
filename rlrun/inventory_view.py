"""An inventory as `rlrun validate` sees it, offline: every file parsed (YAML errors with file and line),
the groups, each host's variables as the user wrote them and where (file:line), and each host's value of any
variable resolved the way a play would (role defaults < inventory < role vars), without touching a host.

Ansible reads the inventory (its own InventoryManager and VariableManager, so group_vars, host_vars,
precedence and vault behave exactly as in `ansible-playbook`); this module only adds the bookkeeping a
validator needs. Facts (``ansible_env``, ``ansible_user_id``) do not exist offline: a value that needs one
is reported as unknown, never guessed, except ``ansible_user_id`` in socket-path lengths (see validate.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PROJECT_DIR = Path(__file__).resolve().parent.parent
ROLES_DIR = PROJECT_DIR / "roles"
UNKNOWN = object()  # a value that needs facts (or something else that only exists on a host)
# Variables that exist only while a play runs: a value built from one is not known offline.
PLAY_VARS = {"role_path", "role_name", "playbook_dir", "play_hosts", "ansible_play_hosts", "ansible_play_batch",
             "ansible_play_name", "ansible_role_names", "ansible_parent_role_names", "ansible_run_tags",
             "ansible_skip_tags", "ansible_check_mode", "ansible_loop", "item", "hostvars"}
# Lookups with side effects (write files, run commands, use the network): never run by a validation.
BLOCKED_LOOKUPS = {"password", "pipe", "url", "lines", "together_with_side_effects"}


class _BlockedLookup(Exception):
    pass


@contextlib.contextmanager
def offline_lookups():
    """Within: lookups with side effects fail (as _BlockedLookup) instead of running."""
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
class Found:
    """A variable the user set: where (file, line) and the value as written (a template stays a template)."""

    file: str
    line: int | None
    value: Any


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


class _Loader(yaml.SafeLoader):
    """Plain YAML with Ansible's tags accepted (!vault, !unsafe), for line numbers and syntax errors only."""


_Loader.add_constructor("!vault", lambda loader, node: "<vault>")
_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


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
            node = yaml.compose(text, Loader=_Loader)
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


def role_files(kind: str) -> dict[str, dict[str, Any]]:
    """{role: its defaults/main.yml or vars/main.yml} for every role of the project (raw, untemplated)."""
    out = {}
    for role in sorted(p.name for p in ROLES_DIR.iterdir() if p.is_dir()):
        path = ROLES_DIR / role / kind / "main.yml"
        if path.exists():
            out[role] = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader) or {}
    return out


def role_specs() -> dict[str, dict[str, Any]]:
    """{variable: its option spec (type, choices, ...)} from every role's meta/argument_specs.yml."""
    specs = {}
    for role in sorted(p.name for p in ROLES_DIR.iterdir() if p.is_dir()):
        path = ROLES_DIR / role / "meta" / "argument_specs.yml"
        if not path.exists():
            continue
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for entry in (data.get("argument_specs") or {}).values():
            for name, spec in ((entry or {}).get("options") or {}).items():
                specs.setdefault(name, {**(spec or {}), "role": role})
    return specs


@dataclass
class InventoryView:
    """What an inventory says, read offline. Build it with :func:`read`."""

    path: Path
    root: Path  # the directory file names are relative to
    groups: dict[str, list[str]] = field(default_factory=dict)
    group_children: dict[str, list[str]] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)
    file_problems: list[FileProblem] = field(default_factory=list)
    vaulted_files: set[str] = field(default_factory=set)
    index: dict = field(default_factory=dict)
    vault_open: bool = False
    _inventory: Any = None
    _varmgr: Any = None
    _loader: Any = None
    _raw: dict[str, dict[str, Any]] = field(default_factory=dict)
    _defaults: dict[str, Any] = field(default_factory=dict)
    _derived: dict[str, Any] = field(default_factory=dict)

    # --- what the user wrote --------------------------------------------------------------------------
    def raw(self, host: str) -> dict[str, Any]:
        """The host's variables from the inventory (group_vars, host_vars, hosts file), untemplated."""
        if host not in self._raw:
            own = self._varmgr.get_vars(host=self._inventory.get_host(host))
            self._raw[host] = own
        return self._raw[host]

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
    def resolve(self, host: str, var: str, default: Any = None) -> tuple[Any, str | None]:
        """(value, None) as a play on `host` would see it, (UNKNOWN, why) when it needs facts, or
        (None, error) when it cannot be templated (an undefined variable, a vaulted value without password,
        a template error)."""
        from ansible.errors import AnsibleError, AnsibleUndefinedVariable
        from ansible.template import Templar

        raw = self.raw(host)
        variables = {**self._defaults, **raw, **self._derived}
        if var not in variables:
            return default, None
        templar = Templar(loader=self._loader, variables=variables)
        try:
            with offline_lookups():
                return templar.template(variables[var]), None
        except AnsibleUndefinedVariable as exc:
            text = " ".join(str(exc).split())
            missing = re.findall(r"'([A-Za-z_][A-Za-z0-9_]*)' is undefined", text)
            if any(m.startswith("ansible_") or m in PLAY_VARS for m in missing):
                return UNKNOWN, f"needs {', '.join(missing)} (known only on the host or in a play)"
            return None, f"refers to {', '.join(repr(m) for m in missing) or 'an undefined variable'}, which is not defined"
        except AnsibleError as exc:
            from rlrun.errors import is_vault_error

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
    """Read `path` (an inventory directory or file) offline."""
    from rlrun.errors import RlrunError

    path = Path(path)
    if not path.exists():
        raise RlrunError(f"inventory {path} does not exist (expected an Ansible inventory file or directory)")
    root = path if path.is_dir() else path.parent
    view = InventoryView(path=path, root=root)
    view.index, view.file_problems, view.vaulted_files = parse_files(path)
    if view.file_problems:
        return view  # Ansible would stop at the first of them; report them all, with lines
    from ansible import constants as C
    from ansible.inventory.manager import InventoryManager
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

    if not any(isinstance(f, _AnsibleCollectionFinder) for f in sys.meta_path):
        init_plugin_loader()  # what ansible-playbook does first: lookups such as ansible.builtin.env resolve
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    if vault_password_file:
        _open_vault(loader, vault_password_file)
        view.vault_open = True
    else:
        view.vault_open = _vault_context_active()
    unparsed = C.INVENTORY_ANY_UNPARSED_IS_FAILED
    C.INVENTORY_ANY_UNPARSED_IS_FAILED = True  # a source Ansible cannot read is an error, not a warning
    try:
        inv = InventoryManager(loader=loader, sources=[str(path)])
    except Exception as exc:  # noqa: BLE001 - Ansible's parse errors: one problem naming the file
        text = " ".join(str(getattr(exc, "message", exc)).split())
        view.file_problems.append(FileProblem(_rel(path, root) if path.is_file() else ".", None,
                                              f"is not an inventory Ansible can read: {text[:400]}"))
        return view
    finally:
        C.INVENTORY_ANY_UNPARSED_IS_FAILED = unparsed
    view._inventory, view._loader = inv, loader
    view._varmgr = VariableManager(loader=loader, inventory=inv)
    view.groups = {g: list(h) for g, h in inv.get_groups_dict().items()}
    view.group_children = {g.name: [c.name for c in g.child_groups] for g in inv.groups.values()}
    view.hosts = sorted(h.name for h in inv.get_hosts())
    from ansible.template import trust_as_template

    def trusted(data: dict) -> dict:
        return {k: trust_as_template(v) if isinstance(v, str) else v for k, v in data.items()}

    for values in role_files("defaults").values():
        view._defaults.update(trusted(values))
    for values in role_files("vars").values():
        view._derived.update(trusted(values))
    return view


def _vault_context_active() -> bool:
    """Inside ansible-playbook (the validate play), the play's vault secrets are already set."""
    try:
        from ansible.parsing.vault import VaultSecretsContext

        context = VaultSecretsContext.current(optional=True)
        return context is not None and bool(context.secrets)
    except Exception:  # noqa: BLE001
        return False


def _open_vault(loader, password_file: str) -> None:
    from ansible.cli import CLI
    from ansible.errors import AnsibleError

    from rlrun.errors import RlrunError

    try:
        secrets = CLI.setup_vault_secrets(loader, vault_ids=[], vault_password_files=[password_file])
    except RuntimeError:  # already set in this process (a second read): keep them
        return
    except AnsibleError as exc:
        raise RlrunError(f"--vault-password-file {password_file}: {' '.join(str(exc.message).split())}") from None
    for secret in secrets:
        loader.set_vault_secrets([secret])
