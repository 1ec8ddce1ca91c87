"""The roles' modules' one way to write a file on a node: atomically, with its mode from the start.

node_files (roles/cluster), node_service and python_stack_state import it as ``ansible.module_utils.rlrun_files``:
their roles list this one (rlrun_files) as a dependency, which puts its module_utils/ on Ansible's path in any
play that has one of them, and Ansible ships the file to the node with each module that imports it. Standard
library only (it runs on the node's Python).
"""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str, data: bytes | str, mode: int) -> None:
    """Replace ``path`` with ``data``: a temporary file in the same directory, made with ``mode`` before a byte is
    written, then renamed over ``path``. A reader sees the old content or the new, never a part, and a secret is
    never readable by others, not even for a moment. The temporary file is removed when anything fails."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
