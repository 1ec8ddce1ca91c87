"""`python -m rlrun.slurm.runtime`: what the sbatch script asks the job's venv on the nodes.

    ports      --job-id N [--port-window LO-HI] [--port-block N] [--deny-ports LIST]
               print the job's port block as PORT_NAME=PORT lines (rlrun.slurm.ports)
    free       --address IP [--of head|node|reward]... [PORT]...
               exit 1 naming the first port something on IP already holds (--of: the fixed ports of the job's
               block a head, every Ray node, the reward service hold, from $PORT_*)
    wait       --dashboard URL [--node-ip IP]... [--reward-url URL]... [--watch PID=LABEL]... [--timeout S]
               wait until every node is alive and every reward service answers /health_check; fail at
               once when a watched process (a node's srun step) has ended. Token: $RLRUN_TOKEN_FILE.
    inventory  --dir D --name NAME --head NODE=IP [--worker NODE=IP]... [--reward NODE=IP]
               [--token-file F] [--reward-token-file F] --job-id N
               write the running cluster as an inventory `rlrun -i D` reads (ports from $PORT_*)
    record     --file F KEY=VALUE...     merge into the job's JSON record (written 0600)

Every failure is one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import yaml

from rlrun.dashboard import list_nodes, reward_health
from rlrun.errors import RlrunError
from rlrun.nodecheck import read_token_file
from rlrun.slurm import ports as P
from trainer.files import replace_file
from trainer.procs import alive


def cmd_ports(args) -> None:
    deny = P.parse_ranges(args.deny_ports) if args.deny_ports is not None else None
    block = P.block_for_job(args.job_id, P.parse_window(args.port_window), args.port_block, deny)
    for name, port in block.ports().items():
        print(f"{name}={port}")


def cmd_free(args) -> None:
    ports = list(args.ports)
    for of in args.of:
        for name in P.layout().shell_ports(of):
            value = os.environ.get(name, "")
            if not value.isdigit():
                raise RlrunError(f"${name} = {value!r}: expected the job's port (set by the sbatch script)")
            ports.append(int(value))
    for port in ports:
        port_free(args.address, port)


def port_free(address: str, port: int) -> None:
    """Raise naming ``address:port`` when a process holds it. A connection of an earlier run left in TIME_WAIT
    does not hold it: Ray's, gunicorn's and aiohttp's servers bind with SO_REUSEADDR, as this check does (a
    requeued job starts on the same nodes with the same port block moments after its first run)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as exc:
            raise RlrunError(f"port {address}:{port} of this job's block is taken ({exc.strerror}): "
                             "another process on this node holds it; resubmit (the next job id gets another "
                             "block) or choose --port-window / --deny-ports") from None


def cmd_wait(args) -> None:
    token = read_token_file(os.environ.get("RLRUN_TOKEN_FILE"))
    watch = {}
    for item in args.watch:
        pid, _, label = item.partition("=")
        watch[int(pid)] = label or pid
    started = time.monotonic()
    deadline = started + args.timeout
    waiting_nodes, waiting_rewards = list(args.node_ip), list(args.reward_url)
    last = "no answer yet"
    while True:
        for pid, label in watch.items():
            if not alive(pid):
                raise RlrunError(f"{label} ended before the cluster was up (its output is above)")
        if waiting_nodes:
            try:
                up = {n.node_ip for n in list_nodes(args.dashboard, token, timeout=5.0) if n.alive}
                for ip in [ip for ip in waiting_nodes if ip in up]:
                    print(f"node {ip} alive after {time.monotonic() - started:.1f} s", flush=True)
                    waiting_nodes.remove(ip)
                last = f"alive: {sorted(up)}"
            except RlrunError as exc:
                last = str(exc)
                if "refused the token" in last:
                    raise
        for url in list(waiting_rewards):
            status = reward_health(url, timeout=2.0)
            if status == "ok":
                print(f"reward service {url} healthy after {time.monotonic() - started:.1f} s", flush=True)
                waiting_rewards.remove(url)
            else:
                last = f"reward service {url}: {status}"
        if not waiting_nodes and not waiting_rewards:
            return
        if time.monotonic() > deadline:
            raise RlrunError(f"after {args.timeout:.0f} s still waiting for nodes {waiting_nodes} and reward "
                             f"services {waiting_rewards} ({last})")
        time.sleep(0.5)


def _pair(text: str) -> tuple[str, str]:
    name, sep, ip = text.partition("=")
    if not sep or not name or not ip:
        raise RlrunError(f"{text!r}: expected NODE=IP")
    return name, ip


