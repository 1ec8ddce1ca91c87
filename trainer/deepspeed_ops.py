"""Build DeepSpeed's JIT ops on a node before its first job needs them (``ray_node__deepspeed_ops``).

The stack installs DeepSpeed without its C++ ops (``DS_BUILD_OPS=0``): an op is compiled the first time a
process loads it, into torch's extension cache (``$TORCH_EXTENSIONS_DIR``, else under the home directory,
which on a cluster node is its state dir). ``--adam_offload`` (the 7B PPO and the 32B presets) loads
``cpu_adam``: the first job on each node then waits for that build, 43-54 s on the GPU machines and 65-87 s
on the 2-core one, inside its start-up, and a node without a compiler fails the job there. Run in the node's own
environment (the role sources the node's env files first), this builds the named ops where the node's jobs
will find them, so a job only loads them, and a missing compiler or ninja is found when the node is
provisioned.

    python -m trainer.deepspeed_ops cpu_adam [OP ...]

Prints one JSON line per op: ``{"op", "state", "seconds", "path"}``; ``state`` is ``built`` (compiled now),
``cached`` (the cache had it already) or ``installed`` (DeepSpeed was installed with it compiled in). Exit 0
when every op loads; 2 for an op this node's DeepSpeed does not know (the message lists the ones it does);
1 for an op that cannot be built here (the compiler's last lines). The ops are checked before any is built.

    python -m trainer.deepspeed_ops --check cpu_adam [OP ...]

builds nothing and writes nothing on the node (not even the empty build directory a load makes): one JSON line
per op, ``{"op", "state", "path"}`` with ``state`` ``installed``, ``cached`` or
``missing``, and for a missing op ``buildable`` (whether a job's load could compile it here) and, when not,
``why``. ``rlrun submit``'s probe job runs it on the nodes of an ``--adam_offload`` job (exit 0, or 2 as above).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any


class OpError(Exception):
    """An op that cannot be loaded here, with what was wrong; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def known_ops() -> dict[str, Any]:
    """This node's DeepSpeed op builders by op name (they depend on the accelerator DeepSpeed finds).
    DeepSpeed's logger is made during this import and writes to the stdout of that moment: stderr here, so
    that stdout holds the result lines only."""
    with contextlib.redirect_stdout(sys.stderr):
        from deepspeed.ops.op_builder.all_ops import ALL_OPS

    return dict(ALL_OPS)


def check_names(names: list[str], known: dict[str, Any]) -> None:
    """Raise OpError (code 2) naming every op of ``names`` not in ``known``, and the ops that are."""
    if not names:
        raise OpError(f"no op named: expected one or more of {', '.join(sorted(known))}", 2)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise OpError(f"unknown DeepSpeed op(s) {', '.join(map(repr, unknown))}: this node's DeepSpeed has "
                      f"{', '.join(sorted(known))}", 2)


def library_state(path: Path) -> tuple[int, int] | None:
    """The built library's identity (inode, modification time), or None while there is none."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _installed(name: str) -> bool:
    """Whether DeepSpeed was installed with op ``name`` compiled in for this node's accelerator (as builder.load
    decides)."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import accelerator_name, installed_ops

    return bool(installed_ops.get(name, False)) and accelerator_name == get_accelerator()._name


def _incompatible(builder: Any) -> str | None:
    """Why ``builder`` cannot build its op on this node, or None when it can."""
    if builder.is_compatible(verbose=False):
        return None
    return builder.error_log or "its builder says it is not compatible with this node"


