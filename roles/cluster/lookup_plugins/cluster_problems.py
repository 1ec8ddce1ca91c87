"""Lookup of the roles' asserts: this host's problems, found by rlrun's rules (rlrun/checks/, the same rules as
`rlrun validate` and the validate play) on the values the play sees (its facts and role parameters included).
Returns one line per problem, each naming the variable, its value and what is expected; none when all is right.

Without terms, every rule about the host: the cluster role's assert, first in every play. With terms (variable
names, or a role's namespace such as ``reward_server__``), the problems of those variables only, their values as
the role sees them counted as set: what a role asserts of its own inputs (roles/reward_server, roles/python_stack),
by the same rules rather than a Jinja copy of them."""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: cluster_problems
short_description: This host's problems with the cluster contract, by rlrun's rules.
description:
  - One line per problem (variable, value, what is expected), from rlrun.checks.check_host on the play's values.
  - Empty when there is none.
  - Terms (optional) name the variables, or a role's namespace (C(reward_server__)), whose problems are wanted;
    their values as the role sees them count as set.
options:
  _terms:
    description: Variable names or namespaces (ending in C(__)); none for every rule about the host.
    required: false
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
            raise AnsibleError(f"cluster_problems: rlrun is not importable, nor found above {__file__}") from None


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        _rlrun()
        from rlrun.checks import check_host
        from rlrun.inventory_view import owned, play_view

        own = tuple(str(t) for t in terms)
        host = variables["inventory_hostname"]
        view = play_view(self._loader, variables["hostvars"]._inventory, host, variables, own)
        return [p.message for p in check_host(view, host) if not own or owned(p.variable, own)]
