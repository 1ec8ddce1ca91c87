"""The sandbox's processes: a server that forks a launcher per run, which isolates the run, then runs the code it
read. Standard library only, run as ``python -I -S _sandbox_init.py SOCKET_FD`` by
:class:`trainer.tools.sandbox.Sandbox` (never imported). The server is one per sandbox, started once; it never
runs code, and each run is a fresh process forked from it (no interpreter start per call: ~10 ms less CPU).

Per run, processes each killed when its parent dies (``PR_SET_PDEATHSIG``):

- A (the launcher, a session leader of its own, forked by the server): says its pid on the status pipe, reads
  the code, forks B, writes B's user-namespace id maps (its namespace's root is mapped to ``uid``/``gid``
  outside: an unprivileged id when the server runs as root, its own id otherwise), waits for B and says
  ``exit N``;
- B: a new user namespace (``unshare(CLONE_NEWUSER)``), then new mount, network, PID, IPC and UTS namespaces;
  forks C and waits for it;
- C, PID 1 of the new PID namespace: makes every mount read-only, covers ``/tmp``, ``/run``, ``/var/tmp`` and
  ``/dev/shm`` with empty read-only tmpfs, mounts the work directory (a tmpfs of ``disk`` bytes, the only
  writable place) at ``/tmp/work``, mounts a /proc of its own, closes every other file, sets the resource
  limits (CPU seconds, address space, processes, file size, open files, no core), drops every capability
  (bounding set, capset, ``SECBIT_NOROOT``, ``no_new_privs``), clears the environment, says ``ok`` on the
  status pipe and forks D, which runs the code as ``__main__`` (a process like any other: PID 1 would ignore
  the signals it has no handler for, SIGXCPU among them). When D ends, C ends, and the kernel kills whatever
  else runs in the PID namespace.

Any step that fails writes ``error: <step>: <reason>`` on the status pipe and exits 1 before any code runs:
the code never runs with less isolation than this. The network namespace has only a loopback that is down.
"""

import ctypes
import json
import os
import re
import resource
import select
import signal
import sys
import traceback

# Everything this file uses is imported above: once the ids are switched, the interpreter's own files may be
# out of reach (the sandbox's user reads only world-readable files).

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
# statvfs f_flag bits -> the mount flags a remount must keep (a user namespace may not clear locked ones)
KEEP = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 1, 24, 28, 38
# SECBIT_NOROOT, NO_SETUID_FIXUP, KEEP_CAPS, NO_CAP_AMBIENT_RAISE and their locks
SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20 | 0x40 | 0x80
# Empty, read-only tmpfs over these: other jobs' files and sockets (Ray's, a docker socket) stay out of sight.
COVER = ("/tmp", "/run", "/var/tmp", "/dev/shm")
WORK = "/tmp/work"

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def check(result: int, step: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{step}: {os.strerror(err)} (errno {err})")


def _enc(text):
    return None if text is None else text.encode()


def mount(source, target, fstype, flags, data=None, step=None):
    enc = _enc
    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
          step or f"mount {fstype or ''} {target}")


def die_with_parent(parent: int | None = None, alive: int | None = None) -> None:
    """SIGKILL when the parent dies; exits at once when it already died: its pid is no longer the parent's, or
    (a parent outside this PID namespace, whose pid reads 0 here) the pipe ``alive`` it holds open is closed."""
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if (parent is not None and os.getppid() != parent) or (alive is not None and select.select([alive], [], [], 0)[0]):
        os._exit(1)


def mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in f]
    seen, out = set(), []
    for p in points:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def covered(path: str) -> bool:
    return any(path == c or path.startswith(c + "/") for c in (*COVER, "/proc"))


