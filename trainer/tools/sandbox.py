"""Run untrusted Python in a fresh, isolated process: the Python tool's sandbox (code-interpreter RL).

Each :meth:`Sandbox.run` is a fresh process, forked for it by the sandbox's server (``python -I -S
_sandbox_init.py``, started once per :class:`Sandbox`; it never runs code itself, and forking it costs a few
milliseconds where starting an interpreter per call cost ~10 ms of CPU more, three times the wall time on a
busy 2-core machine). That launcher (see its docstring) puts the code in new user, mount, network, PID, IPC
and UTS namespaces and runs it:

- **no network**: a network namespace of its own, whose only interface (loopback) is down;
- **no writes outside its own directory**: every mount read-only; ``/tmp``, ``/run``, ``/var/tmp`` and
  ``/dev/shm`` covered by empty read-only tmpfs (other jobs' files and sockets are out of sight); the only
  writable place is its work directory ``/tmp/work`` (its cwd, ``$HOME``, ``$TMPDIR``), a tmpfs of
  ``disk_bytes`` that vanishes with it; a /proc of its own PID namespace (no other process is visible);
- **limits** (``setrlimit``): CPU seconds, address space, processes (counted in its own user namespace),
  file size, 64 open files, no core dumps; no capabilities, ``no_new_privs``;
- **wall time**: at ``timeout`` the launcher and its process group are killed (SIGKILL, through a pidfd);
  every process of the sandbox dies with it (each dies with its parent, and the kernel kills a PID namespace whose first process
  ended, whatever session or group a process moved to);
- **output**: stdout and stderr (together, as a terminal shows them) are read up to ``max_output`` bytes;
  the sandbox is killed when it writes more.

What the code can still do: read the files the sandbox's user may read. Its namespace's root is mapped to
``unprivileged_uid`` (nobody) when the worker runs as root, so it reads only world-readable files; an
unprivileged worker can only map its own uid, so the code reads what the worker may read (keep secrets in
files of another user, or run the Ray worker as root). It runs the node's Python (``sys.executable``) without
site-packages (stdlib only) unless ``site_packages``.

What a node needs: Linux with user namespaces (any kernel since 3.8; RLIMIT_NPROC per user namespace since
5.14) that the worker's user may create: ``user.max_user_namespaces`` > 0, and for an unprivileged worker
``kernel.unprivileged_userns_clone=1`` (Debian before 11) / ``kernel.apparmor_restrict_unprivileged_userns=0``
(Ubuntu 24.04). No package and no daemon: the namespaces, mounts and limits are system calls made by the
launcher (``ctypes``); util-linux's ``unshare`` is not needed. :func:`probe` (``python -m trainer.tools.sandbox
--check``) says whether a node can run it; :class:`Sandbox` refuses to start (:class:`SandboxUnavailable`)
rather than run code without isolation.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from trainer.deadlines import Fault

LAUNCHER = Path(__file__).with_name("_sandbox_init.py")
NOBODY = 65534
#: The sandbox's own processes in its user namespace (B and C of the launcher), counted by RLIMIT_NPROC there.
OWN_PROCESSES = 2


class SandboxUnavailable(Fault):  # noqa: N818 - a Fault: the job's one line
    """This node cannot isolate the code (no user namespaces, a mount it cannot make read-only, ...): the
    message names the step that failed and what the node needs."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use."""

    timeout: float = 5.0  # wall seconds
    cpu_s: int = 5  # CPU seconds per process (RLIMIT_CPU)
    memory_bytes: int = 512 << 20  # address space per process (RLIMIT_AS)
    max_procs: int = 8  # processes and threads of the code (RLIMIT_NPROC in its user namespace)
    max_output: int = 16 << 10  # bytes of stdout + stderr read; more kills the run
    disk_bytes: int = 16 << 20  # the work directory's tmpfs; also the largest file (RLIMIT_FSIZE)
    site_packages: bool = False  # the node's site-packages importable (numpy, sympy): ~0.1 s more per run

    def __post_init__(self) -> None:
        if not (self.timeout > 0 and self.cpu_s >= 1 and self.memory_bytes >= 32 << 20 and self.max_procs >= 1
                and self.max_output >= 1 and self.disk_bytes >= 4096):
            raise ValueError(f"sandbox limits out of range: {self}")


