"""python_stack with python_stack__install false: no pip, a thin venv over an existing interpreter.

The lent GPU machines have no package index: there the stack is unpacked into a folder and the role
must use it as it is (bench/gpu/miniature). The venv it makes must see the interpreter's packages and
the extra paths, carry `ray` and `rlrun` entry points, and refuse, naming the module, what cannot import.
"""

import json
import subprocess
import sys

import pytest
import yaml

from tests.conftest import BIN, PROJECT, ansible_env

pytestmark = pytest.mark.integration


def _run_role(tmp_path, venv, imports, extra_paths):
    play = [{"hosts": "localhost", "gather_facts": True, "gather_subset": ["min"],
             "vars": {"cluster__venv": str(venv), "cluster__state_dir": str(tmp_path / "state")},
             "roles": ["cluster", {"role": "python_stack", "vars": {
                 "python_stack__install": False,
                 "python_stack__python": sys.executable,
                 "python_stack__extra_paths": [str(p) for p in extra_paths],
                 "python_stack__import_check": imports}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    env = {**ansible_env(), "ANSIBLE_ROLES_PATH": str(PROJECT / "roles")}
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=PROJECT)


def test_thin_venv_sees_the_interpreter_and_the_extra_paths(tmp_path):
    extra = tmp_path / "site"
    extra.mkdir()
    (extra / "carried_pkg.py").write_text("__version__ = '1.2.3'\n")
    venv = tmp_path / "venv"
    result = _run_role(tmp_path, venv, ["carried_pkg", "yaml", "rlrun"], [extra, PROJECT])
    assert result.returncode == 0, result.stdout[-3000:]
    assert "stack found" in result.stdout and "carried_pkg" in result.stdout
    for name in ("ray", "rlrun"):
        assert (venv / "bin" / name).stat().st_mode & 0o111, name
    # The venv's python (what Ray's workers run) finds the carried folder, the interpreter's packages
    # and the checkout, with no PYTHONPATH.
    env = {k: v for k, v in ansible_env().items() if k != "PYTHONPATH"}
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import json, carried_pkg, yaml, rlrun; print(json.dumps([carried_pkg.__file__, "
                            "rlrun.__file__]))"], capture_output=True, text=True, env=env, timeout=60)
    assert probe.returncode == 0, probe.stderr
    carried, rlrun_file = json.loads(probe.stdout)
    assert carried.startswith(str(extra)) and rlrun_file.startswith(str(PROJECT))
    # The entry point runs the CLI of the checkout.
    cli = subprocess.run([str(venv / "bin" / "rlrun"), "--help"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert cli.returncode == 0 and "submit" in cli.stdout, cli.stderr
    # Idempotent: a second run changes nothing (the venv, its entry points, the record of the stack's versions).
    assert json.loads((tmp_path / "state" / "stack.json").read_text())["carried_pkg"] == "1.2.3"
    again = _run_role(tmp_path, venv, ["carried_pkg", "yaml", "rlrun"], [extra, PROJECT])
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-2000:]


def test_a_module_that_does_not_import_is_named(tmp_path):
    result = _run_role(tmp_path, tmp_path / "venv", ["yaml", "no_such_module_xyz"], [PROJECT])
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert "python_stack__install is false, so nothing is installed" in out
    assert "no_such_module_xyz" in out and "ModuleNotFoundError" in out
