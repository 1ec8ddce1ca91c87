"""Each host's address (cluster__node_address, else ansible_host): an IPv4 address of a host; across the Ray
nodes, each its own and no loopback address in a cluster that spans machines."""

from __future__ import annotations

import ipaddress

from rlrun.checks.problems import NOTHING, Recorder
from rlrun.checks.shapes import ipv4_problem
from rlrun.checks.vocabulary import N
from rlrun.inventory_view import UNKNOWN


def check_address(r: Recorder, host: str) -> None:
    raw = r.raw(host)
    var = N.node_address if N.node_address in raw else "ansible_host" if "ansible_host" in raw else None
    if var is None:
        r.add(host, N.node_address, NOTHING, f"is not set, nor ansible_host: set {N.node_address} (the IPv4 "
              "address the other nodes reach this host on)", where=(r.view.hosts_file, None))
        return
    value = r.value(host, var)
    if value is UNKNOWN:
        return
    problem = ipv4_problem(value)
    if problem:
        hint = "" if var == N.node_address else f" ({N.node_address} is not set, so ansible_host is used)"
        r.add(host, var, raw[var], problem + hint)
    elif str(value) == "127.0.0.1":
        r.add(host, var, raw[var], "Ray replaces 127.0.0.1 by the host's external address: use another "
              "loopback address (127.0.0.2) on one machine, the cluster network's address otherwise")


def check_addresses(r: Recorder, nodes: list[str]) -> None:
    """Unique among the Ray nodes; loopback only where every host is this machine."""
    addresses: dict[str, str] = {}
    for host in nodes:
        raw = r.raw(host)
        var = N.node_address if N.node_address in raw else "ansible_host"
        value = r.value(host, var) if var in raw else None
        if isinstance(value, str) and not ipv4_problem(value):
            if value in addresses:
                r.add(host, var, value, f"is also the address of {addresses[value]}: every Ray node needs its own "
                      "address")
            else:
                addresses[value] = host
    # a host whose SSH address is another machine's makes this a cluster of several machines
    elsewhere = [h for h in nodes if r.raw(h).get("ansible_connection", "ssh") != "local"
                 and isinstance(r.raw(h).get("ansible_host"), str)
                 and not ipv4_problem(r.raw(h)["ansible_host"])
                 and not ipaddress.ip_address(r.raw(h)["ansible_host"]).is_loopback]
    if len(nodes) > 1 and elsewhere:
        for address, host in addresses.items():
            if ipaddress.ip_address(address).is_loopback:
                r.add(host, N.node_address if N.node_address in r.raw(host) else "ansible_host", address,
                      f"is a loopback address in a cluster that spans machines ({', '.join(elsewhere)} reached "
                      "over SSH elsewhere): the other nodes cannot reach it; use its address on the cluster network")
