"""node_service's systemd path, as far as it runs without systemd as PID 1 (this machine):
the unit the role writes passes `systemd-analyze verify` (system and user scope, a command with
arguments systemd would mangle unescaped), carries the service's digest, and a user-scope unit
is refused with what to do while its user does not linger (loginctl has no logind here)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import PROJECT, playbook

pytestmark = pytest.mark.integration

# Arguments that systemd would split, expand ($, %) or unquote if the template did not escape them.
COMMAND = [sys.executable, "-c", "import sys; print(sys.argv)", "two words", "$HOME", "100%", 'say "hi"', "back\\slash"]


def _inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    return inv


def _role_play(tmp_path: Path, scope: str) -> Path:
    env = tmp_path / "svc.env"
    env.write_text("A='1'\n")
    play = [{"name": "node_service on systemd", "hosts": "localhost", "gather_facts": True,
             "gather_subset": ["min"], "roles": [{"role": "node_service", "vars": {
                 "node_service__name": f"rlrun-test-{scope}",
                 "node_service__command": COMMAND,
                 "node_service__env_files": [str(env)],
                 "node_service__workdir": str(tmp_path),
                 "node_service__manager": "systemd",
                 "node_service__systemd_scope": scope,
                 "node_service__unit_dir": str(tmp_path / "units"),
                 "node_service__run_dir": str(tmp_path / "run")}}]}]
    path = tmp_path / f"play-{scope}.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return path


def _verify(unit: Path, scope: str, tmp_path: Path) -> subprocess.CompletedProcess:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: scripts/system-deps.sh installs it (Debian package systemd)",
                    pytrace=False)
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_COLOR": "0"}
    return subprocess.run([analyze, "verify", "--man=no", f"--{scope}", str(unit)], capture_output=True,
                          text=True, env=env, timeout=60)


def test_system_unit_is_written_valid_and_carries_the_digest(tmp_path):
    result = playbook(_inventory(tmp_path), str(_role_play(tmp_path, "system")), timeout=300)
    out = result.stdout + result.stderr
    unit = tmp_path / "units" / "rlrun-test-system.service"
    # The role gets as far as systemd itself: here there is none to reload (not PID 1).
    assert result.returncode != 0 and "`systemctl --system daemon-reload` exited" in out, out[-3000:]
    assert unit.exists(), out[-3000:]
    text = unit.read_text()
    verify = _verify(unit, "system", tmp_path)
    assert verify.returncode == 0 and verify.stderr.strip() == "", verify.stderr
    assert re.search(r"^Environment=RLRUN_SERVICE_DIGEST=[0-9a-f]{64}$", text, re.M), text
    assert f"EnvironmentFile={tmp_path / 'svc.env'}" in text and "WantedBy=multi-user.target" in text
    # Each argument one quoted word, with systemd's escapes: $ -> $$, % -> %%, " -> \", \ -> \\.
    assert ('"two words" "$$HOME" "100%%" "say \\"hi\\"" "back\\\\slash"') in text, text


def test_a_broken_unit_fails_the_verification(tmp_path):
    """The check above can fail: a unit whose ExecStart is not an absolute path is refused."""
    unit = tmp_path / "broken.service"
    unit.write_text("[Service]\nExecStart=usr/bin/true\n")
    assert _verify(unit, "system", tmp_path).returncode != 0


def test_user_unit_renders_valid_for_the_user_manager(tmp_path):
    """The same template in user scope (WantedBy=default.target), checked by the user manager's rules."""
    # The role's defaults and vars, then this service's values (a later vars file wins).
    (tmp_path / "service.yml").write_text(yaml.safe_dump({
        "node_service__name": "rlrun-test-user", "node_service__command": COMMAND,
        "node_service__systemd_scope": "user", "node_service__env_files": []}))
    play = [{"name": "render", "hosts": "localhost", "gather_facts": True, "gather_subset": ["min"],
             "vars_files": [str(PROJECT / "roles/node_service/defaults/main.yml"),
                            str(PROJECT / "roles/node_service/vars/main.yml"), str(tmp_path / "service.yml")],
             "tasks": [{"name": "Render the unit", "ansible.builtin.template": {
                           "src": str(PROJECT / "roles/node_service/templates/etc/systemd/system/service.service.j2"),
                           "dest": str(tmp_path / "rlrun-test-user.service"), "mode": "0644"}}]}]
    (tmp_path / "render.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    result = playbook(_inventory(tmp_path), str(tmp_path / "render.yml"), timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    unit = tmp_path / "rlrun-test-user.service"
    assert "WantedBy=default.target" in unit.read_text()
    verify = _verify(unit, "user", tmp_path)
    assert verify.returncode == 0 and verify.stderr.strip() == "", verify.stderr


def test_user_unit_needs_lingering_and_says_how(tmp_path):
    """A user unit stops with the SSH session unless its user lingers: the role enables lingering,
    and where it cannot (no logind here) it stops before writing the unit, saying what to do."""
    if Path(f"/var/lib/systemd/linger/{os.environ.get('USER', 'root')}").exists():
        pytest.fail("this user lingers already on this machine; the refusal cannot be shown", pytrace=False)
    result = playbook(_inventory(tmp_path), str(_role_play(tmp_path, "user")), timeout=300)
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert re.search(r"rlrun-test-user is a systemd user unit of \S+, which does not linger, so it would stop "
                     r"when the SSH session ends; `loginctl enable-linger \S+` failed", out), out[-3000:]
    assert "node_service__manager: start-stop-daemon" in out
    assert not (tmp_path / "units" / "rlrun-test-user.service").exists()
