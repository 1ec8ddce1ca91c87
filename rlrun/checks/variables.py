"""Each variable the inventory sets for a host: its name (a role's, not a renamed or derived one, not a typo)
and its type and choices (from the roles' meta/argument_specs.yml, else the type of its default)."""

from __future__ import annotations

import difflib

from rlrun.checks import vocabulary as V
from rlrun.checks.problems import Recorder
from rlrun.checks.shapes import is_int
from rlrun.checks.vocabulary import INVENTORY_NAMES, NAMESPACES, N
from rlrun.inventory_view import UNKNOWN


def check_names(r: Recorder, host: str) -> None:
    """Variables in a role's namespace that no role knows, derived ones set by hand, renamed ones."""
    known = V.defaults() | set(V.specs()) | INVENTORY_NAMES
    renamed = V.renamed()
    for var in r.view.user_set(host):
        if var in renamed:
            r.add(host, var, r.raw(host)[var], f"was renamed: write {renamed[var]}")
        elif var in V.derived() and var not in known:
            r.add(host, var, r.raw(host)[var], "is derived from other variables (a role's vars/main.yml): set "
                  "those instead")
        elif var.startswith(NAMESPACES) and var not in known:
            close = difflib.get_close_matches(var, sorted(known), n=1, cutoff=0.8)
            hint = f"did you mean {close[0]}?" if close else "see the roles' README.md for the variables"
            r.add(host, var, r.raw(host)[var], f"is not a variable of any role: {hint}")


def check_types(r: Recorder, host: str) -> None:
    """Type and choices of every role variable the inventory sets (those with a rule of their own are left
    to it)."""
    specs, specific = V.specs(), V.specific()
    for var in r.view.user_set(host):
        spec = specs.get(var)
        if not spec or var in specific:
            continue
        raw = r.raw(host)[var]
        kind = spec.get("type", "str")
        if kind == "bool" and not isinstance(raw, bool):
            if isinstance(raw, str) and raw.strip().lower() in ("true", "false", "yes", "no", "on", "off"):
                want = raw.strip().lower() in ("true", "yes", "on")
                r.add(host, var, raw, f"is a string: write the boolean {str(want).lower()} without quotes")
            elif not (isinstance(raw, str) and "{{" in raw):
                r.add(host, var, raw, "must be a boolean: true or false")
            continue
        value = r.value(host, var)
        if value is UNKNOWN or value is None:
            continue
        if kind == "int" and (isinstance(value, bool) or not is_int(value)):
            r.add(host, var, raw, "must be a whole number")
        elif kind == "list" and not isinstance(value, list):
            r.add(host, var, raw, "must be a list, e.g. [0, 1] or one '- item' per line")
        elif kind == "dict" and not isinstance(value, dict):
            r.add(host, var, raw, "must be a mapping of name: value")
        elif kind in ("str", "path") and not isinstance(value, str):
            r.add(host, var, raw, "must be a string" + (" (quote it)" if isinstance(value, int | float) else ""))
        choices = spec.get("choices")
        if choices and value not in choices and var != N.accelerator:
            r.add(host, var, raw, f"must be one of {', '.join(map(str, choices))}")
