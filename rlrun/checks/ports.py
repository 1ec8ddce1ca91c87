"""A host's ports: each fixed port a number in 1024-65535, none equal to another of the host's, none inside
a range of a Ray node (worker, rendezvous, ephemeral: roles/cluster's cluster__port_range_specs), each range at
least its fewest ports wide and clear of the others."""

from __future__ import annotations

from rlrun.checks import vocabulary as V
from rlrun.checks.problems import Recorder
from rlrun.checks.shapes import is_int, whole
from rlrun.checks.vocabulary import N
from rlrun.inventory_view import UNKNOWN

PORT = "must be a port number: a whole number from 1024 to 65535"
# Why a fixed port may not lie inside each range (a range the roles add later gets the plain message).
INSIDE = {"rendezvous": "the jobs' rendezvous stores take them",
          "ephemeral": "the kernel hands them to outgoing connections, and Gloo and NCCL listen there"}


def _port(value) -> bool:
    return not isinstance(value, bool) and is_int(value) and 1024 <= int(value) <= 65535


def check_ports(r: Recorder, host: str, is_node: bool, is_head: bool, is_reward: bool, is_retriever: bool) -> None:
    wanted = (list(V.head_ports()) if is_head else []) + (list(V.node_ports()) if is_node else []) + \
             ([N.reward_port] if is_reward else []) + ([N.retriever_port] if is_retriever else [])
    numbers: dict[str, int] = {}
    for var in wanted + ([N.min_worker_port, N.max_worker_port] if is_node else []):
        value = r.value(host, var)
        if value is UNKNOWN or value is None:
            continue
        if not _port(value):
            r.add(host, var, r.raw(host).get(var, value), PORT)
            continue
        numbers[var] = int(value)
    if is_node:
        _ranges(r, host, wanted, numbers)
    seen: dict[int, str] = {}
    for var in wanted:
        if var not in numbers:
            continue
        port = numbers[var]
        if port in seen:
            r.add(host, var, port, f"is also {seen[port]} on this host: every port must differ")
        else:
            seen[port] = var


def _ranges(r: Recorder, host: str, wanted: list[str], numbers: dict[str, int]) -> None:
    """The node's ranges, in the role's order (worker first): width, overlaps, fixed ports inside."""
    bounds: dict[str, tuple[int, int, V.PortRange]] = {}
    for rng in V.port_ranges():
        if rng.first in numbers or rng.last in numbers:  # the worker range: read and checked as ports above
            if not (rng.first in numbers and rng.last in numbers):
                continue
            low, high = numbers[rng.first], numbers[rng.last]
        else:
            values = [r.value(host, rng.first), r.value(host, rng.last)]
            if not all(whole(v) for v in values):
                continue  # not a number: the variable's type says so
            bad = [(var, v) for var, v in zip((rng.first, rng.last), values, strict=True) if not _port(v)]
            for var, v in bad:
                r.add(host, var, r.raw(host).get(var, v), PORT)
            if bad:
                continue
            low, high = int(values[0]), int(values[1])
        if high - low < rng.min_span - 1:
            r.add(host, rng.last, high, f"must be at least {rng.first} + {rng.min_span - 1} = {low + rng.min_span - 1}"
                  f": the {rng.name} range needs {rng.why} ({rng.min_span} at least)")
        for other, (low2, high2, rng2) in bounds.items():
            if low <= high2 and low2 <= high:
                r.add(host, rng.last, high, f"the {rng.name} port range {low}-{high} ({rng.first}..{rng.last}) "
                      f"overlaps the {other} port range {low2}-{high2} ({rng2.first}..{rng2.last})")
        bounds[rng.name] = (low, high, rng)
        for var in wanted:
            if var in numbers and low <= numbers[var] <= high:
                why = INSIDE.get(rng.name)
                r.add(host, var, numbers[var], f"lies inside the {rng.name} port range {low}-{high} "
                      + (f"({rng.first}-{rng.last}; {why}): move it" if why else
                         f"({rng.first}-{rng.last}): move it or the range"))
