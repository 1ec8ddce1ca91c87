"""Files and directories replaced atomically: a reader, or a process killed in the middle, finds the old one or
the new one, never a part.

The one home of write-to-a-temporary-name-then-rename for the Python packages: the checkpoints
(:mod:`trainer.checkpoint`), the retrieval index (:mod:`trainer.retrieval.index`), the metrics file, and rlrun's
files on a Slurm node (:mod:`rlrun.slurm.runtime`). (The roles' modules, which run on a node's own Python, have
theirs in roles/rlrun_files/module_utils/rlrun_files.py.) Standard library only.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

__all__ = ["TMP_PREFIX", "fsync_path", "fsync_tree", "replace_dir", "replace_file", "write_file"]

#: The name of everything here that is not in place yet (``.tmp-<name>-<id>``): a reader skips it, and the
#: writer's next run may remove one a killed writer left.
TMP_PREFIX = ".tmp-"


def _tmp_name(path: Path, what: str = "") -> Path:
    return path.with_name(f"{TMP_PREFIX}{path.name}{what}-{uuid.uuid4().hex[:8]}")


def fsync_path(path: Path) -> None:
    """Flush a file's (or a directory's entries') data to the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, text: str, mode: int = 0o666) -> None:
    """Write ``text`` to the new file ``path`` (created with ``mode`` less the umask, so a secret is never
    readable by others) and fsync it; the directory entry is the caller's (see :func:`replace_file`)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def replace_file(path: Path, text: str, mode: int = 0o666) -> None:
    """Replace ``path`` with ``text`` atomically: a temporary file beside it, fsync'd, renamed over it, and the
    directory fsync'd. A reader sees the old content or the new, never a part; the temporary file is removed
    when anything fails."""
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        write_file(tmp, text, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (what a process wrote there itself)."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            fsync_path(Path(dirpath) / name)
        fsync_path(Path(dirpath))


def replace_dir(src: Path, dst: Path) -> None:
    """Rename the complete directory ``src`` to ``dst``. An existing ``dst`` is moved aside first (back in place
    when the rename fails) and removed after, so ``dst`` is always the old complete one or the new one."""
    old = None
    if dst.exists():
        old = _tmp_name(dst, "-old")
        os.rename(dst, old)
    try:
        os.rename(src, dst)
    except BaseException:
        if old is not None:
            os.rename(old, dst)
        raise
    fsync_path(dst.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