class _LookingOs:
    """``os`` as torch.utils.cpp_extension sees it while :func:`_library` looks: the same module, except that
    ``makedirs`` makes nothing."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    @staticmethod
    def makedirs(*_args: Any, **_kwargs: Any) -> None:
        return None


def _library(name: str, make: bool = True) -> Path:
    """Where a JIT load of op ``name`` builds its library: torch's own answer (private, in torch 2.11 and 2.13
    alike: the pinned stack). Torch makes the (empty) build directory when there is none, as a load would;
    with ``make`` False (``--check``, which changes nothing on the node) it makes none."""
    from torch.utils import cpp_extension

    if make:
        return Path(cpp_extension._get_build_directory(name, False)) / f"{name}.so"
    real = cpp_extension.os
    # For the microseconds of the call a JIT build on another thread of this process would not make its directory:
    # the callers (this CLI; a rank just before its own load of the op, clear_stale_lock) build nothing meanwhile
    cpp_extension.os = _LookingOs(real)
    try:
        return Path(cpp_extension._get_build_directory(name, False)) / f"{name}.so"
    finally:
        cpp_extension.os = real


#: A build lock this old is a killed build's (builds take minutes): torch's next build would wait on it for ever.
STALE_LOCK_S = 3600.0


def clear_stale_lock(name: str, older_than: float = STALE_LOCK_S) -> Path | None:
    """Remove torch's build lock of op ``name`` when it is ``older_than`` seconds old or more, and return it
    (else None). A build killed midway (a job stopped in its start-up, ``scancel``, a node step's time limit)
    leaves the lock in the extension cache, which outlives jobs, and torch's next build of the op waits for it
    to go, for ever: the job hangs in its optimizer, the node's provisioning in its ops task. A younger lock may
    be a build running now, and stays."""
    lock = _library(name, make=False).parent / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:
        return None
    if age < older_than:
        return None
    with contextlib.suppress(FileNotFoundError):
        lock.unlink()
    return lock


def look(name: str, builder: Any) -> dict[str, Any]:
    """Where op ``name`` stands on this node, building nothing: its ``--check`` line. A missing op is
    ``buildable`` when its builder is compatible with this node and the C++ compiler torch would call
    (``$CXX``, else ``c++``) and ninja are there: a job's load without them fails. (Whether the compiler then
    succeeds is known only by building: ``ray_node__deepspeed_ops`` does that when the node is provisioned.)"""
    if _installed(name):
        return {"op": name, "state": "installed", "path": None}
    library = _library(name, make=False)
    if library.exists():
        return {"op": name, "state": "cached", "path": str(library)}
    from torch.utils.cpp_extension import is_ninja_available

    why = [reason] if (reason := _incompatible(builder)) else []
    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        why.append(f"no C++ compiler {cxx!r} on PATH")
    if not is_ninja_available():
        why.append("no ninja on PATH")
    found = {"op": name, "state": "missing", "path": str(library), "buildable": not why}
    return {**found, "why": "; ".join(why)} if why else found


def build(name: str, builder: Any) -> dict[str, Any]:
    """Load op ``name`` with its ``builder`` (compiling it if the cache lacks it); its result line."""
    t0 = time.monotonic()
    if _installed(name):
        module = builder.load(verbose=False)
        return {"op": name, "state": "installed", "seconds": round(time.monotonic() - t0, 3),
                "path": getattr(module, "__file__", None)}
    reason = _incompatible(builder)
    if reason:
        raise OpError(f"DeepSpeed op {name!r} cannot be built on this node: {reason}")
    library = _library(name)
    if (lock := clear_stale_lock(name)) is not None:
        print(f"deepspeed_ops: removed {lock}, a build lock {STALE_LOCK_S / 3600:g} h old or more (a killed "
              "build's; torch would wait for it for ever)", file=sys.stderr)
    before = library_state(library)
    try:
        module = builder.load(verbose=False)
    except Exception as e:  # the compiler's or ninja's error, whatever its type
        lines = [line for line in str(e).splitlines() if line.strip()]
        raise OpError(f"DeepSpeed op {name!r} did not build in {library.parent}: "
                      + " | ".join(lines[-12:]) + " (a JIT build needs a C++ compiler, such as build-essential's, "
                      "and ninja on PATH)") from e
    after = library_state(library)
    return {"op": name, "state": "cached" if before is not None and before == after else "built",
            "seconds": round(time.monotonic() - t0, 3), "path": getattr(module, "__file__", str(library))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.deepspeed_ops", description=__doc__.split("\n\n")[0])
    ap.add_argument("ops", nargs="*", metavar="OP", help="DeepSpeed op names, such as cpu_adam")
    ap.add_argument("--check", action="store_true", help="build nothing: say whether each op is built, and if "
                    "not whether it could be")
    args = ap.parse_args(argv)
    try:
        known = known_ops()
        check_names(args.ops, known)
        for name in dict.fromkeys(args.ops):  # each once, in the order given
            print(json.dumps((look if args.check else build)(name, known[name])), flush=True)
    except OpError as e:
        print(f"deepspeed_ops: {e}", file=sys.stderr)
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
