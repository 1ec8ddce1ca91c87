"""The fabric check's findings: its report (``@fabric``, from ``rlrun/fabric/job.py``) held against thresholds.

Pure (no Ray, no cluster): tested on hand-made reports. ``error`` findings make ``rlrun check --fabric``
exit 1 (a job would hang or misbehave); ``warn`` findings are slow paths a job would still run on.

| check | severity | when |
|---|---|---|
| placement / start / job | error | the check could not place or start its ranks |
| link | error | a pair's send/recv or the all-reduce made no progress within the deadline, or failed |
| link | warn | a pair was not tested (one of its ranks still hangs in an earlier test) |
| interface | error | an interface named by the inventory (or, without one there, by the node's environment) in NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME is missing on the node, or down |
| interface | warn | the node's Ray runs with another value than the inventory's (site.yml not re-run) |
| versions | error | the nodes disagree on torch, NCCL or CUDA (as torch reports them) |
| versions | warn | the nodes disagree on Python or Ray |
| bandwidth | warn | an inter-node pair moves less than ``SLOW_FRACTION`` of the line rate of its link (/sys/class/net/IF/speed; an IB port's rate), where the link speed is known |
| infiniband | warn | NCCL used NET/Socket between two nodes that both have an active InfiniBand / RoCE port |
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from trainer.collective_deadline import ifname_matches

SLOW_FRACTION = 0.2  # "far below what the interface should carry": under a fifth of its line rate
DOWN_STATES = {"down", "lowerlayerdown", "notpresent"}  # operstate; "unknown" (lo, tun) carries traffic
IFACE_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
ERROR_VERSIONS = ("torch", "nccl", "cuda")
WARN_VERSIONS = ("python", "ray")


@dataclass(frozen=True)
class Finding:
    severity: str  # error | warn
    check: str
    where: str
    message: str

    def to_json(self) -> dict:
        return asdict(self)


def evaluate(report: Mapping, inventory: Mapping[str, Mapping[str, str | None]] | None = None) -> list[Finding]:
    """Every finding of a fabric report; `inventory` maps a node address to the inventory's interface
    variables for that host (None values: not set there)."""
    found: list[Finding] = []
    for problem in report.get("problems", []):
        found.append(Finding("error", problem.get("check", "job"), "cluster", problem["message"]))
    found += _links(report)
    found += _interfaces(report, inventory or {})
    found += _versions(report)
    found += _bandwidth(report)
    found += _infiniband(report)
    return found


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def _links(report: Mapping) -> list[Finding]:
    out = []
    for pair in report.get("pairs", []):
        where = f"{pair['a']} <-> {pair['b']}"
        status = pair.get("status")
        if status in ("no-progress", "error"):
            out.append(Finding("error", "link", where, pair.get("line") or status))
        elif status == "skipped":
            out.append(Finding("warn", "link", where, f"not tested: {pair.get('why', 'skipped')}"))
    reduce = report.get("allreduce") or {}
    if reduce.get("status") in ("no-progress", "error"):
        out.append(Finding("error", "link", f"all-reduce over {reduce.get('ranks')} ranks",
                           reduce.get("line") or reduce["status"]))
    return out


def _interfaces(report: Mapping, inventory: Mapping[str, Mapping[str, str | None]]) -> list[Finding]:
    out = []
    for node in report.get("nodes", []):
        address, have = node["address"], node.get("interfaces") or {}
        env = node.get("env") or {}
        from_inventory = inventory.get(address, {})
        for var in IFACE_VARS:
            wanted, source = from_inventory.get(var), "the inventory"
            running = env.get(var)
            if wanted and running != wanted:
                out.append(Finding("warn", "interface", address,
                                   f"{var}={wanted} in the inventory, but the node's Ray runs with "
                                   f"{var + '=' + running if running else var + ' unset'}: re-run site.yml"))
            if not wanted:
                wanted, source = running, "the node's environment"
            if not wanted or wanted.startswith("^"):
                continue  # unset, or an exclusion list (it names what NCCL must not use)
            matches = ifname_matches(wanted, have, exact=var == "GLOO_SOCKET_IFNAME")
            if not matches:
                out.append(Finding("error", "interface", address,
                                   f"{var}={wanted} ({source}): no such interface on {address} "
                                   f"(has: {', '.join(sorted(have)) or 'none'})"))
                continue
            down = [m for m in matches if (have[m].get("state") or "").lower() in DOWN_STATES]
            if len(down) == len(matches):
                out.append(Finding("error", "interface", address,
                                   f"{var}={wanted} ({source}): {', '.join(down)} "
                                   f"{'is' if len(down) == 1 else 'are'} down on {address}"))
    return out


def _versions(report: Mapping) -> list[Finding]:
    out = []
    nodes = report.get("nodes", [])
    for key in (*ERROR_VERSIONS, *WARN_VERSIONS):
        by_value: dict[str, list[str]] = {}
        for node in nodes:
            value = (node.get("versions") or {}).get(key)
            if value is not None:
                by_value.setdefault(str(value), []).append(node["address"])
        if len(by_value) > 1:
            text = "; ".join(f"{key} {value} on {', '.join(addrs)}" for value, addrs in sorted(by_value.items()))
            out.append(Finding("error" if key in ERROR_VERSIONS else "warn", "versions", "cluster",
                               f"the nodes disagree: {text}"))
    return out


def link_gbps(node: Mapping, interface: str | None) -> float | None:
    """Line rate in GB/s of `interface` on `node`: a network interface's /sys speed (Mb/s), or an IB port's
    rate for NCCL's ``mlx5_0:1/IB``; None where unknown."""
    if not interface:
        return None
    name = interface.split(":")[0]
    speed = ((node.get("interfaces") or {}).get(name) or {}).get("speed_mbps")
    if speed:
        return speed / 8000
    port = interface.split(":")[1].split("/")[0] if ":" in interface else "1"
    for dev in node.get("infiniband") or []:
        if dev["device"] == name:
            for p in dev.get("ports", []):
                rate = re.match(r"\s*([\d.]+)\s*Gb/sec", p.get("rate") or "")
                if p["port"] == port and rate:
                    return float(rate.group(1)) / 8
    return None


