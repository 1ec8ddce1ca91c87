"""The python tool's sandbox (trainer.tools.sandbox) against code that tries to escape each limit: a socket to a
listener this test opens on loopback, writes outside its directory, a fork bomb, 10 GB, 100 MB of output, a sleep
for ever (also from a child that left the session), remounting the filesystem read-write from a nested user
namespace, signalling this process. Every try fails, the run ends within its limits, nothing it started is left,
and through the tool (trainer.tools.python) each is a result text the model reads: the batch goes on and the next
call works. Real processes, real namespaces (the test machine runs as root: the sandbox's root is nobody)."""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from trainer.tools.python import Python, default_python
from trainer.tools.sandbox import Sandbox, SandboxLimits, SandboxUnavailable, probe

pytestmark = pytest.mark.integration

LIMITS = SandboxLimits(timeout=4.0, cpu_s=2, memory_bytes=256 << 20, max_procs=8, max_output=4096, disk_bytes=1 << 20)


@pytest.fixture(scope="module")
def sandbox():
    try:
        probe(LIMITS, default_python())
    except SandboxUnavailable as e:  # the machines this project tests on have user namespaces: say so loudly
        pytest.fail(f"this machine cannot run the sandbox: {e}")
    return Sandbox(LIMITS, default_python())


def _tagged(tag: str) -> str:
    """Code that names its process ``tag`` (and children it forks inherit the name): to find leftovers."""
    return f"import ctypes\nctypes.CDLL(None).prctl(15, ctypes.c_char_p({tag!r}.encode()), 0, 0, 0)\n"


