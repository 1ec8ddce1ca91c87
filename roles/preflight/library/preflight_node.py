#!/usr/bin/python
"""Preflight on one node: what this host has, and what its peers must reach.

A module of the preflight role (runs on the node with its own python3, 3.8+,
pipelined: no temp script, no terminal):

  mode=check  versions of the venv, ulimit -n, /dev/shm, interfaces, GPUs, ports;
              binds the node's free ports and leaves a listener on them (a
              detached child, returned as listener={pid, start}) for the peers
  mode=probe  connects to the peers' ports, asks the reward and retrieval services' /health_check
              (the reward service's over HTTPS, checked against ca_file, with cluster__reward_tls)
  mode=stop   ends the listener that check left (only if PID and start time match)
  mode=accelerator  only the GPUs against cluster__accelerator and the inventory's GPUs, as check reports
              them, but failing with them: site.yml runs it on each GPU node before changing anything there

spec is the mode's input (see the role's vars/main.yml). Problems are data
(returned, never failures): tasks/report.yml merges them into one table.

Ports: a port is fine when it is free, or held by this cluster's own service on
this node (the processes in the session its supervisor recorded, or in its
systemd unit's cgroup): a preflight on a running cluster does not fail on its own
ports. A free port is bound for the probes only where the service that will own
it is not running, so a preflight never takes a port from a running cluster.
"""


import errno
import glob
import json
import os
import resource
import select
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: preflight_node
short_description: One node's part of rlrun's preflight (check, probe, stop).
options:
  mode:
    description: check, probe, stop or accelerator.
    type: str
    required: true
    choices: [check, probe, stop, accelerator]
  spec:
    description: The mode's input.
    type: dict
    required: true
