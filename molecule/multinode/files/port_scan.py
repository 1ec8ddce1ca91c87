"""TCP connect scan: try every given port of every given host at once, non-blocking.

    python port_scan.py --ports 1-65535 HOST...              # every port of every host
    python port_scan.py --ports 9100,9200-9399 HOST...       # the same ports on each host
    python port_scan.py --targets HOST:PORT,HOST:PORT ...    # exactly these

Prints one JSON object: per host, the ports that accepted ("open"), how many
refused, and the ports that neither accepted nor refused within --timeout
("timeout": a firewall dropped the connection attempt). Uses only the standard
library; run it inside a network namespace with `ip netns exec`.
"""

from __future__ import annotations

import argparse
import errno
import json
import resource
import selectors
import socket
import time


def parse_ports(spec: str) -> list[int]:
    ports: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        ports.extend(range(int(low), int(high or low) + 1))
    return ports


def scan(targets: list[tuple[str, int]], timeout: float, window: int) -> dict[str, dict]:
    result = {host: {"open": [], "refused": 0, "timeout": [], "error": []} for host, _ in targets}
    sel = selectors.DefaultSelector()
    pending = iter(targets)
    deadlines: dict[socket.socket, float] = {}
    done = False
    while not done or deadlines:
        while not done and len(deadlines) < window:
            target = next(pending, None)
            if target is None:
                done = True
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            code = sock.connect_ex(target)
            if code in (0, errno.EINPROGRESS):
                sel.register(sock, selectors.EVENT_WRITE, target)
                deadlines[sock] = time.monotonic() + timeout
            else:
                if code == errno.ECONNREFUSED:
                    result[target[0]]["refused"] += 1
                else:
                    result[target[0]]["error"].append(target[1])
                sock.close()
        for key, _ in sel.select(timeout=0.05):
            sock, (host, port) = key.fileobj, key.data
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code == 0:
                result[host]["open"].append(port)
            elif code == errno.ECONNREFUSED:
                result[host]["refused"] += 1
            else:
                result[host]["error"].append(port)
            sel.unregister(sock)
            sock.close()
            del deadlines[sock]
        now = time.monotonic()
        for sock in [s for s, d in deadlines.items() if d < now]:
            host, port = sel.get_key(sock).data
            result[host]["timeout"].append(port)
            sel.unregister(sock)
            sock.close()
            del deadlines[sock]
    for entry in result.values():
        for key in ("open", "timeout", "error"):
            entry[key].sort()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hosts", nargs="*")
    parser.add_argument("--ports", default="1-65535")
    parser.add_argument("--targets", default="", help="HOST:PORT,... instead of hosts x ports")
    parser.add_argument("--timeout", type=float, default=1.5)
    parser.add_argument("--window", type=int, default=16000, help="connection attempts in flight at once")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.window + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard) if hard != resource.RLIM_INFINITY else want, hard))
    window = min(args.window, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 64)
    if args.targets:
        targets = [(t.rsplit(":", 1)[0], int(t.rsplit(":", 1)[1])) for t in args.targets.split(",") if t]
    else:
        ports = parse_ports(args.ports)
        targets = [(host, port) for port in ports for host in args.hosts]
    started = time.monotonic()
    result = scan(targets, args.timeout, window)
    print(json.dumps({"seconds": round(time.monotonic() - started, 1), "tried": len(targets), "hosts": result}))


if __name__ == "__main__":
    main()
