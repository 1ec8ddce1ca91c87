"""The hosts file's groups: one head, the Ray nodes under ray_cluster, retrievers among them, no group name
that is a typo of one rlrun reads. These compare hosts, so they run on the whole inventory (rlrun validate, the
validate play), not in the cluster role's per-host assert."""

from __future__ import annotations

import difflib

from rlrun.checks.problems import NOTHING, Recorder
from rlrun.checks.vocabulary import GROUPS
from rlrun.contract import GROUPS_EXPECTED


def check_groups(r: Recorder) -> None:
    g = r.view.groups
    if not r.view.hosts:
        r.file(r.view.hosts_file, None, f"holds no hosts: expected {GROUPS_EXPECTED}")
        return
    heads = g.get("ray_head", [])
    if len(heads) != 1:
        r.group("group ray_head", heads, f"must hold exactly one host, the Ray head ({len(heads)} found)")
    if "ray_cluster" not in g:
        r.group("group ray_cluster", NOTHING, "is missing: put ray_head and ray_workers under ray_cluster: "
                "children: (see examples/inventories/seed-2node/hosts.yml)")
    cluster = set(g.get("ray_cluster", []))
    for group in ("ray_head", "ray_workers"):
        outside = [h for h in g.get(group, []) if h not in cluster]
        if outside and "ray_cluster" in g:
            r.group(f"group {group}", outside, "holds hosts outside ray_cluster: make ray_head and ray_workers "
                    "children of ray_cluster")
    outside = [h for h in g.get("retrievers", []) if h not in cluster]
    if outside and "ray_cluster" in g:
        r.group("group retrievers", outside, "holds hosts outside ray_cluster: a job calls the retrieval service on "
                "its own Ray node, so every retriever must be a Ray node")
    both = sorted(set(heads) & set(g.get("ray_workers", [])))
    if both:
        r.group("groups ray_head and ray_workers", both, "share hosts: a host is the head or a worker, not both")
    loose = sorted(cluster - set(heads) - set(g.get("ray_workers", [])))
    if loose:
        r.group("group ray_cluster", loose, "holds hosts in neither ray_head nor ray_workers: put each in one of them")
    for group in g:
        if group in GROUPS or group in ("all", "ungrouped"):
            continue
        close = difflib.get_close_matches(group, GROUPS, n=1, cutoff=0.75)
        if close:
            r.group(f"group {group}", g[group], f"is not a group rlrun reads: did you mean {close[0]}?")
