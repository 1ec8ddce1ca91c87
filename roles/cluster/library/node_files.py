#!/usr/bin/python
"""A host's directories and small files, converged in one round trip (the cluster role's and its readers')."""

from __future__ import annotations

import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.rlrun_files import write_atomic

DOCUMENTATION = r"""
module: node_files
short_description: Make directories, write small files and remove paths on a host in one call.
description:
  - Does the work of many file and copy tasks in one round trip and reports what it changed.
  - Directories are made (with their parents) and get their mode. Files are written atomically (a
    temporary file in the same directory, then a rename) when their content differs, and get their
    mode; a file given without content only has its mode fixed, where it exists. Paths under
    I(absent) are removed.
  - Supports check mode and diff mode (a task that writes secrets sets no_log, which hides the diff).
options:
  dirs:
    type: list
    elements: dict
    default: []
    description: "Directories: {path, mode}."
  files:
    type: list
    elements: dict
    default: []
    description: "Files: {path, content, mode}; without content, the mode of an existing file only."
  absent:
    type: list
    elements: path
    default: []
    description: Files (or empty directories) to remove.
"""

RETURN = r"""
changed_paths: {description: Paths made, written, changed in mode or removed., type: list, returned: always}
"""


def main():
    module = AnsibleModule(
        argument_spec={
            "dirs": {"type": "list", "elements": "dict", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "absent": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    check = module.check_mode
    changed: list[str] = []
    diffs: list[dict] = []

    def mode_of(item: dict, default: str) -> int:
        value = str(item.get("mode", default))
        try:
            return int(value, 8)
        except ValueError:
            module.fail_json(msg=f"{item.get('path')}: mode {value!r} is not an octal mode such as '0600'")

    for item in module.params["dirs"]:
        path, mode = os.path.expanduser(item["path"]), mode_of(item, "0700")
        try:
            st = os.stat(path)
        except FileNotFoundError:
            changed.append(path)
            if not check:
                os.makedirs(path, mode)
                os.chmod(path, mode)
            continue
        if not stat.S_ISDIR(st.st_mode):
            module.fail_json(msg=f"{path} exists and is not a directory", changed_paths=changed)
        if stat.S_IMODE(st.st_mode) != mode:
            changed.append(path)
            if not check:
                os.chmod(path, mode)

    for item in module.params["files"]:
        path, mode = os.path.expanduser(item["path"]), mode_of(item, "0600")
        content = item.get("content")
        try:
            with open(path, "rb") as fh:
                before = fh.read()
        except FileNotFoundError:
            before = None
        if content is None or (before is not None and before == str(content).encode()):
            if before is not None and stat.S_IMODE(os.stat(path).st_mode) != mode:
                changed.append(path)
                if not check:
                    os.chmod(path, mode)
            continue
        data = str(content).encode()
        changed.append(path)
        if module._diff:
            diffs.append({"before_header": path, "after_header": path,
                          "before": "" if before is None else before.decode(errors="replace"), "after": str(content)})
        if check:
            continue
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory):
            module.fail_json(msg=f"{path}: its directory {directory} does not exist", changed_paths=changed)
        write_atomic(path, data, mode)

    for path in module.params["absent"]:
        if os.path.lexists(path):
            changed.append(path)
            if not check:
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)

    result = {"changed": bool(changed), "changed_paths": changed}
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
