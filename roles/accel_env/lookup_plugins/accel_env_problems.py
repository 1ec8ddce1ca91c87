"""Lookup of the accel_env role's first task: this host's problems with its accelerator env file settings, found
by rlrun's rules (rlrun/checks/accel.py: the same rules as `rlrun validate`, the validate play and the cluster
role's assert) on the values the play sees. One line per problem, each naming the variable, its value and what
is expected; none when the settings are right."""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: accel_env_problems
short_description: This host's problems with the accelerator env file settings, by rlrun's rules.
description:
  - One line per problem (variable, value, what is expected), from rlrun.checks.check_accel on the play's values.
  - Empty when there is none.
"""


def _rlrun():
    """rlrun, when ansible-playbook runs outside its venv: the checkout or the installed package above roles/."""
    try:
        import rlrun.checks  # noqa: F401
    except ImportError:
        for parent in Path(__file__).resolve().parents:
            if (parent / "rlrun" / "checks" / "__init__.py").is_file():
                sys.path.insert(0, str(parent))
                break
        else:
            raise AnsibleError(f"accel_env_problems: rlrun is not importable, nor found above {__file__}") from None


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        _rlrun()
        from rlrun.checks import check_accel
        from rlrun.inventory_view import play_view

        host = variables["inventory_hostname"]
        view = play_view(self._loader, variables["hostvars"]._inventory, host, variables)
        return [p.message for p in check_accel(view, host)]
