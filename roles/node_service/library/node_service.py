#!/usr/bin/python
"""One supervised service on a node, converged in one round trip (the node_service role's work)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import ssl
import stat
import subprocess
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.rlrun_files import write_atomic

DOCUMENTATION = r"""
module: node_service
short_description: Converge one supervised service (systemd or start-stop-daemon) in one call.
description:
  - Creates the service's private directories, writes its files (env files, hooks), its supervisor
    and control scripts or its systemd unit, computes its digest from the content of its env files and
    watched files on the node, and starts, restarts or stops it; then waits until it is ready.
  - The digest covers the name, command, working directory, open-file limit and the content of every
    env file and watched file. The rendered scripts and unit carry the text C(__RLRUN_SERVICE_DIGEST__)
    where the digest goes; this module puts it there, since only the node knows its files' content.
  - A running service is restarted when the digest it was started with differs, when its supervisor
    script changed (start-stop-daemon), or when I(restart) is true; otherwise it is left alone.
  - Supports check mode and diff mode.
options:
  name: {type: str, required: true, description: Service name.}
  state: {type: str, choices: [started, stopped, absent], default: started,
          description: "absent: stop the service and remove its scripts or unit (teardown)."}
  manager: {type: str, choices: [systemd, start-stop-daemon], required: true, description: The supervisor.}
  scope: {type: str, choices: [system, user], default: system, description: systemd scope.}
  enabled: {type: bool, default: true, description: Start at boot (systemd).}
  command: {type: list, default: [], description: The command (part of the digest).}
  workdir: {type: str, default: "", description: Working directory (part of the digest).}
  nofile: {type: str, default: "", description: Open-file limit (part of the digest).}
  watch: {type: list, elements: str, default: [],
          description: Env files then watched files, in order; their content is part of the digest.}
  dirs:
    type: list
    elements: dict
    default: []
    description:
      - "Directories made before anything else: {path, mode, create_only (default false), hint}."
      - Each must be owned by the user this runs as (I(hint) is added to that error).
      - With I(create_only), the mode of an existing directory is left as it is (a service that opens its own).
  files:
    type: list
    elements: dict
    default: []
    description: "Files written before the digest is computed: {path, content, mode}."
  run_dir: {type: path, required: true, description: Directory of the scripts, pidfile and log (made 0700).}
  script: {type: str, default: "", description: The supervisor script (start-stop-daemon).}
  ctl: {type: str, default: "", description: The control script (start-stop-daemon).}
  unit: {type: str, default: "", description: The unit file's text (systemd).}
  unit_path: {type: path, default: "", description: Where the unit goes (systemd).}
  restart: {type: bool, default: false, description: Restart a running service whatever its digest says.}
  health_url: {type: str, default: "", description: "When started: wait until a GET of this URL answers 200."}
  health_ca: {type: path, default: "", description: CA file for an https I(health_url).}
  ready_argv: {type: list, elements: str, default: [],
               description: After a start or restart, run this command; it must exit 0 (it waits itself).}
  ready_env: {type: dict, default: {}, description: Environment of I(ready_argv).}
  ready_tcp: {type: str, default: "", description: "After a start or restart, wait until HOST:PORT accepts a TCP connection."}
  remove: {type: list, elements: path, default: [],
           description: "With state absent: files and directories (with what they hold) removed after the stop."}
  wait_timeout: {type: int, default: 120, description: Seconds I(health_url) or I(ready_tcp) may take to answer.}
"""

RETURN = r"""
digest: {description: The service's digest., type: str, returned: unless state is absent}
action: {description: "none, started, restarted, stopped or removed.", type: str, returned: always}
files_changed: {description: Paths written, created or removed., type: list, returned: always}
"""


PLACEHOLDER = "__RLRUN_SERVICE_DIGEST__"
# Seconds between two looks while a started service gets ready (a port that accepts, a health URL that answers).
POLL = 0.2


class Converge:
    """What one call does, in order; check mode writes and runs nothing that changes the node."""

    def __init__(self, module: AnsibleModule):
        self.m = module
        self.p = module.params
        self.check = module.check_mode
        self.changed_paths: list[str] = []
        self.diffs: list[dict] = []

    def fail(self, msg: str, **kw):
        self.m.fail_json(msg=f"{self.p['name']}: {msg}", files_changed=self.changed_paths, **kw)

    # -- files -------------------------------------------------------------------------------------
    def ensure_dir(self, path: str, mode: int, create_only: bool = False, hint: str = "") -> None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self.changed_paths.append(path)
            if not self.check:
                os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
                os.mkdir(path, mode)
                os.chmod(path, mode)
            return
        if not stat.S_ISDIR(st.st_mode):
            self.fail(f"{path} exists and is not a directory")
        if st.st_uid != os.geteuid():
            self.fail(f"{path} is owned by uid {st.st_uid}, not by uid {os.geteuid()} (the user this runs as): "
                      f"another user created it{'; ' + hint if hint else ''}")
        if not create_only and stat.S_IMODE(st.st_mode) != mode:
            self.changed_paths.append(path)
            if not self.check:
                os.chmod(path, mode)

    def ensure_file(self, path: str, content: str, mode: int) -> bool:
        """Write `content` to `path` (atomically, by rename) unless it is there already; fix the mode."""
        data = content.encode()
        try:
            with open(path, "rb") as fh:
                before = fh.read()
            st = os.stat(path)
        except FileNotFoundError:
            before, st = None, None
        if before == data:
            if stat.S_IMODE(st.st_mode) == mode:
                return False
            self.changed_paths.append(path)
            if not self.check:
                os.chmod(path, mode)
            return True
        self.changed_paths.append(path)
        if self.m._diff:
            self.diffs.append({"before_header": path, "after_header": path,
                               "before": "" if before is None else before.decode(errors="replace"), "after": content})
        if not self.check:
            write_atomic(path, data, mode)
        return True

    def remove(self, path: str) -> None:
        if os.path.lexists(path):
            self.changed_paths.append(path)
            if not self.check:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)

    @staticmethod
    def checksum(path: str) -> str:
        try:
            with open(path, "rb") as fh:
                return hashlib.sha256(fh.read()).hexdigest()
        except FileNotFoundError:
            return "absent"

    def digest(self) -> str:
        """sha256 of the service's definition, as the role computed it before this module (same JSON text),
        so that a service started by an earlier version is not restarted for nothing."""
        p = self.p
        definition = {"name": p["name"], "command": p["command"], "workdir": p["workdir"], "nofile": p["nofile"],
                      "files": [[path, self.checksum(path)] for path in p["watch"]]}
        return hashlib.sha256(json.dumps(definition).encode()).hexdigest()

    # -- processes ---------------------------------------------------------------------------------
    def run(self, argv: list[str], env: dict | None = None, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})})
        if proc.returncode not in ok:
            self.fail(f"`{' '.join(argv)}` exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-2000:]}",
                      rc=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)
        return proc

    # -- start-stop-daemon -------------------------------------------------------------------------
    def ssd_paths(self):
        d, n = self.p["run_dir"], self.p["name"]
        return f"{d}/{n}.supervise", f"{d}/{n}.ctl", f"{d}/{n}.pid"

    def ssd(self, digest: str) -> str:
        script, ctl, pidfile = self.ssd_paths()
        self.ensure_dir(self.p["run_dir"], 0o700)
        script_changed = self.ensure_file(script, self.p["script"].replace(PLACEHOLDER, digest), 0o700)
        self.ensure_file(ctl, self.p["ctl"], 0o700)
        status = self.run(["start-stop-daemon", "--status", "--pidfile", pidfile], ok=(0, 1, 3, 4))
        running = status.returncode == 0
        if self.p["state"] == "stopped":
            if self.check:
                return "stopped" if running else "none"
            out = self.run([ctl, "stop"]).stdout
            return "stopped" if "stopped" in out else "none"
        try:
            with open(f"{pidfile}.digest") as fh:
                running_digest = fh.read().strip()
        except FileNotFoundError:
            running_digest = ""
        if not running:
            if not self.check:
                self.run([ctl, "start"])
            return "started"
        if running_digest != digest or script_changed or self.p["restart"]:
            if not self.check:
                self.run([ctl, "restart"])
            return "restarted"
        return "none"

    def ssd_remove(self) -> str:
        script, ctl, _ = self.ssd_paths()
        action = "none"
        if os.path.exists(ctl):
            if self.check:
                action = "stopped"
            else:
                # A control script left by a failed run may not work: stop as far as it can, remove anyway.
                proc = subprocess.run([ctl, "stop"], capture_output=True, text=True)
                if "stopped" in proc.stdout:
                    action = "stopped"
        self.remove(script)
        self.remove(ctl)
        return action

    # -- systemd -----------------------------------------------------------------------------------
    def systemctl(self, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        env = {"XDG_RUNTIME_DIR": f"/run/user/{os.geteuid()}"} if self.p["scope"] == "user" else {}
        return self.run(["systemctl", f"--{self.p['scope']}", *args], env=env, ok=ok)

    def systemd(self, digest: str) -> str:
        unit = f"{self.p['name']}.service"
        self.ensure_dir(os.path.dirname(self.p["unit_path"]), 0o755)
        if self.ensure_file(self.p["unit_path"], self.p["unit"].replace(PLACEHOLDER, digest), 0o644) and not self.check:
            self.systemctl("daemon-reload")
        enabled = self.systemctl("is-enabled", unit, ok=(0, 1, 4)).stdout.strip() == "enabled"
        if enabled != self.p["enabled"]:
            self.changed_paths.append(f"({unit} {'enabled' if self.p['enabled'] else 'disabled'})")
            if not self.check:
                self.systemctl("enable" if self.p["enabled"] else "disable", unit)
        active = self.systemctl("is-active", unit, ok=(0, 3, 4)).returncode == 0
        if self.p["state"] == "stopped":
            if active and not self.check:
                self.systemctl("stop", unit)
            return "stopped" if active else "none"
        if not active:
            if not self.check:
                self.systemctl("start", unit)
            return "started"
        pid = self.systemctl("show", "-p", "MainPID", "--value", unit).stdout.strip()
        running_digest = ""
        if pid.isdigit() and int(pid) > 0:
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    for item in fh.read().split(b"\0"):
                        if item.startswith(b"RLRUN_SERVICE_DIGEST="):
                            running_digest = item.split(b"=", 1)[1].decode()
            except OSError:
                pass
        # A unit started before it carried a digest is left alone (as the role always did).
        if running_digest not in ("", digest) or self.p["restart"]:
            if not self.check:
                self.systemctl("restart", unit)
            return "restarted"
        return "none"

    def systemd_remove(self) -> str:
        unit = f"{self.p['name']}.service"
        action = "none"
        if not self.check:
            env = {"XDG_RUNTIME_DIR": f"/run/user/{os.geteuid()}"} if self.p["scope"] == "user" else {}
            scope = f"--{self.p['scope']}"
            active = subprocess.run(["systemctl", scope, "is-active", unit], capture_output=True,
                                    env={**os.environ, **env}).returncode == 0
            # Failures are not errors here: the unit may be gone already (teardown after a failed run).
            subprocess.run(["systemctl", scope, "disable", "--now", unit], capture_output=True, env={**os.environ, **env})
            action = "stopped" if active else "none"
        self.remove(self.p["unit_path"])
        return action

    # -- readiness ---------------------------------------------------------------------------------
    def wait_tcp(self) -> None:
        host, _, port = self.p["ready_tcp"].rpartition(":")
        if not host or not port.isdigit():
            self.fail(f"ready_tcp = {self.p['ready_tcp']!r}: expected HOST:PORT")
        timeout = self.p["wait_timeout"]
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection((host, int(port)), timeout=5):
                    return
            except OSError as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                self.fail(f"nothing accepts connections on {host}:{port} {timeout} s after the start (last: {last}); "
                          f"see the service's log in {self.p['run_dir']} or its journal")
            time.sleep(POLL)

    def wait_health(self) -> None:
        url, timeout = self.p["health_url"], self.p["wait_timeout"]
        context = ssl.create_default_context(cafile=self.p["health_ca"]) if self.p["health_ca"] else None
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10, context=context) as resp:
                    if resp.status == 200:
                        return
                    last = f"status {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"status {exc.code}"
            except (OSError, ValueError) as exc:
                last = str(getattr(exc, "reason", exc))
            if time.monotonic() > deadline:
                self.fail(f"{url} did not answer 200 within {timeout} s (last: {last}); see the service's log in "
                          f"{self.p['run_dir']} or its journal")
            time.sleep(POLL)

    # -- the call ----------------------------------------------------------------------------------
    def __call__(self) -> dict:
        p = self.p
        if not re.match(r"^[A-Za-z0-9_.@-]+$", p["name"]) or (p["state"] != "absent" and not p["command"]):
            self.m.fail_json(msg=f"node_service__name = '{p['name']}' must be non-empty letters, digits, '.', '_', "
                                 f"'-', '@'; node_service__command = {p['command']} must be a non-empty list")
        needs = ("script", "ctl") if p["manager"] == "start-stop-daemon" else ("unit",)
        missing = [k for k in needs if p["state"] != "absent" and not p[k]]
        if missing:
            self.fail(f"{' and '.join(missing)} must be given to run it under {p['manager']}")
        if p["state"] == "absent":
            action = self.ssd_remove() if p["manager"] == "start-stop-daemon" else self.systemd_remove()
            for path in p["remove"]:
                self.remove(path)
            return {"changed": action != "none" or bool(self.changed_paths), "action": action,
                    "files_changed": self.changed_paths}
        for d in p["dirs"]:
            self.ensure_dir(d["path"], int(str(d.get("mode", "0700")), 8), bool(d.get("create_only")),
                            d.get("hint") or "")
        for f in p["files"]:
            self.ensure_file(f["path"], f["content"], int(str(f.get("mode", "0600")), 8))
        digest = self.digest()
        action = self.ssd(digest) if p["manager"] == "start-stop-daemon" else self.systemd(digest)
        if not self.check and p["state"] == "started":
            if action in ("started", "restarted") and p["ready_tcp"]:
                self.wait_tcp()
            if action in ("started", "restarted") and p["ready_argv"]:
                self.run(p["ready_argv"], env=p["ready_env"])
            if p["health_url"]:
                self.wait_health()
        result = {"changed": action != "none" or bool(self.changed_paths), "action": action, "digest": digest,
                  "files_changed": self.changed_paths}
        if self.diffs:
            result["diff"] = self.diffs
        return result


def main():
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["started", "stopped", "absent"], "default": "started"},
            "manager": {"type": "str", "choices": ["systemd", "start-stop-daemon"], "required": True},
            "scope": {"type": "str", "choices": ["system", "user"], "default": "system"},
            "enabled": {"type": "bool", "default": True},
            "command": {"type": "list", "default": []},
            "workdir": {"type": "str", "default": ""},
            "nofile": {"type": "str", "default": ""},
            "watch": {"type": "list", "elements": "str", "default": []},
            "dirs": {"type": "list", "elements": "dict", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "run_dir": {"type": "path", "required": True},
            "script": {"type": "str", "default": ""},
            "ctl": {"type": "str", "default": ""},
            "unit": {"type": "str", "default": ""},
            "unit_path": {"type": "path", "default": ""},
            "restart": {"type": "bool", "default": False},
            "health_url": {"type": "str", "default": ""},
            "health_ca": {"type": "path", "default": ""},
            "ready_argv": {"type": "list", "elements": "str", "default": []},
            "ready_env": {"type": "dict", "default": {}},
            "ready_tcp": {"type": "str", "default": ""},
            "wait_timeout": {"type": "int", "default": 120},
            "remove": {"type": "list", "elements": "path", "default": []},
        },
        required_if=[("manager", "systemd", ("unit_path",))],
        supports_check_mode=True,
    )
    module.exit_json(**Converge(module)())


if __name__ == "__main__":
    main()