def isolate_filesystem(disk: int) -> None:
    """Every mount read-only (those under the covered directories are hidden instead), the covers, the work
    tmpfs, a /proc of this PID namespace."""
    mount(None, "/", None, MS_REC | MS_PRIVATE, step="make / private")
    for point in mount_points():
        if covered(point):
            continue
        try:
            flags = os.statvfs(point).f_flag
        except OSError:
            continue  # gone, or not reachable: nothing to write through
        if flags & os.ST_RDONLY:
            continue
        keep = sum(ms for st, ms in KEEP if flags & st)
        mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep, step=f"remount {point} read-only")
    covers = [c for c in COVER if os.path.isdir(c) and not os.path.islink(c)]
    for c in covers:
        mount("tmpfs", c, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
    os.mkdir(WORK, 0o700)
    mount("tmpfs", WORK, "tmpfs", MS_NOSUID | MS_NODEV, f"size={max(disk, 4096)},mode=0700")
    for c in covers:
        mount(None, c, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, step=f"remount {c} read-only")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def limit(config: dict) -> None:
    cpu = int(config["cpu"])
    for what, soft, hard in ((resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_AS, config["memory"], None),
                             (resource.RLIMIT_NPROC, config["nproc"], None), (resource.RLIMIT_FSIZE, config["fsize"], None),
                             (resource.RLIMIT_NOFILE, 64, None), (resource.RLIMIT_CORE, 0, None)):
        resource.setrlimit(what, (int(soft), int(soft if hard is None else hard)))


def drop_capabilities() -> None:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    check(libc.prctl(PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0), "prctl(PR_SET_SECUREBITS)")
    for cap in range(last + 1):
        check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"prctl(PR_CAPBSET_DROP, {cap})")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    check(libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "capset (drop all)")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def run_code(code: str) -> int:
    """The code as a script's ``__main__`` would run; its exit status (1 and the traceback on an exception)."""
    sys.argv = ["<python>"]
    sys.stdout.reconfigure(line_buffering=True)
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<python>", "exec"), scope)  # noqa: S102 - the point of the sandbox
    except SystemExit as e:
        code = e.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException as e:  # noqa: BLE001 - reported as Python would, without this file's frame
        sys.stdout.flush()
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def in_pid_namespace(config: dict, status: int, code: str) -> None:
    """C: the filesystem, the limits, no capabilities, then the code."""
    try:
        isolate_filesystem(int(config["disk"]))
        os.closerange(3, status)
        os.closerange(status + 1, 1 << 20)
        limit(config)
        drop_capabilities()
        os.chdir(WORK)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORK, "TMPDIR": WORK, "LANG": "C.UTF-8",
                           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    except Exception as e:  # noqa: BLE001 - any failure here: the code does not run
        os.write(status, f"error: {type(e).__name__}: {e}\n".encode())
        os._exit(1)
    os.write(status, b"ok\n")
    os.close(status)
    code_process = os.fork()  # not PID 1, which ignores the signals it has no handler for (SIGXCPU, SIGTERM)
    if code_process == 0:
        os._exit(run_code(code))
    os._exit(exit_status(os.waitpid(code_process, 0)[1]))


def exit_status(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def launch(config: dict, status: int, server: int) -> None:
    """A, forked by the server for one run: fd 0 the code, 1 and 2 the output pipe, ``status`` the status pipe
    (``pid A``, then ``ok`` from C once the code starts, ``exit N`` when it ended, or ``error: ...``)."""
    launcher = os.getpid()
    try:
        os.setsid()
        die_with_parent(server)
        os.write(status, f"pid {launcher}\n".encode())
        code = sys.stdin.read()
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        b_reads, a_writes = os.pipe()
        a_reads, b_writes = os.pipe()
    except (SetupError, OSError) as e:
        os.write(status, f"error: start: {e}\n".encode())
        os._exit(1)
    b = os.fork()
    if b == 0:  # B
        try:
            os.close(a_writes)
            os.close(a_reads)
            die_with_parent(launcher)
            check(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
            os.write(b_writes, b"u")
            if os.read(b_reads, 1) != b"m":
                raise SetupError("the launcher could not write the user namespace's id maps")
            os.setresgid(0, 0, 0)  # become the mapped ids (the credentials still hold the ones from before)
            os.setresuid(0, 0, 0)
            check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS),
                  "unshare(mount, network, PID, IPC, UTS namespaces)")
        except (SetupError, OSError) as e:
            os.write(status, f"error: {e}\n".encode())
            os._exit(1)
        alive_r, alive_w = os.pipe()
        c = os.fork()
        if c == 0:  # C: PID 1 of the new namespace
            try:
                os.close(alive_w)
                die_with_parent(alive=alive_r)
                os.close(alive_r)
            except SetupError as e:
                os.write(status, f"error: {e}\n".encode())
                os._exit(1)
            in_pid_namespace(config, status, code)
        os.close(status)
        os.close(alive_r)
        os._exit(exit_status(os.waitpid(c, 0)[1]))
    # A
    os.close(b_writes)
    os.close(b_reads)
    try:
        if os.read(a_reads, 1) == b"u":
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {config['uid']} 1"),
                               ("gid_map", f"0 {config['gid']} 1")):
                with open(f"/proc/{b}/{name}", "w") as f:
                    f.write(text)
            os.write(a_writes, b"m")
    except OSError as e:
        os.write(status, f"error: user namespace id maps ({config['uid']}:{config['gid']}): {e}\n".encode())
        os.kill(b, signal.SIGKILL)
    code = exit_status(os.waitpid(b, 0)[1])
    os.write(status, f"exit {code}\n".encode())
    os._exit(code)


def serve(sock_fd: int) -> None:
    """The server: one request per message on the socket (a JSON config, and three descriptors: the code's pipe,
    the output pipe, the status pipe); each forks a launcher (A) and is forgotten (children are reaped by the
    kernel). It never runs code itself; it ends when the socket's other end closes (the tool's process ended),
    and its launchers die with it."""
    import array
    import socket

    sock = socket.socket(fileno=sock_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # no zombies
    server = os.getpid()
    while True:
        fds = array.array("i")
        try:
            msg, ancdata, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(3 * fds.itemsize))
        except InterruptedError:
            continue
        if not msg:
            os._exit(0)
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue
        code_r, out_w, status_w = fds
        if os.fork() == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the code's children are its to wait for
                sock.close()
                for src, dst in ((code_r, 0), (out_w, 1), (out_w, 2)):
                    os.dup2(src, dst)
                os.close(code_r)
                os.close(out_w)
                launch(json.loads(msg), status_w, server)
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)


def main() -> None:
    serve(int(sys.argv[1]))


if __name__ == "__main__":
    main()
