"""Lookup of the validate play: `rlrun validate` (rlrun.validate.validate_inventory) on the play's inventory
sources, on the controller, while the play's hosts are worked out: before Ansible reads any host's variables
(so a YAML error in group_vars is reported with its file and line) and before anything runs on a host.
Returns the host pattern of the play (localhost); raises with every problem otherwise, which ends the run: a
missing or empty inventory is one."""

from __future__ import annotations

import sys
from pathlib import Path

from ansible import context
from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: rlrun_validate
short_description: Check the inventory offline, as `rlrun validate` does.
description:
  - Every problem of the inventory at once, each naming file, variable, value and what is expected.
  - Returns C(localhost) when there is none; fails the run with the problems otherwise.
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        project = str(Path(__file__).resolve().parents[2])
        if project not in sys.path:  # the checkout's rlrun, when ansible-playbook runs outside the venv
            sys.path.insert(0, project)
        from rlrun.errors import RlrunError
        from rlrun.validate import validate_inventory

        if context.CLIARGS.get("syntax"):
            return ["localhost"]  # --syntax-check (ansible-lint's): the playbook's syntax, not an inventory
        given = [str(s) for s in (variables or {}).get("ansible_inventory_sources", [])]
        sources = [s for s in given if Path(s).exists()]
        # A source that is not there is an error (Ansible only warns, and runs with an empty inventory).
        problems = [f"inventory {s} does not exist (expected an Ansible inventory file or directory: "
                    "ansible-playbook -i INVENTORY)" for s in given if s not in sources]
        # Several sources (molecule adds its own, which only says how to reach the hosts): the ones that
        # declare the cluster's groups are the cluster's inventory; with none, all of them, so a groupless
        # or empty inventory is told what it lacks.
        cluster = [s for s in sources if _declares_cluster(s)]
        try:
            for source in cluster or sources:
                problems += [str(p) for p in validate_inventory(source).problems]
        except RlrunError as exc:
            problems.append(str(exc))
        if problems:
            n = len(problems)
            raise AnsibleError(f"the inventory has {n} problem{'s' if n != 1 else ''}; nothing was done on any "
                               "host:\n" + "\n".join(f"- {p}" for p in problems))
        return ["localhost"]


def _declares_cluster(source: str) -> bool:
    """Whether the inventory source declares one of the groups rlrun reads (an unreadable one counts: its
    validation says what is wrong with it)."""
    from rlrun.errors import RlrunError
    from rlrun.inventory_view import read
    from rlrun.validate import GROUPS

    try:
        groups = read(source).groups
    except (RlrunError, OSError, ValueError):
        return True
    return any(g in groups for g in GROUPS)