"""

VERSIONS = r"""
import json, platform, sys
from importlib import metadata
out = {"python": platform.python_version()}
for name in sys.argv[1:]:
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def session_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(") ", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def cgroup_of(pid):
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            return fh.read()
    except OSError:
        return ""


def start_time(pid):
    """Start time of `pid` in clock ticks since boot (tells a PID from a reused one)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(") ", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def all_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def service_state(svc):
    """(running, supervisor pid, session id) of a node_service service on this host."""
    pid = sid = None
    try:
        with open(svc["pidfile"]) as fh:
            pid = int(fh.read().strip())
    except (OSError, ValueError):
        pid = None
    if pid and svc["script"] in cmdline(pid):
        try:
            with open(svc["pidfile"] + ".sid") as fh:
                sid = int(fh.read().strip())
        except (OSError, ValueError):
            sid = session_of(pid)
        return True, pid, sid
    # systemd: a unit named like the service with processes in its cgroup.
    unit = f"/{svc['name']}.service"
    for p in all_pids():
        if unit in cgroup_of(p):
            return True, p, None
    return False, None, None


def own_pids(services):
    """PIDs of this cluster's own services on this host (their sessions or units)."""
    sids, units = set(), []
    for svc in services:
        running, _pid, sid = service_state(svc)
        if running and sid:
            sids.add(sid)
        units.append(f"/{svc['name']}.service")
    own = set()
    pids = all_pids()
    for p in pids:
        if session_of(p) in sids or any(u in cgroup_of(p) for u in units):
            own.add(p)
    # And what they started in sessions of their own (a Ray job's driver: its job supervisor
    # starts it with a new session): every descendant of an own process.
    parents = {p: parent_of(p) for p in pids}
    grown = True
    while grown:
        grown = False
        for p, parent in parents.items():
            if p not in own and parent in own:
                own.add(p)
                grown = True
    return own


def parent_of(pid):
    """The parent PID of `pid` (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def listening_inodes():
    """{port: [(local address, inode)]} of this network namespace's listening TCP sockets."""
    found = {}
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A = LISTEN
                continue
            addr_hex, port_hex = fields[1].rsplit(":", 1)
            # The kernel prints each 32-bit word of the address in host (little-endian) order.
            raw = b"".join(bytes.fromhex(addr_hex[i:i + 8])[::-1] for i in range(0, len(addr_hex), 8))
            if not v6:
                addr = socket.inet_ntoa(raw)
            elif raw[:12] == b"\0" * 10 + b"\xff\xff":  # ::ffff:a.b.c.d, an IPv4 address
                addr = socket.inet_ntoa(raw[12:])
            else:
                addr = "::" if raw == b"\0" * 16 else socket.inet_ntop(socket.AF_INET6, raw)
            found.setdefault(int(port_hex, 16), []).append((addr, fields[9]))
    return found


def holders(inodes):
    """{inode: pid} for the sockets `inodes`, as far as this user can see."""
    wanted, out = set(inodes), {}
    if not wanted:
        return out
    for pid in all_pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in wanted:
                out.setdefault(target[8:-1], pid)
    return out


# The node's own daemons (Ray's, the reward service's and the retrieval service's), by command line: they may hold the
# fixed ports of the port map only. Every other process of the cluster's services belongs to a
# job (Ray workers and actors, drivers, what they start): those may also listen in the worker,
# rendezvous and ephemeral ranges (Gloo and NCCL take ephemeral ports; nothing pins them).
DAEMON_PROGRAMS = ("gcs_server", "raylet")
DAEMON_MARKERS = ("dashboard/dashboard.py", "autoscaler/_private/monitor.py", "autoscaler/v2/monitor.py",
                  "_private/log_monitor.py", "ray.util.client.server", "ray::DashboardAgent", "ray::RuntimeEnvAgent",
                  "ray-dashboard-", "bin/ray start", "trainer.reward.server", "trainer.retrieval", "gunicorn")


def is_daemon(command):
    words = command.split()
    return bool(words) and os.path.basename(words[0]) in DAEMON_PROGRAMS or any(m in command for m in DAEMON_MARKERS)


def unmapped_sockets(cfg, listeners, owners, own):
    """Problems: each listening socket of this cluster's processes that is not on a port of the
    host's port map (its fixed ports; the worker, rendezvous and ephemeral ranges for jobs)."""
    fixed = {int(port) for port in cfg.get("fixed_ports", {}).values()}
    ranges = cfg.get("port_ranges", {})
    problems = {}
    for port, entries in sorted(listeners.items()):
        for address, inode in entries:
            pid = owners.get(inode)
            if pid not in own or port in fixed:
                continue
            command = cmdline(pid)
            inside = [name for name, r in ranges.items() if r["bounds"][0] <= port <= r["bounds"][1]]
            # The worker range is any Ray process's: the agents are Ray workers too (their own
            # gRPC port comes from it, on every interface); the others are for jobs only.
            if inside and (inside[0] == "worker" or not is_daemon(command)):
                continue
            where = (f"inside the {inside[0]} range, which is for jobs' processes, not the node's daemons"
                     if inside else "not in the inventory's port map")
            problems.setdefault((pid, command), []).append(f"{address}:{port}")
            problems[(pid, command)].append(where)
    out = []
    for (pid, command), items in sorted(problems.items()):
        sockets, why = items[0::2], items[1::2]
        out.append(f"pid {pid} ({command[:100]}) listens on {', '.join(sorted(set(sockets)))}: {why[0]} "
                   f"(fixed ports {', '.join(map(str, sorted(fixed)))}; "
                   + ", ".join(f"{name} {r['bounds'][0]}-{r['bounds'][1]}" for name, r in ranges.items()) + ")")
    return out


def ephemeral_range():
    """The kernel's ephemeral port range in this network namespace: (first, last), or None."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low, high = (int(x) for x in fh.read().split())
        return low, high
    except (OSError, ValueError):
        return None


def describe(port, address, listeners, owners, own):
    """Who holds `port` on `address` (or on every address): ('own'|'foreign', text)."""
    relevant = [(a, i) for a, i in listeners.get(port, []) if a in (address, "0.0.0.0", "::")]
    if not relevant:
        return "foreign", "held by a socket not listening (TIME_WAIT or another namespace)"
    texts = []
    for a, inode in relevant:
        pid = owners.get(inode)
        if pid in own:
            return "own", f"held by this cluster (pid {pid})"
        texts.append(f"pid {pid} ({cmdline(pid)[:80]}) on {a}" if pid else
                     f"a process this user cannot see, on {a}")
    return "foreign", "held by " + "; ".join(texts)


GPU_SOURCES = {"nvidia": ("NVIDIA", "/proc/driver/nvidia/gpus, /dev/nvidia*"),
               "amd": ("AMD", "/sys/class/kfd: no GPU node with SIMD units")}


def count_gpus(vendor):
    """The GPUs of `vendor` (nvidia, amd) this host has; 0 for any other."""
    if vendor == "nvidia":
        return len(glob.glob("/proc/driver/nvidia/gpus/*")) or \
            len([d for d in glob.glob("/dev/nvidia[0-9]*") if d[len("/dev/nvidia"):].isdigit()])
    if vendor == "amd":
        found = 0
        for props in glob.glob("/sys/class/kfd/kfd/topology/nodes/*/properties"):
            try:
                with open(props) as fh:
                    found += any(line.split()[:1] == ["simd_count"] and int(line.split()[1]) > 0 for line in fh)
            except (OSError, ValueError, IndexError):
                pass
        return found
    return 0


def accelerator_problems(vendor, gpus, visible_devices):
    """[(check, problem)]: the GPUs the inventory gives this node (cluster__accelerator, ray_node__num_gpus,
    accel_env__visible_devices) against the ones it has. `rlrun check` (mode check) and site.yml's cluster
    play (mode accelerator, before anything changes on the host) ask the same."""
    if vendor not in GPU_SOURCES and gpus is None:
        return []
    found = count_gpus(vendor)
    out = []
    usable = found
    if visible_devices:
        bad = [d for d in visible_devices if int(d) >= found]
        if bad:
            out.append(("gpus", f"accel_env__visible_devices {visible_devices}: devices {bad} do not exist "
                                f"({found} {vendor} GPUs found)"))
        usable = min(found, len(visible_devices))
    if gpus is not None and float(gpus) > usable:
        out.append(("gpus", f"the inventory gives this node {float(gpus):g} GPUs (ray_node__num_gpus), "
                            f"{usable} {vendor} GPUs are usable"))
    elif vendor in GPU_SOURCES and found == 0:
        name, where = GPU_SOURCES[vendor]
        out.append(("gpus", f"cluster__accelerator is {vendor}, but this host has no {name} GPU ({where}): set "
                            "cluster__accelerator to cpu for a host without GPUs"))
    return out


def check(cfg):
    host = cfg["host"]
    out = {"problems": [], "targets": [], "listener": None, "running": {}, "health": []}

    def problem(check_name, text):
        out["problems"].append({"check": check_name, "problem": text})

    # Versions of the node's venv.
    python = os.path.join(cfg["venv"], "bin", "python")
    if not os.access(python, os.X_OK):
        # Data, not a problem yet: the report decides (on fresh hosts no venv exists anywhere).
        out["versions"] = None
        out["venv_missing"] = python
    else:
        try:
            proc = subprocess.run([python, "-c", VERSIONS] + cfg["packages"], capture_output=True,
                                  text=True, timeout=120)
            out["versions"] = json.loads(proc.stdout)
        except (subprocess.TimeoutExpired, ValueError) as exc:
            out["versions"] = None
            problem("versions", f"cannot read versions with {python}: {exc}")

    # Open-file limit the services set (ulimit -n).
    nofile = int(cfg["nofile"])
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = hard
    if os.geteuid() == 0:
        try:
            with open("/proc/sys/fs/nr_open") as fh:
                ceiling = int(fh.read())
        except (OSError, ValueError):
            pass
    if hard != resource.RLIM_INFINITY and nofile > ceiling:
        which = "fs.nr_open" if os.geteuid() == 0 else "hard limit of this user"
        problem("ulimit", f"ulimit -n {nofile} (cluster__nofile_limit) cannot be set here: the limit is {ceiling} ({which})")

    # /dev/shm (the object store and NCCL's shared-memory transport live there).
    try:
        st = os.statvfs("/dev/shm")
        shm = st.f_frsize * st.f_blocks
        if shm < cfg["min_shm"]:
            problem("/dev/shm", f"/dev/shm is {shm / 2**30:.2f} GiB, at least {cfg['min_shm'] / 2**30:.2f} GiB "
                                f"needed ({cfg['min_shm_why']})")
    except OSError as exc:
        problem("/dev/shm", f"cannot read /dev/shm: {exc.strerror}")

    # Interfaces for NCCL and Gloo.
    try:
        ifaces = sorted(os.listdir("/sys/class/net"))
    except OSError:
        ifaces = []
    for var, value in sorted(cfg["interfaces"].items()):
        if not value:
            continue
        if var == "GLOO_SOCKET_IFNAME":
            names, exact = [value], True
        elif value.startswith("^"):
            continue  # an exclusion list names what NCCL must not use
        else:
            exact = value.startswith("=")
            names = [n for n in value.lstrip("=").split(",") if n]
        matches = [i for i in ifaces if any(i == n if exact else i.startswith(n) for n in names)]
        if not matches:
            problem("interface", f"{var}={value}: no such interface here (have: {', '.join(ifaces)})")
        for iface in matches[:1]:
            try:
                with open(f"/sys/class/net/{iface}/operstate") as fh:
                    state = fh.read().strip()
            except OSError:
                state = "unknown"
            if state == "down":
                problem("interface", f"{var}={value}: interface {iface} is down")

    # GPUs as the inventory says.
    for name, text in accelerator_problems(cfg["gpu_vendor"], cfg["gpus"], cfg["visible_devices"]):
        problem(name, text)

    # Ports: free, or held by this cluster's own services.
    services = cfg["services"]
    running = {s["kind"]: service_state(s)[0] for s in services}
    out["running"] = running
    own = own_pids(services)
    listeners = listening_inodes()
    owners = holders([i for entries in listeners.values() for _a, i in entries])
    bound, missing = [], set()
    for item in cfg["ports"]:
        name, port, kind, address = item["key"], int(item["value"]), item["kind"], item["address"]
        if address in missing:
            continue
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRNOTAVAIL:
                missing.add(address)
                problem("address", f"{address} is not an address of this host (cluster__node_address)")
                continue
            if exc.errno != errno.EADDRINUSE:
                problem("ports", f"cannot bind {address}:{port} ({name}): {exc.strerror}")
                continue
            whose, text = describe(port, address, listeners, owners, own)
            if whose == "own":
                out["targets"].append({"host": host, "name": name, "port": port, "address": address, "state": "own"})
            else:
                problem("ports", f"{address}:{port} ({name}) is {text}")
            continue
        if running.get(kind) or not cfg["listen"]:
            sock.close()  # free on a running node (Ray opens some ports later): nothing to probe
            continue
        sock.listen(64)
        bound.append(sock)
        out["targets"].append({"host": host, "name": name, "port": port, "address": address, "state": "listener"})
    if running.get("reward") and cfg.get("reward_health_url"):
        out["health"].append({"host": host, "url": cfg["reward_health_url"]})
    if running.get("retriever") and cfg.get("retriever_health_url"):
        out["health"].append({"host": host, "url": cfg["retriever_health_url"], "kind": "retriever"})
    # The worker and rendezvous ranges: no process of anyone else may listen inside them.
    address = cfg["address"]
    ranges = cfg.get("port_ranges", {})
    for name in ("worker", "rendezvous"):
        if name not in ranges:
            continue
        low, high = ranges[name]["bounds"]
        taken = []
        checked = {int(item["value"]) for item in cfg["ports"]}
        for port in range(int(low), int(high) + 1):
            if port not in checked and any(a in (address, "0.0.0.0", "::") for a, _i in listeners.get(port, [])):
                whose, text = describe(port, address, listeners, owners, own)
                if whose != "own":
                    taken.append(f"{port} {text}")
        if taken:
            shown = "; ".join(taken[:3]) + ("; ..." if len(taken) > 3 else "")
            problem("ports", f"{len(taken)} ports of the {name} range {low}-{high} are taken: {shown}")
    # Every socket this cluster's processes listen on lies in the port map.
    for text in unmapped_sockets(cfg, listeners, owners, own):
        problem("sockets", text)
    # The kernel hands out ephemeral ports (Gloo's and NCCL's listeners among them) from the range
    # the inventory names, which the firewall opens to the members.
    if "ephemeral" in ranges:
        low, high = ranges["ephemeral"]["bounds"]
        kernel = ephemeral_range()
        if kernel and not (low <= kernel[0] and kernel[1] <= high):
            first, last = ranges["ephemeral"]["vars"]
            problem("ports", f"the kernel's ephemeral port range is {kernel[0]}-{kernel[1]} "
                             f"(net.ipv4.ip_local_port_range), the inventory says {low}-{high} ({first}, {last}): "
                             "NCCL and Gloo listen on ephemeral ports; make them agree")
    if bound:
        pid = serve(bound, float(cfg["listen_seconds"]))
        out["listener"] = {"pid": pid, "start": start_time(pid)}
    return out


def serve(socks, seconds):
    """Fork a detached child that accepts (and closes) connections on `socks` for `seconds`
    or until SIGTERM; return its PID. The parent closes its copies."""
    pid = os.fork()
    if pid:
        for s in socks:
            s.close()
        return pid
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ready, _w, _x = select.select(socks, [], [], 1.0)
            for s in ready:
                try:
                    conn, _addr = s.accept()
                    conn.close()
                except OSError:
                    pass
    finally:
        os._exit(0)


def connect(address, port, timeout):
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def health(url, timeout, cafile=None):
    try:
        context = ssl.create_default_context(cafile=cafile) if url.startswith("https:") else None
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


def probe(cfg):
    timeout = float(cfg["timeout"])
    jobs = [(t, connect, (t["address"], int(t["port"]), timeout)) for t in cfg["targets"]]
    jobs += [(t, health, (t["url"], timeout * 2, cfg.get("ca_file"))) for t in cfg["health"]]
    with ThreadPoolExecutor(max_workers=32) as pool:
        futures = [(t, pool.submit(fn, *args)) for t, fn, args in jobs]
        failures = []
        for target, fut in futures:
            err = fut.result()
            if err:
                failures.append(dict(target, error=err))
    return {"failures": failures, "tried": len(jobs)}


def stop(cfg):
    pid = int(cfg["pid"])
    if start_time(pid) != cfg["start"]:
        return {"stopped": False, "why": f"pid {pid} is no longer this preflight's listener"}
    os.kill(pid, signal.SIGTERM)
    return {"stopped": True}


def main():
    module = AnsibleModule(
        argument_spec={"mode": {"type": "str", "required": True,
                                "choices": ["check", "probe", "stop", "accelerator"]},
                       "spec": {"type": "dict", "required": True}},
        supports_check_mode=True)
    mode, cfg = module.params["mode"], module.params["spec"]
    if mode == "check":
        cfg = dict(cfg, listen=cfg.get("listen", True) and not module.check_mode)
        result = check(cfg)
    elif mode == "probe":
        result = probe(cfg)
    elif mode == "accelerator":
        problems = [text for _name, text in accelerator_problems(cfg["gpu_vendor"], cfg["gpus"],
                                                                   cfg["visible_devices"])]
        if problems:
            module.fail_json(msg=f"{cfg['host']}: " + "; ".join(problems))
        result = {"problems": []}
    else:
        result = stop(cfg)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
