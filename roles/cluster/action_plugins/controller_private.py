"""Action of the cluster role: keep the controller's copies of the tokens private, in the controller's own
process (no module to ship and start, as the file module on localhost would): each directory 0700 (made if
missing), each file 0600 where it exists. Check mode reports without changing."""

from __future__ import annotations

import os
import stat

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

DOCUMENTATION = r"""
name: controller_private
short_description: Make directories 0700 and existing files 0600 on the controller.
options:
  dirs: {type: list, elements: path, default: [], description: Directories (made when missing).}
  files: {type: list, elements: path, default: [], description: Files (left alone when missing).}
"""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        unknown = set(args) - {"dirs", "files"}
        if unknown:
            raise AnsibleActionFail(f"controller_private: unknown options {sorted(unknown)}; expected dirs, files")
        check = self._task.check_mode
        changed = []
        for path, mode, make in [(d, 0o700, True) for d in args.get("dirs") or []] + \
                                [(f, 0o600, False) for f in args.get("files") or []]:
            path = os.path.expanduser(str(path))
            try:
                have = stat.S_IMODE(os.stat(path).st_mode)
            except FileNotFoundError:
                if make:
                    changed.append(path)
                    if not check:
                        os.makedirs(path, mode=mode)
                        os.chmod(path, mode)
                continue
            if have != mode:
                changed.append(path)
                if not check:
                    os.chmod(path, mode)
        result.update(changed=bool(changed), changed_paths=changed)
        return result
