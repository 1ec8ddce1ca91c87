"""`python -m rlrun.nodecheck`: the provisioning roles' view of cluster health.

  --node-ip IP            wait until that node is ALIVE (ray_node role)
  --expect-nodes N ...    check alive nodes / CPUs / GPUs (status playbook,
                          the seed's `check_ray.sh 32`)
  --wait SECONDS          with --expect-nodes: first wait until that many nodes
                          are alive (nodes still joining), then check

The token is read from the file named by $RLRUN_TOKEN_FILE (never from the
command line, which `ps` would show). Exit 0 when healthy, 1 with one line
naming the problem otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rlrun.dashboard import check_totals, list_nodes, wait_node_alive, wait_nodes_alive
from rlrun.errors import RlrunError


def read_token_file(path: str | None) -> str | None:
    """The token in `path` (stripped), None when no path is given."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError as exc:
        raise RlrunError(f"cannot read the token file {path}: {exc.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlrun.nodecheck", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dashboard", required=True, help="dashboard URL, e.g. http://10.0.0.5:8101")
    parser.add_argument("--node-ip", help="wait until this node is alive")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait (with --node-ip)")
    parser.add_argument("--expect-nodes", type=int)
    parser.add_argument("--expect-cpus", type=float)
    parser.add_argument("--expect-gpus", type=float)
    parser.add_argument("--json", action="store_true", help="print the alive nodes as JSON")
    parser.add_argument("--wait", type=float, default=0.0,
                        help="with --expect-nodes: seconds to wait until that many nodes are alive before checking")
    args = parser.parse_args(argv)
    if args.wait < 0:
        parser.error(f"--wait {args.wait:g}: expected seconds >= 0")
    try:
        token = read_token_file(os.environ.get("RLRUN_TOKEN_FILE"))
        if args.node_ip:
            node = wait_node_alive(args.dashboard, token, args.node_ip, args.timeout)
            print(f"node {node.node_ip} alive ({node.cpus:g} CPUs, {node.gpus:g} GPUs)")
        if args.wait and args.expect_nodes is not None:
            nodes = wait_nodes_alive(args.dashboard, token, args.expect_nodes, args.wait)
        else:
            nodes = list_nodes(args.dashboard, token)
        if args.json:
            print(json.dumps([n.__dict__ for n in nodes if n.alive]))
        problems = check_totals(nodes, args.expect_nodes, args.expect_cpus, args.expect_gpus)
    except RlrunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if problems:
        alive = sorted(n.node_ip for n in nodes if n.alive)
        print(f"alive nodes: {', '.join(alive) or 'none'}", file=sys.stderr)
    if not problems and not args.json:
        alive = [n for n in nodes if n.alive]
        print(f"{len(alive)} nodes alive, {sum(n.cpus for n in alive):g} CPUs, {sum(n.gpus for n in alive):g} GPUs")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
