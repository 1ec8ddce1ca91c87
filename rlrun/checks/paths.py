"""Paths on the nodes and on the controller: absolute, no space, nothing a shell or a unit file treats
specially; and Ray's temp dir short enough for its socket paths, in a directory of its own."""

from __future__ import annotations

import getpass
from pathlib import Path

from rlrun.checks.problems import Recorder
from rlrun.checks.shapes import path_problem
from rlrun.checks.vocabulary import N
from rlrun.inventory_view import UNKNOWN

# Ray's Unix sockets: <temp_dir>/session_<YYYY-MM-DD_HH-MM-SS_ffffff>_<pid>/sockets/plasma_store must fit
# in sun_path (107 bytes on Linux; ray._private.utils.validate_socket_filepath). pids have up to 7 digits
# (pid_max 4194304).
SOCKET_MAX = 107
SOCKET_SUFFIX = len("/session_2026-11-24_04-21-07_012345_") + 7 + len("/sockets/plasma_store")
TEMP_DIR_MAX = SOCKET_MAX - SOCKET_SUFFIX


def check_paths(r: Recorder, host: str, is_node: bool) -> None:
    for var in ((N.temp_dir,) if is_node else ()) + N.node_paths + N.controller_paths:
        if var not in r.raw(host):
            continue
        value = r.value(host, var)
        if value is UNKNOWN or value is None:
            continue
        problem = path_problem(value)
        if problem:
            r.add(host, var, r.raw(host)[var], problem)
    if is_node:
        check_temp_dir(r, host)


def check_temp_dir(r: Recorder, host: str) -> None:
    raw = r.raw(host)
    value, error = r.view.resolve(host, N.temp_dir)
    assumed = ""
    if value is UNKNOWN:  # needs ansible_user_id: compute it with the SSH user
        user = raw.get("ansible_user") or getpass.getuser()
        value, error = r.view.resolve(host, N.temp_dir, extra={"ansible_user_id": str(user)})
        assumed = f" (with the host's user {user!r})"
    if error or not isinstance(value, str) or value is UNKNOWN:
        return
    where = r.view.where(host, N.temp_dir) if N.temp_dir in raw else r.view.where(host, N.cluster_name)
    if path_problem(value):
        return  # reported by check_paths when the inventory sets it
    size = len(value.rstrip("/").encode())
    if size > TEMP_DIR_MAX:
        r.add(host, N.temp_dir, value, f"is {size} bytes{assumed}: Ray's socket files below it "
              f"(<temp dir>/session_<time>_<pid>/sockets/plasma_store) must fit in {SOCKET_MAX} bytes, so the temp "
              f"dir may have at most {TEMP_DIR_MAX}: shorten it"
              + ("" if N.temp_dir in raw else f" (set {N.temp_dir}, or a shorter {N.cluster_name})"), where=where)
    parent = str(Path(value.rstrip("/")).parent)
    if parent in ("/", "/tmp", "/var/tmp", "/dev/shm"):
        r.add(host, N.temp_dir, value, f"sits directly in {parent}, which every user can write: put it in a "
              "directory of its own (the role makes the parent 0700), e.g. /tmp/rlrun-USER/CLUSTER-HOST", where=where)