@dataclass
class Outcome:
    """What one run did."""

    output: str  # stdout and stderr as written, cut at max_output bytes (decoded with replacement)
    exit_code: int | None  # None when it was killed (timeout, output)
    timed_out: bool = False
    truncated: bool = False  # it wrote more than max_output
    seconds: float = 0.0


def _ids() -> tuple[int, int]:
    """The ids the sandbox's root maps to outside: nobody when this process is root, else its own."""
    if os.geteuid() == 0:
        return NOBODY, NOBODY
    return os.geteuid(), os.getegid()


class Sandbox:
    """Runs code under :class:`SandboxLimits` (see the module docstring); thread-safe (each run is its own process,
    forked by the sandbox's server: :mod:`trainer.tools._sandbox_init`, started at the first run and again if
    it died; it ends with this process)."""

    def __init__(self, limits: SandboxLimits | None = None, python: str | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.python = os.path.abspath(python or sys.executable)
        self.uid, self.gid = _ids()
        self._lock = threading.Lock()
        self._server: subprocess.Popen | None = None
        self._sock: socket.socket | None = None

    def _start_server(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [self.python, "-I", *(() if self.limits.site_packages else ("-S",)), str(LAUNCHER), str(theirs.fileno())]
        try:
            self._server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                                            start_new_session=True, cwd="/",
                                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"})
        except OSError as e:
            ours.close()
            raise SandboxUnavailable(f"python sandbox: cannot start {self.python}: {e}") from None
        finally:
            theirs.close()
        self._sock = ours

    def _send(self, config: dict, fds: list[int]) -> None:
        """The request to the server (started, or started again when it died)."""
        msg = json.dumps(config).encode()
        with self._lock:
            for attempt in range(2):
                if self._server is None or self._server.poll() is not None:
                    self.close_server()
                    self._start_server()
                try:
                    self._sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                    return
                except OSError:
                    if attempt:
                        raise SandboxUnavailable(f"python sandbox: the server ({self.python}) does not take "
                                                 "requests") from None
                    self.close_server()

    def close_server(self) -> None:
        """Stop the server (its running launchers die with it); the next run starts a new one."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._server.pid, signal.SIGKILL)
            self._server.wait()
            self._server = None

    def run(self, code: str) -> Outcome:
        """Run ``code``; raises :class:`SandboxUnavailable` when the isolation could not be set up (the code
        did not run). Anything the code does (errors, limits hit, a timeout) is in the :class:`Outcome`."""
        lim = self.limits
        config = {"cpu": lim.cpu_s, "memory": lim.memory_bytes, "nproc": lim.max_procs + OWN_PROCESSES,
                  "fsize": lim.disk_bytes, "disk": lim.disk_bytes, "uid": self.uid, "gid": self.gid}
        code_r, code_w = os.pipe()
        out_r, out_w = os.pipe()
        status_r, status_w = os.pipe()
        t0 = time.monotonic()
        ours = [code_w, out_r, status_r]  # each closed exactly once: a descriptor closed twice may be another thread's
        try:
            self._send(config, [code_r, out_w, status_w])
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in (code_r, out_w, status_w):
                os.close(fd)
        writer = [code_w]  # emptied by _read once the code is written and its pipe closed
        try:
            return self._read(code.encode("utf-8", "replace"), writer, out_r, status_r, t0)
        finally:
            for fd in (*writer, out_r, status_r):
                os.close(fd)

    def _read(self, code: bytes, writer: list[int], out_r: int, status_r: int, t0: float) -> Outcome:
        code_w = writer[0]
        lim = self.limits
        deadline = t0 + lim.timeout
        out, status = bytearray(), bytearray()
        for fd in (code_w, out_r, status_r):
            os.set_blocking(fd, False)
        reading, writing = [out_r, status_r], [code_w]
        timed_out = truncated = False
        launcher: int | None = None
        while not (b"\nerror" in b"\n" + status
                   or (out_r not in reading and (b"\nexit " in b"\n" + status or status_r not in reading))):
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            readable, writable, _ = select.select(reading, writing, [], left)
            if writable:
                written = os.write(code_w, code)
                code = code[written:]
                if not code:
                    writer.clear()
                    os.close(code_w)
                    writing = []
            for f in readable:
                chunk = os.read(f, 65536)
                if not chunk:
                    reading.remove(f)
                (out if f == out_r else status).extend(chunk)
            if launcher is None and status.startswith(b"pid "):
                launcher = int(status.split(b"\n", 1)[0][4:])
            if len(out) > lim.max_output:
                truncated = True
                break
        lines = bytes(status).decode(errors="replace").splitlines()
        if launcher is not None and (timed_out or truncated or not any(ln.startswith("exit ") for ln in lines)):
            _kill(launcher)
        if any(ln.startswith("error") for ln in lines) or (not timed_out and "ok" not in lines):
            why = next((ln for ln in lines if ln.startswith("error")), None) or (
                f"the launcher ended before the code ran: {bytes(out[-300:]).decode(errors='replace').strip()}")
            raise SandboxUnavailable(f"python sandbox: {why}; the code was not run (the node needs user namespaces: "
                                     "see trainer.tools.sandbox, python -m trainer.tools.sandbox --check)")
        exit_code = next((int(ln[5:]) for ln in lines if ln.startswith("exit ")), None)
        if exit_code is None and not truncated:
            timed_out = True
        return Outcome(bytes(out[:lim.max_output]).decode("utf-8", "replace"), exit_code, timed_out, truncated,
                       time.monotonic() - t0)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close_server()


def _kill(pid: int) -> None:
    """SIGKILL to a run's launcher (through a pidfd: never another process that got its pid) and its process group;
    the processes that left the group die with their parents and their PID namespace."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


def probe(limits: SandboxLimits | None = None, python: str | None = None) -> str:
    """One run that checks the isolation: PID 1 of its own namespace, only a loopback interface, and a socket
    this process listens on (loopback) unreachable from there. Returns a line saying so, or raises
    :class:`SandboxUnavailable` naming what failed."""
    import socket

    sandbox = Sandbox(limits, python)
    try:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            port = listener.getsockname()[1]
            outcome = sandbox.run(
                "import os, socket\n"
                f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2); net = 'REACHED'\n"
                "except OSError:\n    net = 'unreachable'\n"
                "print(os.getppid(), ','.join(n for _, n in socket.if_nameindex()), net)")
    finally:
        sandbox.close_server()
    words = outcome.output.split()
    if outcome.exit_code != 0 or words != ["1", "lo", "unreachable"]:
        raise SandboxUnavailable(f"python sandbox: the probe did not run isolated with {sandbox.python} (exit "
                                 f"{outcome.exit_code}): {outcome.output[-300:]!r}; expected '1 lo unreachable' (the "
                                 "code's parent is PID 1 of its namespace, only a loopback that is down)"
                                 + (f"; the sandbox runs as uid {sandbox.uid}: can it read {sandbox.python} and its "
                                    "standard library? (--python_executable)" if "Error" in outcome.output else ""))
    return (f"python sandbox ok ({sandbox.python}, its root mapped to uid {sandbox.uid}): own PID namespace, no "
            f"network, read-only filesystem but /tmp/work; {outcome.seconds:.3f} s a run")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainer.tools.sandbox",
                                     description="Check that this node can run the python tool's sandbox.")
    parser.add_argument("--check", action="store_true", help="run one isolated probe and say what works")
    parser.add_argument("--python", default=None, help="the interpreter the sandbox runs (default: the tool's)")
    args = parser.parse_args(argv)
    if not args.check:
        parser.print_help()
        return 2
    try:
        from trainer.tools.python import default_python

        print(probe(python=args.python or default_python()))
    except SandboxUnavailable as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
