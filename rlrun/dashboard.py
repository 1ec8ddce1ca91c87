"""Read cluster state from the Ray dashboard's HTTP API, with the cluster token.

Used on the controller (`rlrun status`) and on the nodes (the ray_node role
waits through `python -m rlrun.nodecheck`). Only `requests`: no Ray import, so
it works before Ray is importable and never joins the cluster.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import requests

from rlrun.errors import RlrunError


@dataclass(frozen=True)
class Node:
    """One Ray node as the dashboard reports it."""

    node_id: str
    node_ip: str
    is_head: bool
    state: str
    cpus: float
    gpus: float

    @property
    def alive(self) -> bool:
        return self.state == "ALIVE"


def auth_headers(token: str | None) -> dict[str, str]:
    """The header Ray's token authentication expects (none when auth is off)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def get_json(url: str, token: str | None, timeout: float = 10.0) -> dict:
    """GET a dashboard endpoint; every failure becomes an RlrunError naming URL and cause."""
    try:
        resp = requests.get(url, headers=auth_headers(token), timeout=timeout)
    except requests.ConnectionError:
        raise RlrunError(f"cannot reach the Ray dashboard at {url} (connection refused or unreachable): "
                         "is the cluster up? (`rlrun up`)") from None
    except requests.Timeout:
        raise RlrunError(f"the Ray dashboard at {url} did not answer within {timeout:.0f} s") from None
    if resp.status_code == 401:
        raise RlrunError(f"the Ray dashboard at {url} wants a token and none was sent "
                         "(token authentication is on; is the inventory's token file present?)")
    if resp.status_code == 403:
        raise RlrunError(f"the Ray dashboard at {url} refused the token: it is not this cluster's token")
    if resp.status_code != 200:
        raise RlrunError(f"the Ray dashboard at {url} answered HTTP {resp.status_code}: {resp.text[:200]}")
    try:
        return resp.json()
    except ValueError:
        raise RlrunError(f"the Ray dashboard at {url} answered something that is not JSON") from None


def list_nodes(dashboard: str, token: str | None, timeout: float = 10.0) -> list[Node]:
    """All nodes the cluster knows, alive or dead (state API `/api/v0/nodes`)."""
    body = get_json(f"{dashboard.rstrip('/')}/api/v0/nodes?limit=10000", token, timeout)
    try:
        rows = body["data"]["result"]["result"]
    except (KeyError, TypeError):
        raise RlrunError(f"unexpected answer from {dashboard}/api/v0/nodes: {str(body)[:200]}") from None
    return [
        Node(
            node_id=row["node_id"],
            node_ip=row["node_ip"],
            is_head=bool(row.get("is_head_node")),
            state=row["state"],
            cpus=float(row.get("resources_total", {}).get("CPU", 0.0)),
            gpus=float(row.get("resources_total", {}).get("GPU", 0.0)),
        )
        for row in rows
    ]


_PROBE_BODY = {"query": ["\\boxed{1}"], "labels": ["1"]}


def reward_health(url: str, timeout: float = 5.0, token: str | None = None, ca: str | None = None) -> str:
    """'ok' when the reward service behind `url` (.../get_reward) answers /health_check, else why not.

    With ``token``, also one tiny /get_reward with it: a service that refuses the reward
    token is not ok. ``ca``: the CA an https service's certificate must chain to.
    """
    health = url.rsplit("/", 1)[0] + "/health_check"
    verify: str | bool = ca if ca else True
    try:
        resp = requests.get(health, timeout=timeout, verify=verify)
        if resp.status_code != 200:
            return f"HTTP {resp.status_code}"
        if token:
            scored = requests.post(url, json=_PROBE_BODY, headers={"Authorization": f"Bearer {token}"},
                                   timeout=timeout, verify=verify)
            if scored.status_code in (401, 403):
                return f"refuses the reward token (HTTP {scored.status_code})"
            if scored.status_code != 200:
                return f"/get_reward answered HTTP {scored.status_code}"
    except requests.exceptions.SSLError:
        return "TLS failed (is its certificate from the cluster's reward CA?)"
    except requests.RequestException as exc:
        return f"unreachable ({type(exc).__name__})"
    return "ok"


def retriever_health(url: str, timeout: float = 5.0) -> str:
    """'ok' when the retrieval service behind `url` (.../retrieve) answers /health_check with its index, else why
    not."""
    health = url.rsplit("/", 1)[0] + "/health_check"
    try:
        resp = requests.get(health, timeout=timeout)
    except requests.RequestException as exc:
        return f"unreachable ({type(exc).__name__})"
    if resp.status_code != 200:
        return f"HTTP {resp.status_code}"
    try:
        docs = resp.json().get("n_docs")
    except (ValueError, AttributeError):
        return "answers, but not as a retrieval service (no JSON)"
    return "ok" if isinstance(docs, int) and docs > 0 else f"answers with an empty index (n_docs {docs!r})"


