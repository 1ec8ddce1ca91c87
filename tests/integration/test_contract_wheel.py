"""An rlrun installed from its wheel, away from any checkout, finds the roles it reads (the wheel ships the
Ansible tree as rlrun/_ansible): it reads an inventory's cluster, validates it, and the shipped playbooks and
roles run their checks with the installed rlrun. Without that tree it says in one line what is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import BIN, PROJECT, ansible_env, write_inventory

pytestmark = pytest.mark.integration

SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "ansible.cfg", "site.yml", "playbooks", "roles",
           "rlrun", "trainer")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel, built from a copy of the sources (the checkout's build/ is left alone), installed into a
    directory of its own."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    for name in SOURCES:
        if (PROJECT / name).is_dir():
            shutil.copytree(PROJECT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", ".secrets"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(PROJECT / name, src / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(src)],
                   check=True, timeout=300, capture_output=True)
    wheel = next((root / "dist").glob("rlrun-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(root / "site"), str(wheel)], check=True,
                   timeout=300, capture_output=True)
    return root


def _run(installed, *argv, cwd=None, env_extra=None):
    """`argv` with the installed rlrun first on the path (ahead of the checkout's editable install)."""
    env = {**ansible_env(), "PYTHONPATH": str(installed / "site"), **(env_extra or {})}
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=300, env=env,
                          cwd=cwd or installed)


def test_the_installed_rlrun_reads_and_validates_an_inventory_with_its_own_roles(installed):
    probe = ("import rlrun, rlrun.contract as c; from rlrun.inventory import load_cluster; "
             f"cl = load_cluster({str(PROJECT / 'examples' / 'inventories' / 'seed-2node')!r}); "
             "print(rlrun.__file__, c.ansible_dir(), cl.dashboard_url, cl.nodes)")
    result = _run(installed, sys.executable, "-c", probe)
    assert result.returncode == 0, result.stderr
    site = installed / "site"
    assert result.stdout.split() == [str(site / "rlrun" / "__init__.py"), str(site / "rlrun" / "_ansible"),
                                     "http://10.0.0.5:8101", "['gpu004',", "'gpu005']"]
    ok = _run(installed, sys.executable, "-m", "rlrun.cli", "-i",
              str(PROJECT / "examples" / "inventories" / "seed-2node"), "validate")
    assert ok.returncode == 0 and "ok (cluster vayu, 2 hosts: gpu004, gpu005)" in ok.stdout, ok.stderr


def test_the_shipped_playbooks_check_with_the_installed_rlrun(installed, tmp_path):
    """site.yml from the wheel: its validate play (a lookup beside the playbooks) and the cluster role's
    assert (a lookup in the role) import the installed rlrun and refuse a bad inventory."""
    tree = installed / "site" / "rlrun" / "_ansible"
    inv = write_inventory(tmp_path, "wheel", "127.0.29.101", 9800, group_vars={"cluster__rendezvous_max_port": 9821})
    env = {"ANSIBLE_CONFIG": str(tree / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(tree / "roles")}
    result = _run(installed, str(BIN / "ansible-playbook"), "-i", str(inv), str(tree / "site.yml"), "--tags",
                  "validate", env_extra=env)
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, out[-2000:]
    assert "cluster__rendezvous_max_port = 9821 (host localhost): must be at least cluster__rendezvous_min_port + 9" in out
    assert str(tree / "playbooks" / "validate.yml") in out  # the shipped play, not the checkout's


def test_without_its_roles_the_installed_rlrun_names_what_is_missing_in_one_line(installed, tmp_path):
    site = tmp_path / "site"
    shutil.copytree(installed / "site", site, ignore=shutil.ignore_patterns("_ansible"))
    env = {**ansible_env(), "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-m", "rlrun.cli", "-i", str(PROJECT / "inventory"), "status"],
                            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == "", result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: rlrun cannot find the Ansible roles it reads (roles/cluster/defaults/main.yml)")
    assert f"not in {site / 'rlrun' / '_ansible'} (the copy its wheel ships)" in lines[0]
    assert os.fspath(site) in lines[0]
