"""The one problem recorder of the checks: a problem names the file (and line) where the value was written, the
variable as the user wrote it, the value (never a secret) and what is expected, and the hosts it concerns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlrun.inventory_view import UNKNOWN, InventoryView

NOTHING = object()  # a problem about a group or a file, not a value
HIDDEN = object()  # a secret: never shown


@dataclass
class Problem:
    """One thing wrong with the inventory."""

    file: str
    line: int | None
    variable: str
    value: Any
    expected: str
    hosts: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        on = f" (host {', '.join(self.hosts)})" if self.hosts else ""
        return f"{where}: {self.variable}{self.shown}{on}: {self.expected}"

    @property
    def shown(self) -> str:
        return "" if self.value is NOTHING else f" = {show(self.value)}"

    @property
    def message(self) -> str:
        """The problem without where it was written and on which host: what the cluster role's assert prints
        for its host."""
        return f"{self.variable}{self.shown}: {self.expected}"

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line, "variable": self.variable,
                "value": None if self.value is NOTHING else jsonable(self.value), "expected": self.expected,
                "hosts": self.hosts, "message": str(self)}


def vaulted(value: Any) -> bool:
    return "Encrypted" in type(value).__name__ or "Vault" in type(value).__name__


def show(value: Any) -> str:
    if value is UNKNOWN:
        return "(known only on the host)"
    if value is HIDDEN:
        return "(hidden)"
    if vaulted(value):
        return "(vault-encrypted)"
    if isinstance(value, str):
        return repr(str(value))
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value) if not isinstance(value, int) else str(int(value))
    return repr(jsonable(value))


def jsonable(value: Any) -> Any:
    if value is HIDDEN or value is UNKNOWN:
        return show(value)
    if vaulted(value):
        return "(vault-encrypted)"
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return str(value)


class Recorder:
    """The problems found so far, and the values the checks read (a templating problem is one problem)."""

    def __init__(self, view: InventoryView):
        self.view = view
        self.problems: list[Problem] = []

    def add(self, host: str | None, variable: str, value: Any, expected: str, where: tuple | None = None) -> None:
        file, line = where or (self.view.where(host, variable) if host else (".", None))
        for p in self.problems:  # one line for a group_vars value that is wrong on several hosts
            if (p.file, p.line, p.variable, p.expected) == (file, line, variable, expected) and \
                    show(p.value) == show(value):
                if host and host not in p.hosts:
                    p.hosts.append(host)
                return
        self.problems.append(Problem(file, line, variable, value, expected, [host] if host else []))

    def file(self, file: str, line: int | None, message: str) -> None:
        """A problem with a file as a whole (its YAML, its vault)."""
        self.problems.append(Problem(file, line, "(file)", NOTHING, message))

    def group(self, name: str, members: Any, expected: str) -> None:
        """A problem with a group of the hosts file (`members` NOTHING when the group is missing)."""
        self.add(None, name, members, expected, where=(self.view.hosts_file, None))

    def raw(self, host: str) -> dict[str, Any]:
        return self.view.raw(host)

    def value(self, host: str, var: str, default: Any = None) -> Any:
        """The resolved value; a templating problem is recorded once and gives UNKNOWN."""
        value, error = self.view.resolve(host, var, default)
        if error and value is not UNKNOWN:
            self.add(host, var, self.view.raw(host).get(var, default), error)
            return UNKNOWN
        return value

    def user_value(self, host: str, var: str) -> Any:
        """The resolved value of a variable the inventory sets, else UNKNOWN (defaults are the roles')."""
        return self.value(host, var) if var in self.view.raw(host) else UNKNOWN