def check_totals(nodes, expect_nodes, expect_cpus, expect_gpus) -> list[str]:
    """Problems found comparing alive nodes with what the inventory expects."""
    alive = [n for n in nodes if n.alive]
    problems = []
    if expect_nodes is not None and len(alive) != expect_nodes:
        problems.append(f"{len(alive)} nodes alive, the inventory expects {expect_nodes}")
    cpus = sum(n.cpus for n in alive)
    if expect_cpus is not None and cpus != expect_cpus:
        problems.append(f"{cpus:g} CPUs in the cluster, the inventory expects {expect_cpus:g}")
    gpus = sum(n.gpus for n in alive)
    if expect_gpus is not None and gpus != expect_gpus:
        problems.append(f"{gpus:g} GPUs in the cluster, the inventory expects {expect_gpus:g}")
    return problems


def cluster_problems(cluster, nodes: list[Node], reward: dict[str, str],
                     retrievers: dict[str, str] | None = None) -> list[str]:
    """What differs between the live cluster and its inventory (empty when nothing does): a host whose node is
    not alive, a node with other GPUs than its host's ray_node__num_gpus, alive nodes the inventory does not
    list, CPU and GPU totals as the status play counts them (check_totals, as `python -m rlrun.nodecheck` does:
    cluster__expected_gpus, else the hosts' ray_node__num_gpus; CPUs when every host pins ray_node__num_cpus),
    fewer nodes than cluster__expected_nodes, a reward or retrieval service that does not answer /health_check."""
    problems = []
    alive = [n for n in nodes if n.alive]
    by_ip: dict[str, list[Node]] = {}
    for n in alive:
        by_ip.setdefault(n.node_ip, []).append(n)
    for host in cluster.nodes:
        address = cluster.node_addresses.get(host)
        here = by_ip.get(address, [])
        if not here:
            states = [n.state for n in nodes if n.node_ip == address]
            problems.append(f"node {host} ({address}) is not alive"
                            + (f" (state {states[-1]})" if states else " (not in the cluster)"))
            continue
        want, have = cluster.node_gpus.get(host), sum(n.gpus for n in here)
        if want is not None and have != want:
            problems.append(f"node {host} ({address}) has {have:g} GPUs, its ray_node__num_gpus is {want:g}")
    strangers = sorted(ip for ip in by_ip if ip not in cluster.node_addresses.values())
    if strangers:
        problems.append(f"alive nodes the inventory does not list: {', '.join(strangers)}")
    if cluster.expected_nodes is not None and len(alive) != cluster.expected_nodes:
        problems.append(f"{len(alive)} nodes alive, cluster__expected_nodes is {cluster.expected_nodes}")
    cpus = [cluster.node_cpus.get(h) for h in cluster.nodes]
    expect_cpus = sum(cpus) if cpus and all(c is not None for c in cpus) else None
    expect_gpus = (cluster.expected_gpus if cluster.expected_gpus is not None
                   else sum(cluster.node_gpus.get(h) or 0.0 for h in cluster.nodes))
    problems += check_totals(nodes, None, expect_cpus, expect_gpus)
    problems += [f"reward service {url}: {health}" for url, health in reward.items() if health != "ok"]
    problems += [f"retrieval service {url}: {health}" for url, health in (retrievers or {}).items() if health != "ok"]
    return problems


# Seconds between two looks at the dashboard while nodes join: a node is alive ~1 s after its raylet starts,
# and a bring-up waits for the last one.
POLL = 0.25


def wait_node_alive(dashboard: str, token: str | None, node_ip: str, timeout: float) -> Node:
    """Poll until a node with `node_ip` is ALIVE; the last error explains a timeout."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while True:
        try:
            nodes = list_nodes(dashboard, token, timeout=5.0)
            for node in nodes:
                if node.node_ip == node_ip and node.alive:
                    return node
            last = f"alive nodes: {sorted(n.node_ip for n in nodes if n.alive)}"
        except RlrunError as exc:
            last = str(exc)
            if "refused the token" in last:
                raise
        if time.monotonic() >= deadline:
            raise RlrunError(f"node {node_ip} is not alive in the cluster at {dashboard} after {timeout:.0f} s "
                             f"({last})")
        time.sleep(POLL)


def wait_nodes_alive(dashboard: str, token: str | None, count: int, timeout: float,
                     interval: float = POLL) -> list[Node]:
    """Poll until exactly `count` nodes are ALIVE (nodes joining, or a restarted node's old self not yet marked
    dead), at most `timeout` seconds; returns the last listing either way, for the caller's checks. A refused
    token or a dashboard that never answers is an error."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            nodes = list_nodes(dashboard, token, timeout=5.0)
            if sum(n.alive for n in nodes) == count or time.monotonic() >= deadline:
                return nodes
        except RlrunError as exc:
            if "refused the token" in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(interval)
