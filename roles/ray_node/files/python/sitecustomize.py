"""rlrun: bind a Ray node's Prometheus metrics servers to the node address.

ray_node installs this file in <state dir>/python and the node's env file puts
that directory on PYTHONPATH, so every Python process of the node loads it.

Ray 2.60 serves three metrics endpoints without authentication: the dashboard
agent's (--metrics-export-port), the dashboard's (DASHBOARD_METRIC_PORT) and the
autoscaler's (AUTOSCALER_METRIC_PORT). It binds them to every interface unless
the node address is a loopback address, and has no option to choose. All three
are socketserver servers (wsgiref, prometheus_client), so here a TCP server that
binds every IPv4 interface ("" or 0.0.0.0) on one of RLRUN_BIND_PORTS binds
RLRUN_BIND_ADDRESS instead. Any other server, port or process is unchanged.

Then the next sitecustomize on sys.path (the one this file shadows) runs, if any.
"""

import os
import sys


def _bind_metrics_to_node_address():
    address = os.environ.get("RLRUN_BIND_ADDRESS", "")
    try:
        ports = {int(p) for p in os.environ.get("RLRUN_BIND_PORTS", "").split(",") if p.strip()}
    except ValueError:
        return
    if not address or not ports:
        return
    import socket
    import socketserver

    original = socketserver.TCPServer.server_bind
    if getattr(original, "_rlrun_bind", False):
        return

    def server_bind(self):
        host, port = self.server_address[0], self.server_address[1]
        if self.address_family == socket.AF_INET and host in ("", "0.0.0.0") and port in ports:
            self.server_address = (address, port)
        return original(self)

    server_bind._rlrun_bind = True
    socketserver.TCPServer.server_bind = server_bind


def _run_next_sitecustomize():
    """Run the sitecustomize this one shadows (the first one after this directory on sys.path)."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    seen_here = False
    for entry in sys.path:
        path = os.path.abspath(entry or os.curdir)
        if path == here:
            seen_here = True
            continue
        candidate = os.path.join(path, "sitecustomize.py")
        if seen_here and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_rlrun_next_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


try:
    _bind_metrics_to_node_address()
    _run_next_sitecustomize()
except Exception as exc:  # site.py's own rule: a failing sitecustomize must not stop Python
    sys.stderr.write(f"rlrun sitecustomize: {type(exc).__name__}: {exc}\n")
