"""`rlrun validate` and the first play of site.yml: everything that can be known about an inventory without
touching a host, checked at once.

One implementation for both: the CLI calls :func:`validate_inventory`; the validate play's lookup
(playbooks/lookup_plugins/rlrun_validate.py) calls the same function on the play's inventory sources. The
rules themselves are rlrun/checks/ (the cluster role's assert runs the same per-host rules in every play).
Every problem names the file (and line) where the value was written, the variable as the user wrote it, the
value, and what is expected: ``FILE:LINE: VARIABLE = VALUE (host H): what is expected``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rlrun.checks import check_inventory
from rlrun.checks.paths import TEMP_DIR_MAX
from rlrun.checks.problems import Problem
from rlrun.checks.vocabulary import GROUPS, N
from rlrun.inventory_view import read

__all__ = ["GROUPS", "N", "TEMP_DIR_MAX", "Problem", "Report", "validate_inventory"]


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    cluster_name: str | None = None


def validate_inventory(path: str | Path, vault_password_file: str | None = None) -> Report:
    """Every problem of the inventory at `path`, found offline. The CLI and the validate play both call this."""
    view = read(path, vault_password_file)
    g = view.groups
    report = Report(problems=check_inventory(view),
                    hosts=sorted(set(g.get("ray_cluster", [])) | set(g.get("reward_servers", []))
                                 | set(g.get("retrievers", []))))
    heads = g.get("ray_head", [])
    if len(heads) == 1 and not view.file_problems and (view.vault_open or not view.vaulted_files):
        name = view.resolve(heads[0], N.cluster_name, "local")[0]
        report.cluster_name = name if isinstance(name, str) else None
    return report
