"""roles/ray_node/files/python/sitecustomize.py: in a Ray node's processes, servers that bind every
interface on a metrics port bind the node address instead (Ray's three Prometheus endpoints go
through prometheus_client and wsgiref); other ports, addresses and families are left alone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import PROJECT

HOOK_DIR = PROJECT / "roles" / "ray_node" / "files" / "python"

SERVE = r"""
import json, sys, time, wsgiref.simple_server
import prometheus_client
a, b, c = (int(p) for p in sys.argv[1:4])
app = lambda env, start: []
# prometheus_client: the dashboard's and the autoscaler's metrics (start_http_server, default addr 0.0.0.0).
prometheus_client.start_http_server(a)
# wsgiref with host "": the dashboard agent's (ray._private.prometheus_exporter.serve_http).
agent = wsgiref.simple_server.make_server("", b, app)
# A port that is not a metrics port keeps its address.
other = wsgiref.simple_server.make_server("", c, app)
print(json.dumps("listening"))
"""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _listeners(pid: int) -> dict[int, str]:
    """port -> local IPv4 address of the listening sockets of `pid`."""
    inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
              if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
    out = {}
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:
            addr, port = f[1].split(":")
            out[int(port, 16)] = socket.inet_ntoa(bytes.fromhex(addr)[::-1])
    return out


def _run(env_extra: dict[str, str], ports: list[int]) -> dict[int, str]:
    env = {**os.environ, "PYTHONPATH": str(HOOK_DIR), **env_extra}
    script = SERVE + "sys.stdout.flush()\ntime.sleep(30)\n"
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, ports)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.poll() is not None else "no output"
        json.loads(line)
        return _listeners(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_metrics_ports_bind_the_node_address_and_other_ports_do_not():
    a, b, c = _free_ports(3)
    bound = _run({"RLRUN_BIND_ADDRESS": "127.0.0.7", "RLRUN_BIND_PORTS": f"{a},{b}"}, [a, b, c])
    assert bound == {a: "127.0.0.7", b: "127.0.0.7", c: "0.0.0.0"}


def test_without_the_variables_nothing_changes():
    a, b, c = _free_ports(3)
    assert _run({"RLRUN_BIND_PORTS": f"{a},{b}"}, [a, b, c]) == {a: "0.0.0.0", b: "0.0.0.0", c: "0.0.0.0"}


def test_a_shadowed_sitecustomize_still_runs(tmp_path):
    """The hook shadows any other sitecustomize (a distribution's); it runs that one after itself."""
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE_RAN'] = '1'\n")
    env = {**os.environ, "PYTHONPATH": f"{HOOK_DIR}{os.pathsep}{other}", "RLRUN_BIND_ADDRESS": "127.0.0.7",
           "RLRUN_BIND_PORTS": "9"}
    out = subprocess.run([sys.executable, "-c", "import os, socketserver; print(os.environ.get('OTHER_SITECUSTOMIZE_RAN'),"
                          " getattr(socketserver.TCPServer.server_bind, '_rlrun_bind', False))"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "True"], out.stderr