def cmd_inventory(args) -> None:
    ports = {}
    for var, name in P.layout().shell_names().items():
        value = os.environ.get(name, "")
        if not value.isdigit():
            raise RlrunError(f"${name} = {value!r}: expected the job's port (set by the sbatch script)")
        ports[var] = int(value)
    root = Path(args.dir)
    head = dict([_pair(args.head)])
    workers = dict(_pair(w) for w in args.worker)
    rewards = dict(_pair(r) for r in args.reward)
    secrets = root / ".secrets"
    secrets.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(root, 0o700)
    os.chmod(secrets, 0o700)
    store = secrets / f"{args.name}-ray.token"
    reward_store = secrets / f"{args.name}-reward.token"
    if args.token_file:
        _copy_private(Path(args.token_file), store)
    if args.reward_token_file:
        _copy_private(Path(args.reward_token_file), reward_store)

    def host(name: str, ip: str) -> dict:
        return {"cluster__node_address": ip, "ansible_host": ip}

    inv = {"all": {"children": {
        "ray_cluster": {"children": {
            "ray_head": {"hosts": {n: host(n, ip) for n, ip in head.items()}},
            "ray_workers": {"hosts": {n: host(n, ip) for n, ip in workers.items()}}}},
        "reward_servers": {"hosts": {n: host(n, ip) for n, ip in rewards.items()}}}}}
    group_vars = {
        "cluster__name": args.name,
        "cluster__auth_enabled": True,
        # Where rlrun reads the tokens (the cluster role's variables, named here and not left to its
        # defaults: this directory's layout is the job's own).
        "cluster__token_store": str(store),
        "cluster__reward_token_store": str(reward_store),
        **ports,
        # Informational: which Slurm job runs this cluster (rlrun slurm status / cancel).
        "rlrun__slurm_job_id": args.job_id,
    }
    (root / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    header = (f"# The Ray cluster of Slurm job {args.job_id}, written by its sbatch script (rlrun slurm).\n"
              "# `rlrun -i THIS_DIR status|submit|list|logs|stop` talk to it; it lives as long as the job.\n"
              "# Not for ansible-playbook: Slurm, not Ansible, runs these nodes.\n")
    replace_file(root / "hosts.yml", header + yaml.safe_dump(inv, sort_keys=False), 0o600)
    replace_file(root / "group_vars" / "all" / "main.yml", header + yaml.safe_dump(group_vars, sort_keys=False), 0o600)


def _copy_private(src: Path, dst: Path) -> None:
    try:
        replace_file(dst, src.read_text(encoding="utf-8"), 0o600)
    except OSError as exc:
        raise RlrunError(f"cannot copy {src} to {dst}: {exc.strerror}") from None


def cmd_record(args) -> None:
    path = Path(args.file)
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError):
        data = {}
    for item in args.items:
        key, sep, value = item.partition("=")
        if not sep:
            raise RlrunError(f"{item!r}: expected KEY=VALUE")
        data[key] = int(value) if value.lstrip("-").isdigit() and key != "nodes" else value
    data["updated"] = time.time()
    replace_file(path, json.dumps(data, indent=2, sort_keys=True) + "\n", 0o600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlrun.slurm.runtime", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("ports")
    p.add_argument("--job-id", type=int, required=True)
    p.add_argument("--port-window", default=f"{P.DEFAULT_WINDOW[0]}-{P.DEFAULT_WINDOW[1]}")
    p.add_argument("--port-block", type=int, default=P.DEFAULT_BLOCK)
    p.add_argument("--deny-ports", default=None)
    p = sub.add_parser("free")
    p.add_argument("--address", required=True)
    p.add_argument("--of", action="append", default=[], choices=("head", "node", "reward"),
                   help="the fixed ports of the job's port block this holds ($PORT_*)")
    p.add_argument("ports", type=int, nargs="*")
    p = sub.add_parser("wait")
    p.add_argument("--dashboard", required=True)
    p.add_argument("--node-ip", action="append", default=[])
    p.add_argument("--reward-url", action="append", default=[])
    p.add_argument("--watch", action="append", default=[])
    p.add_argument("--timeout", type=float, default=180.0)
    p = sub.add_parser("inventory")
    p.add_argument("--dir", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--head", required=True)
    p.add_argument("--worker", action="append", default=[])
    p.add_argument("--reward", action="append", default=[])
    p.add_argument("--token-file")
    p.add_argument("--reward-token-file")
    p.add_argument("--job-id", required=True)
    p = sub.add_parser("record")
    p.add_argument("--file", required=True)
    p.add_argument("items", nargs="*")
    args = parser.parse_args(argv)
    try:
        {"ports": cmd_ports, "free": cmd_free, "wait": cmd_wait, "inventory": cmd_inventory,
         "record": cmd_record}[args.action](args)
    except (RlrunError, P.PortError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

