"""The accelerator env file's rules are written once, in rlrun/checks/accel.py (issue 37): roles/accel_env's
first task calls them through its lookup plugin, as the cluster role calls rlrun/checks through its own, and
`rlrun validate` runs them with every other rule. A role that checks one of their variables in Jinja again (an
assert's `that`, a `failed_when`) fails here, as does an accel_env assert that is not the lookup's."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from rlrun.checks.accel import VARIABLES
from tests.conftest import PROJECT

CONDITIONS = ("that", "failed_when")


def _conditions(node, found: list[str]) -> list[str]:
    """Every assert condition and failed_when of a task file (nested blocks included), as text."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in CONDITIONS:
                found += [str(v) for v in (value if isinstance(value, list) else [value])]
            _conditions(value, found)
    elif isinstance(node, list):
        for item in node:
            _conditions(item, found)
    return found


def written_again(paths: list[Path], root: Path = PROJECT) -> list[tuple[str, str, str]]:
    """(file, variable, condition) for each condition that checks one of the accel rules' variables."""
    out = []
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            for condition in _conditions(doc, []):
                for var in VARIABLES:
                    if re.search(rf"\b{var}\b", condition):
                        out.append((str(path.relative_to(root)), var, condition))
    return out


def _task_files() -> list[Path]:
    files = [p for d in ("roles", "playbooks") for p in (PROJECT / d).rglob("*.yml")
             if "tasks" in p.parts or d == "playbooks"]
    assert len(files) > 40
    return files


def test_no_role_checks_the_accel_rules_variables_in_jinja():
    assert set(VARIABLES) >= {"accel_env__rocm_version", "accel_env__gloo_socket_ifname", "accel_env__nccl_debug",
                              "accel_env__extra", "accel_env__visible_devices"}
    assert written_again(_task_files()) == []


def test_accel_envs_assert_is_the_lookup_of_the_one_rule_book():
    tasks = yaml.safe_load((PROJECT / "roles" / "accel_env" / "tasks" / "main.yml").read_text())
    asserts = [t for t in tasks if "ansible.builtin.assert" in t]
    assert len(asserts) == 1 and tasks[0] is asserts[0], "the role's first task, and its only assert"
    assert asserts[0]["ansible.builtin.assert"]["that"] == "accel_env__problems | length == 0"
    assert asserts[0]["vars"]["accel_env__problems"] == "{{ query('accel_env_problems') }}"
    plugin = (PROJECT / "roles" / "accel_env" / "lookup_plugins" / "accel_env_problems.py").read_text()
    assert "from rlrun.checks import check_accel" in plugin
    # and check_accel runs exactly the rules rlrun validate runs for a node (check_host's check_accel_env)
    checks = (PROJECT / "rlrun" / "checks" / "__init__.py").read_text()
    assert checks.count("check_accel_env(r, host)") == 2


def test_the_check_finds_a_rule_written_again(tmp_path):
    # The role's assert as it was before issue 37: the ROCm rule in Jinja. The scan must see it.
    planted = tmp_path / "roles" / "x" / "tasks" / "main.yml"
    planted.parent.mkdir(parents=True)
    planted.write_text("- name: Check\n  block:\n    - ansible.builtin.assert:\n        that:\n"
                       "          - cluster__accelerator == 'amd' or accel_env__rocm_version is none\n")
    assert written_again([planted], tmp_path) == [
        ("roles/x/tasks/main.yml", "accel_env__rocm_version",
         "cluster__accelerator == 'amd' or accel_env__rocm_version is none")]
