#!/usr/bin/python
"""What a node's virtualenv holds and what the python_stack role must install there, in one round trip."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.rlrun_files import write_atomic

DOCUMENTATION = r"""
module: python_stack_state
short_description: Read a virtualenv's stack and decide what to install; record the stack's versions.
description:
  - Looks up the missing system packages (dpkg-query), whether the virtualenv exists, and runs the stack
    check (I(check_script), e.g. files/stack_check.py, with the venv's python) unless the stamp the last
    check left in the venv still holds. The stamp holds the check's answer, the check script and extra it
    answered for, and the modification times of the venv's site-packages directories; every pip install,
    upgrade or removal changes those, so the stamp is then stale and the check runs again.
  - Decides whether the pinned stack and the project must be installed (the project: an editable install
    that points elsewhere than I(editable_src), or a copy whose recorded hash in I(marker) is not I(src_hash)).
  - When nothing is to be installed, writes the stack's versions to I(record) (0600, its directory 0700),
    which the services watch: a new version restarts them.
  - Supports check mode.
options:
  venv: {type: path, required: true, description: The virtualenv.}
  extra: {type: str, default: "", description: "The project's extra (cpu, gpu or none)."}
  check_script: {type: str, required: true, description: "The stack check's source, run with the venv's python."}
  editable_src: {type: path, default: "", description: Where an editable install must point (editable mode).}
  src_hash: {type: str, default: "", description: The project source's hash on the controller (copy mode).}
  marker: {type: path, default: "", description: Where the installed copy's hash is kept (copy mode).}
  system_packages: {type: list, elements: str, default: [], description: Debian packages that must be installed.}
  record: {type: path, default: "", description: Where the stack's versions are recorded.}
"""

RETURN = r"""
missing_packages: {description: Those of I(system_packages) not installed., type: list, returned: always}
venv_exists: {description: Whether the venv's python is there., type: bool, returned: always}
need_stack: {description: Whether the pinned stack must be installed., type: bool, returned: always}
need_project: {description: Whether the project must be installed., type: bool, returned: always}
problems: {description: What the stack check found wrong., type: list, returned: always}
versions: {description: The stack's versions., type: dict, returned: always}
cached: {description: Whether the stamp answered instead of the check., type: bool, returned: always}
"""


STAMP = ".rlrun-stack-check.json"


def site_mtimes(venv: str) -> dict[str, int]:
    return {path: os.stat(path).st_mtime_ns for path in sorted(glob.glob(f"{venv}/lib*/python*/site-packages"))}


def main():
    module = AnsibleModule(
        argument_spec={
            "venv": {"type": "path", "required": True},
            "extra": {"type": "str", "default": ""},
            "check_script": {"type": "str", "required": True},
            "editable_src": {"type": "path", "default": ""},
            "src_hash": {"type": "str", "default": ""},
            "marker": {"type": "path", "default": ""},
            "system_packages": {"type": "list", "elements": "str", "default": []},
            "record": {"type": "path", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    out = {"changed": False, "missing_packages": [], "venv_exists": False, "need_stack": True, "need_project": True,
           "problems": [], "versions": {}, "cached": False}

    if p["system_packages"]:
        proc = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\n", *p["system_packages"]],
                              capture_output=True, text=True)
        installed = {line.split()[0] for line in proc.stdout.splitlines() if line.endswith(" installed")}
        out["missing_packages"] = [name for name in p["system_packages"] if name not in installed]

    python = os.path.join(p["venv"], "bin", "python")
    out["venv_exists"] = os.path.exists(python)
    if not out["venv_exists"]:
        module.exit_json(**out)

    key = hashlib.sha256(f"{p['extra']}\0{p['check_script']}".encode()).hexdigest()
    stamp_path = os.path.join(p["venv"], STAMP)
    mtimes = site_mtimes(p["venv"])
    check = None
    try:
        with open(stamp_path) as fh:
            stamp = json.load(fh)
        if stamp.get("key") == key and stamp.get("site") == mtimes and mtimes:
            check, out["cached"] = stamp["result"], True
    except (OSError, ValueError, KeyError):
        pass
    if check is None:
        proc = subprocess.run([python, "-c", p["check_script"], p["extra"]], capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            module.fail_json(msg=f"the stack check with {python} failed (exit {proc.returncode}): "
                                 f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
        check = json.loads(lines[-1])
        if not module.check_mode:
            write_atomic(stamp_path, json.dumps({"key": key, "site": mtimes, "result": check}), 0o600)

    out["problems"], out["versions"] = check.get("problems", []), check.get("versions", {})
    out["need_stack"] = not check.get("ok")
    if p["editable_src"]:
        out["need_project"] = check.get("editable_from") != os.path.realpath(p["editable_src"])
    else:
        try:
            with open(p["marker"]) as fh:
                installed = fh.read().strip()
        except OSError:
            installed = ""
        out["need_project"] = installed != p["src_hash"]

    if p["record"] and not out["need_stack"] and not out["need_project"]:
        # As the role's to_nice_json wrote it before: a cluster it recorded is not restarted for nothing.
        text = json.dumps(out["versions"], indent=4, sort_keys=True, separators=(",", ": ")) + "\n"
        try:
            with open(p["record"]) as fh:
                same = fh.read() == text and (os.stat(p["record"]).st_mode & 0o777) == 0o600
        except OSError:
            same = False
        if not same:
            out["changed"] = True
            if not module.check_mode:
                os.makedirs(os.path.dirname(p["record"]), mode=0o700, exist_ok=True)
                write_atomic(p["record"], text, 0o600)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