def _bandwidth(report: Mapping) -> list[Finding]:
    out = []
    nodes = {n["address"]: n for n in report.get("nodes", [])}
    for pair in report.get("pairs", []):
        if pair.get("kind") != "inter" or pair.get("status") != "ok":
            continue
        ends = {"a->b": (pair["a"], pair["b"]), "b->a": (pair["b"], pair["a"])}
        for direction, gbps in sorted((pair.get("gbps") or {}).items()):
            src, dst = ends[direction]
            rates = [r for r in (link_gbps(nodes.get(_address(x), {}), iface) for x in (src, dst)
                                 for iface in (pair.get("interface") or "").split(",")) if r]
            if not rates:
                continue
            rate = min(rates)
            if gbps < SLOW_FRACTION * rate:
                out.append(Finding("warn", "bandwidth", f"{src} -> {dst}",
                                   f"{gbps:.2f} GB/s over {pair.get('transport') or '?'} on "
                                   f"{pair.get('interface')}, under {SLOW_FRACTION:.0%} of its link's "
                                   f"{rate * 8:g} Gb/s ({rate:.1f} GB/s)"))
    return out


def _active_ib(node: Mapping) -> list[str]:
    return [f"{d['device']}:{p['port']}" for d in node.get("infiniband") or [] for p in d.get("ports", [])
            if "ACTIVE" in (p.get("state") or "").upper()]


def _infiniband(report: Mapping) -> list[Finding]:
    if report.get("backend") != "nccl":
        return []
    out = []
    nodes = {n["address"]: n for n in report.get("nodes", [])}
    for pair in report.get("pairs", []):
        if pair.get("kind") != "inter" or pair.get("transport") != "NET/Socket":
            continue
        ib = {x: _active_ib(nodes.get(_address(pair[x]), {})) for x in ("a", "b")}
        if ib["a"] and ib["b"]:
            out.append(Finding("warn", "infiniband", f"{pair['a']} <-> {pair['b']}",
                               f"NCCL used NET/Socket on {pair.get('interface') or '?'} though both nodes have "
                               f"active InfiniBand ports ({', '.join(ib['a'])}; {', '.join(ib['b'])}): check "
                               "NCCL_IB_DISABLE, NCCL_IB_HCA and NCCL_NET in the accelerator env file"))
    return out


def _address(label: str) -> str:
    """A rank's node address from its label (``10.0.0.1`` or ``10.0.0.1 gpu3``)."""
    return label.split()[0]
