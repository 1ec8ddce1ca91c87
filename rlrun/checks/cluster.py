"""The cluster as one: each host's name, switches and tokens (:func:`check_identity`, per host), then what
every host must share with the head (:func:`check_agreement`) and what `rlrun status` will expect
(:func:`check_expected`)."""

from __future__ import annotations

import re
from typing import Any

from rlrun.checks.problems import HIDDEN, Recorder
from rlrun.checks.shapes import whole
from rlrun.checks.vocabulary import N
from rlrun.inventory_view import UNKNOWN

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
TOKEN_MIN = 32
TOKENS = ((N.token, "the cluster"), (N.reward_token, "the reward service"),
          (N.retriever_token, "the retrieval service"))


def _token(r: Recorder, host: str, var: str) -> Any:
    """The token `var` the inventory sets for `host`, UNKNOWN when it sets none or authentication is off."""
    if var not in r.raw(host) or r.value(host, N.auth_enabled, True) is False:
        return UNKNOWN
    return r.value(host, var)


def token_problem(var: str, token: Any) -> tuple[bool, str] | None:
    """What is wrong with the token `var` an inventory sets (with authentication on): (whether its value must be
    hidden, what is expected), or None. The one rule for `rlrun validate`, every play's cluster role and every
    command that reads the token (rlrun/inventory.py)."""
    what = dict(TOKENS)[var]
    if not isinstance(token, str) or not token.strip():
        return False, (f"is empty: with authentication on, {what} needs a token; leave {var} unset to generate "
                      "one, or set it from a vault")
    if re.search(r"\s", token.strip()) or token != token.strip():
        return True, "contains white space: a token is one word (64 hex characters: openssl rand -hex 32)"
    if len(token) < TOKEN_MIN:
        return True, f"is {len(token)} characters: use at least {TOKEN_MIN} (openssl rand -hex 32)"
    return None


def check_identity(r: Recorder, host: str) -> None:
    name = r.value(host, N.cluster_name, "local")
    if name is not UNKNOWN and (not isinstance(name, str) or not NAME.match(name)):
        r.add(host, N.cluster_name, name, "must be 1-40 letters, digits, '.', '_' or '-' (it is part of service "
              "names and paths)")
    node_files = r.value(host, N.node_files)
    if node_files is not UNKNOWN and node_files not in (None, "present", "absent"):
        r.add(host, N.node_files, node_files, "must be present, absent or null (a role parameter of cluster: "
              "playbooks/cluster.yml installs this host's files, teardown.yml removes them, every other play checks)")
    for var, _what in TOKENS:
        token = _token(r, host, var)
        if token is UNKNOWN:
            continue
        problem = token_problem(var, token)
        if problem:
            hidden, expected = problem
            r.add(host, var, HIDDEN if hidden else r.raw(host)[var], expected)
    cluster_token = _token(r, host, N.token)
    for var, what in TOKENS[1:]:
        token = _token(r, host, var)
        if isinstance(token, str) and token.strip() and cluster_token not in (UNKNOWN, None) and \
                token.strip() == str(cluster_token).strip():
            r.add(host, var, HIDDEN, f"is the same as {N.token}: {what} needs a token of its own (a "
                  f"{'reward' if var == N.reward_token else 'retrieval'} request must not carry one that runs code "
                  f"on the nodes); leave {var} unset to generate one, or vault another")


def _head(r: Recorder) -> str | None:
    heads = r.view.groups.get("ray_head", [])
    return heads[0] if len(heads) == 1 else None


def check_agreement(r: Recorder, members: list[str]) -> None:
    """One cluster name, one authentication mode, one token of each kind, one TLS mode: the head's."""
    head = _head(r)
    names = {h: r.value(h, N.cluster_name, "local") for h in members}
    names = {h: name for h, name in names.items() if name is not UNKNOWN}
    if head in names:
        for host, name in names.items():
            if name != names[head]:
                r.add(host, N.cluster_name, name, f"differs from the head's ({names[head]!r} on {head}): one "
                      "inventory is one cluster; a node with another name would not be managed with it")
    for var, default, what in ((N.auth_enabled, True, "a worker cannot join a cluster with another authentication "
                                "mode"),
                               (N.reward_tls, False, "jobs on every node reach the reward services one way (set it "
                                "in group_vars/all)")):
        modes = {h: r.value(h, var, default) for h in members}
        if head in modes and isinstance(modes[head], bool):
            for host, on in modes.items():
                if isinstance(on, bool) and on != modes[head]:
                    r.add(host, var, on, f"differs from the head's ({str(modes[head]).lower()}): {what}")
    for var, _what in TOKENS:
        found = {h: t for h in members if (t := _token(r, h, var)) is not UNKNOWN}
        if head in found and len({str(t) for t in found.values()}) > 1:
            for host in found:
                if found[host] != found[head]:
                    r.add(host, var, HIDDEN, "differs from the head's: every host needs the same token")


def check_expected(r: Recorder, nodes: list[str]) -> None:
    """cluster__expected_nodes / _gpus, which `rlrun status` holds the live cluster to."""
    head = _head(r)
    for var, low in ((N.expected_nodes, 1), (N.expected_gpus, 0)):
        if head is None or var not in r.raw(head):
            continue
        value = r.value(head, var)
        if value in (UNKNOWN, None):
            continue
        if not whole(value) or int(value) < low:
            r.add(head, var, r.raw(head)[var], f"must be a whole number, {low} or more (or null)")
        elif var == N.expected_nodes and int(value) > len(nodes):
            r.add(head, var, value, f"is more than the {len(nodes)} hosts of ray_cluster: `rlrun status` would "
                  "always fail")
        elif var == N.expected_gpus:
            gpus = [r.value(h, N.num_gpus) for h in nodes]
            if all(whole(g) for g in gpus) and sum(map(int, gpus)) != int(value):
                r.add(head, var, value, f"differs from the {sum(map(int, gpus))} GPUs the hosts' {N.num_gpus} add up "
                      "to: `rlrun status` would always fail (fix one, or set it to null)")