def _alive(tag: str) -> list[int]:
    """PIDs of processes named ``tag`` (any namespace: /proc here is the host's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == tag[:15]:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_no_network_even_to_a_loopback_listener(sandbox):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        out = sandbox.run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('CONNECTED')")
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing came in
    assert out.exit_code == 1 and "CONNECTED" not in out.output and "OSError" in out.output
    names = sandbox.run("import socket; print(sorted(n for _, n in socket.if_nameindex()))")
    assert names.output.strip() == "['lo']"


def test_no_writes_outside_its_own_directory(sandbox, tmp_path):
    target = tmp_path / "escape.txt"  # a directory this process can write: the sandbox must not
    code = "\n".join([
        "import os",
        f"for p in [{str(target)!r}, '/tmp/escape-{uuid.uuid4().hex}', '/escape-{uuid.uuid4().hex}', "
        "os.path.expanduser('~root/escape')]:",
        "    try:",
        "        open(p, 'w').write('x'); print('WROTE', p)",
        "    except OSError as e:",
        "        print('refused', p, e.errno)",
        "open('mine.txt', 'w').write('ok'); print('cwd', os.getcwd(), open('mine.txt').read())",
        "print('tmp', os.listdir('/tmp'), 'shm', os.listdir('/dev/shm'))",
    ])
    out = sandbox.run(code)
    assert out.exit_code == 0, out.output
    assert "WROTE" not in out.output and out.output.count("refused") == 4
    assert "cwd /tmp/work ok" in out.output
    assert "tmp ['work'] shm []" in out.output  # the host's /tmp and /dev/shm are not even visible
    assert not target.exists()


def test_a_fork_bomb_hits_the_process_limit_and_leaves_nothing(sandbox):
    tag = f"sbx{uuid.uuid4().hex[:8]}"
    code = _tagged(tag) + "\n".join([
        "import os, time",
        "n = 0",
        "while True:",
        "    try:",
        "        os.fork(); n += 1",
        "    except OSError as e:",
        "        print('fork refused after', n, e.errno, flush=True); time.sleep(30)",
    ])
    t0 = time.monotonic()
    out = sandbox.run(code)
    assert time.monotonic() - t0 < LIMITS.timeout + 3 and out.timed_out
    assert "fork refused" in out.output and "11" in out.output  # EAGAIN
    time.sleep(0.5)
    assert _alive(tag) == []


def test_memory_output_cpu_and_wall_limits(sandbox):
    big = sandbox.run("x = bytearray(10 * 2**30)\nprint('ALLOCATED')")
    assert big.exit_code == 1 and "MemoryError" in big.output and "ALLOCATED" not in big.output
    t0 = time.monotonic()
    flood = sandbox.run("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 2**20)")
    assert flood.truncated and len(flood.output) == LIMITS.max_output and time.monotonic() - t0 < LIMITS.timeout
    spin = sandbox.run("while True:\n    pass")
    assert spin.exit_code == 128 + 24 or spin.timed_out  # SIGXCPU at 2 CPU-seconds, or the wall clock on a busy box
    tag = f"sbx{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    sleeper = sandbox.run(_tagged(tag) + "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1000)\n"
                          "time.sleep(1000)")
    assert sleeper.timed_out and sleeper.exit_code is None and time.monotonic() - t0 < LIMITS.timeout + 3
    time.sleep(0.5)
    assert _alive(tag) == []  # the child that left the session died with the PID namespace


def test_a_child_left_behind_by_finished_code_dies_with_it(sandbox):
    tag = f"sbx{uuid.uuid4().hex[:8]}"
    out = sandbox.run(_tagged(tag) + "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1000)\n"
                      "print('parent done')")
    assert out.exit_code == 0 and out.output.strip() == "parent done" and out.seconds < LIMITS.timeout
    time.sleep(0.5)
    assert _alive(tag) == []


def test_no_way_back_to_a_writable_root_or_to_this_process(sandbox):
    code = "\n".join([
        "import ctypes, os, signal",
        "libc = ctypes.CDLL(None, use_errno=True)",
        "print('remount', libc.mount(None, b'/', None, 32 | 4096, None))",  # MS_REMOUNT | MS_BIND, read-write
        "print('nested userns', libc.unshare(0x10000000 | 0x00020000))",
        "print('remount again', libc.mount(None, b'/', None, 32 | 4096, None))",
        "print('umount /tmp', libc.umount2(b'/tmp', 2))",
        "try:",
        f"    os.kill({os.getpid()}, signal.SIGTERM); print('SIGNALLED')",
        "except OSError as e:",
        "    print('kill refused', e.errno)",
        "print('procs', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
    ])
    out = sandbox.run(code)
    lines = out.output.splitlines()
    assert "remount -1" in lines and "remount again -1" in lines and "umount /tmp -1" in lines, out.output
    assert "SIGNALLED" not in out.output and "kill refused 3" in out.output  # no such process in its namespace
    assert "procs [1, 2]" in out.output  # only its own init and itself


def test_through_the_tool_every_escape_is_a_result_and_the_batch_goes_on():
    tool = Python(LIMITS, parallel=4)
    tool.check()
    tries = ["import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)",
             "open('/tmp/x', 'w')",
             "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        break",
             "bytearray(10 * 2**30)",
             "print('x' * 10**8)",
             "import time; time.sleep(1000)",
             "",
             "print(123 * 456)"]
    t0 = time.monotonic()
    results = tool.call_batch([{"code": c} for c in tries])
    took = time.monotonic() - t0
    tool.close()
    texts = [r.text for r in results]
    assert "OSError" in texts[0] and results[0].error
    assert "Read-only file system" in texts[1]
    assert results[2].text  # the bomb's processes ran out; whatever they printed, the call returned
    assert "MemoryError" in texts[3]
    assert texts[4].endswith(f"error: output cut at {LIMITS.max_output} bytes") and len(texts[4]) < LIMITS.max_output + 64
    assert texts[5] == f"error: timed out after {LIMITS.timeout:g} s" and results[5].timed_out
    assert texts[6] == "error: no code to run"
    assert texts[7] == "56088" and not results[7].error
    assert took < 2 * LIMITS.timeout + 5


def test_the_interpreter_must_be_readable_by_the_sandbox_user(tmp_path):
    from trainer.tools.python import readable_by_others

    open_dir, closed_dir = tmp_path / "open", tmp_path / "closed"
    open_dir.mkdir(mode=0o755)
    closed_dir.mkdir(mode=0o700)
    for d in (open_dir, closed_dir):
        (d / "python3").write_text("")
        (d / "python3").chmod(0o755)
    os.chmod(tmp_path, 0o755)
    assert readable_by_others(str(open_dir / "python3")) is all(
        p.stat().st_mode & 0o001 for p in open_dir.parents)  # pytest's tmp root may itself be private
    assert not readable_by_others(str(closed_dir / "python3"))
    assert readable_by_others(default_python()) or os.geteuid() != 0


def test_concurrent_runs_each_get_their_own_output():
    """Many runs at once through one server: each result is its own code's (a descriptor closed twice by one
    run's thread once ended another's pipe: every call of a trainer's rollout came back as an error)."""
    tool = Python(LIMITS, parallel=6)
    for _ in range(2):
        results = tool.call_batch([{"code": f"print({i} * {i})"} for i in range(48)])
        assert [r.text for r in results] == [str(i * i) for i in range(48)]
        assert not any(r.error for r in results)
    tool.sandbox.close_server()  # a server that died is started again at the next run
    (again,) = tool.call_batch([{"code": "print('again')"}])
    assert again.text == "again"
    tool.close()
