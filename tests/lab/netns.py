"""Hosts made of Linux network namespaces, for multi-node tests on one machine.

A *lab* is a set of hosts on a private /24 that this module creates and
removes completely:

- a bridge ``rlrun-br<index>`` in the root namespace holding 10.244.<index>.1/24
  (the controller's address on the lab network);
- per host a network namespace ``rlrun<index>-<host>``, joined to the bridge by a
  veth pair (``rl<index>v<n>`` outside, ``eth0`` inside) with the host's address,
  and no default route: nothing in a lab can reach beyond the lab;
- per host an sshd listening on the host's address only, with its own host key
  and config, in a private mount namespace (its own /run, and an empty root
  ~/.bashrc: a stock shell) and UTS namespace (its own hostname), accepting the
  lab's client key for root from the lab network.

Ansible then reaches each host over real SSH, and Ray nodes and the reward
service started there have their own address and port space and talk over real
TCP. Filesystem, PID space, /tmp and /dev/shm stay shared with the machine.

    python tests/lab/netns.py create --index 51 --host head=10.244.51.11 --host w1=10.244.51.12
    python tests/lab/netns.py destroy --index 51
    python tests/lab/netns.py leftovers --index 51   # lists what is left; exit 1 if anything

Every name is derived from the index, so ``destroy`` needs only the index, also
after a crash: it ends the processes of each namespace by PID (``ip netns
pids``: sshd, its sessions and everything they started), deletes the
namespaces, veths and bridge, and removes the lab directory /tmp/rlrun-lab<index>.
``create`` refuses to start when any of those names, the directory, or an
address or route inside the subnet already exists, with one exception: a lab
whose *holder* has ended. The holder is the process whose life bounds the lab's
use (the pytest process that made it; with ``--holder molecule``, the molecule
run whose create step made it); lab.json records its PID and start time. When
that process is gone (a run killed before its teardown), ``create`` removes the
left lab first and says so on stderr. A lab whose holder still runs, or one
without a record, is never touched.

Needs root, iproute2 (``ip``), util-linux (``unshare``, ``mount``) and OpenSSH
(``ssh``, ``ssh-keygen``, ``/usr/sbin/sshd``; Debian: openssh-server).
"""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainer.procs import alive, stat_field

SSHD = "/usr/sbin/sshd"
SSH_PORT = 22
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,15}$")


class LabError(RuntimeError):
    """A lab cannot be created, used or removed; the message says why and what to do."""


def _run(argv: list[str], check: bool = True, error: type[LabError] = LabError, **kw) -> subprocess.CompletedProcess:
    """Run `argv`; with `check`, a non-zero exit raises `error` (this lab's, or another lab's subclass) naming
    the command and its output."""
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise error(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _netns_names() -> list[str]:
    out = _run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names() -> list[str]:
    return [link["ifname"] for link in json.loads(_run(["ip", "-j", "link", "show"]).stdout or "[]")]


def _recorded(state_file: Path) -> tuple[dict, dict | None]:
    """A lab's lab.json and the holder it records (None: no readable record, or no holder in it)."""
    try:
        recorded = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return {}, None
    if not isinstance(recorded, dict):
        return {}, None
    holder = recorded.get("holder")
    return recorded, holder if isinstance(holder, dict) else None


def reclaim_if_holder_ended(state_file: Path, what: str, destroy) -> list[str]:
    """If `state_file` records a holder that has ended, call `destroy` (removes the left lab) and say so on
    stderr; returns what was removed. Nothing happens when the holder still runs or no holder is recorded."""
    recorded, holder = _recorded(state_file)
    if holder is None or holder_alive(holder):
        return []
    removed = destroy()
    print(f"{what}: its holder (pid {holder.get('pid')}: {holder.get('cmd') or '?'}; owner "
          f"{recorded.get('owner') or '-'}) has ended without removing it: removed {len(removed)} things "
          f"({', '.join(removed[:4])}{', ...' if len(removed) > 4 else ''})", file=sys.stderr)
    return removed


def held_by(state_file: Path) -> str:
    """'; held by ...' naming the recorded holder that still runs, or '' (for create's refusal)."""
    _, holder = _recorded(state_file)
    if holder is not None and holder_alive(holder):
        return f"; held by pid {holder['pid']} ({holder.get('cmd') or '?'}), which still runs"
    return ""


def netns_pids(netns: str) -> list[int]:
    """PIDs of the processes inside network namespace `netns` (none when it does not exist)."""
    proc = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()] if proc.returncode == 0 else []


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, field 22): with the PID, it names one process, also
    after the PID is reused."""
    return stat_field(pid, 22)


def holder_record(pid: int) -> dict:
    """What lab.json keeps of a lab's holder: PID, start time and command line."""
    return {"pid": pid, "start": _start_time(pid), "cmd": _cmdline(pid)[:200]}


def holder_alive(record: dict) -> bool:
    """Whether the process `record` (holder_record) still runs: same PID, same start time, not a zombie."""
    pid = record.get("pid")
    return isinstance(pid, int) and alive(pid) and _start_time(pid) == record.get("start")


def find_holder(spec: str) -> int:
    """`spec` is a PID, or a command name: the nearest ancestor of this process whose program (argv[0], or
    argv[1] for an interpreter running a script) has that name, e.g. `molecule`."""
    if spec.isdigit():
        if not alive(int(spec)):
            raise LabError(f"--holder {spec}: no such process")
        return int(spec)
    pid = os.getppid()
    while pid and pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            break
        # The program, or the script an interpreter runs (`python .../bin/molecule`, `python -m molecule`).
        names = {Path(a.decode(errors="replace")).name for a in argv[:3] if a and a != b"-m"}
        if spec in names:
            return pid
        pid = stat_field(pid, 4)  # the parent
    raise LabError(f"--holder {spec!r}: no process named {spec!r} among this command's ancestors; expected a PID "
                   "or the name of the program that runs the lab's user (e.g. molecule)")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


@dataclass
class Lab:
    """Hosts `hosts` (name -> IPv4 address inside 10.244.<index>.0/24) of lab `index` (1-254)."""

    index: int
    hosts: dict[str, str] = field(default_factory=dict)
    # Who created the lab (recorded in lab.json): a destroy that names an owner
    # removes only a lab of that owner, so a run never removes another run's lab.
    owner: str = ""
    # The PID whose end makes the lab a leftover (see the module's doc): by default the process that makes
    # the Lab; None records no holder (the lab is never removed by a later create).
    holder: int | None = field(default_factory=os.getpid)
    _sshd: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.index, int) or not 1 <= self.index <= 254:
            raise LabError(f"lab index = {self.index!r}: expected an integer from 1 to 254 (the third octet of 10.244.x.0/24)")
        seen: set[str] = set()
        for name, address in self.hosts.items():
            if not NAME_RE.match(name):
                raise LabError(f"host name {name!r}: expected a lowercase letter then up to 15 lowercase letters or digits")
            try:
                addr = ipaddress.IPv4Address(address)
            except ValueError:
                raise LabError(f"host {name}: address {address!r} is not an IPv4 address") from None
            if addr not in self.subnet or addr in (self.subnet.network_address, self.subnet.broadcast_address,
                                                   self.gateway):
                raise LabError(f"host {name}: address {address} must lie in {self.subnet} and be neither "
                               f"{self.subnet.network_address}, {self.gateway} (the bridge) nor {self.subnet.broadcast_address}")
            if address in seen:
                raise LabError(f"host {name}: address {address} is given to two hosts")
            seen.add(address)

    # Names, all derived from the index.
    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.244.{self.index}.0/24")

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return self.subnet.network_address + 1

    @property
    def bridge(self) -> str:
        return f"rlrun-br{self.index}"

    @property
    def ns_prefix(self) -> str:
        return f"rlrun{self.index}-"

    @property
    def veth_prefix(self) -> str:
        return f"rl{self.index}v"

    @property
    def dir(self) -> Path:
        return Path(f"/tmp/rlrun-lab{self.index}")

    @property
    def key(self) -> Path:
        """The lab's SSH client key (root on every host)."""
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def control_dir(self) -> Path:
        """Where Ansible's SSH control sockets for this lab go (ansible_control_path_dir)."""
        return self.dir / "cp"

    def netns(self, host: str) -> str:
        return f"{self.ns_prefix}{host}"

    def _host_dir(self, host: str) -> Path:
        return self.dir / "hosts" / host

    # ------------------------------------------------------------------ create
    def _refuse_existing(self) -> None:
        if os.geteuid() != 0:
            raise LabError("network-namespace hosts need root (ip netns, bridges, sshd)")
        for tool in ("ip", "unshare", "mount", "ssh", "ssh-keygen"):
            if shutil.which(tool) is None:
                raise LabError(f"`{tool}` not found: install iproute2, util-linux and openssh-client")
        if not os.access(SSHD, os.X_OK):
            raise LabError(f"{SSHD} not found: install openssh-server (apt-get install openssh-server)")
        reclaim_if_holder_ended(self.dir / "lab.json", f"lab {self.index}", lambda: Lab(self.index).destroy())
        found = [f"namespace {n}" for n in _netns_names() if n.startswith(self.ns_prefix)]
        found += [f"link {n}" for n in _link_names() if n == self.bridge or n.startswith(self.veth_prefix)]
        if self.dir.exists():
            found.append(f"directory {self.dir}")
        for entry in json.loads(_run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]"):
            for info in entry.get("addr_info", []):
                if ipaddress.IPv4Address(info["local"]) in self.subnet:
                    found.append(f"address {info['local']} on {entry['ifname']}")
        for route in json.loads(_run(["ip", "-j", "-4", "route", "show"]).stdout or "[]"):
            dst = route.get("dst", "")
            if dst and dst != "default" and ipaddress.IPv4Network(dst, strict=False).overlaps(self.subnet):
                found.append(f"route {dst} via {route.get('dev', '?')}")
        if found:
            raise LabError(f"lab {self.index} ({self.subnet}) cannot be created, these exist already: {', '.join(found)}"
                           f"{held_by(self.dir / 'lab.json')}. "
                           f"If a previous run left them: python tests/lab/netns.py destroy --index {self.index}; "
                           "else choose another --index")

    def create(self, ready_timeout: float = 20.0) -> Lab:
        """Build the lab; on any failure remove what was built and raise LabError."""
        if not self.hosts:
            raise LabError("a lab needs at least one host (--host NAME=ADDRESS)")
        self._refuse_existing()
        atexit.register(self.destroy)
        try:
            self._create(ready_timeout)
        except BaseException:
            self.destroy()
            raise
        return self

    def _create(self, ready_timeout: float) -> None:
        self.dir.mkdir(mode=0o700)
        self.control_dir.mkdir(mode=0o700)
        self._save()
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"rlrun-lab{self.index}", "-f", str(self.key)])
        # The lab key logs in as root from the lab network only.
        pattern = ".".join(str(self.subnet.network_address).split(".")[:3]) + ".*"
        (self.dir / "authorized_keys").write_text(f'from="{pattern}" {self.key.with_suffix(".pub").read_text()}')
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        known = []
        for n, (host, address) in enumerate(self.hosts.items(), start=1):
            ns, veth = self.netns(host), f"{self.veth_prefix}{n}"
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "link", "set", veth, "master", self.bridge, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            known.append(f"{address} {self._start_sshd(host, address)}")
        self.known_hosts.write_text("\n".join(known) + "\n")
        self._save()
        self._wait_ssh(ready_timeout)

    def _start_sshd(self, host: str, address: str) -> str:
        """Start the host's sshd (its PID is recorded); returns its public host key."""
        hd = self._host_dir(host)
        (hd / "run" / "sshd").mkdir(parents=True, mode=0o755)
        hostkey = hd / "ssh_host_ed25519_key"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host, "-f", str(hostkey)])
        config = hd / "sshd_config"
        config.write_text("\n".join([
            f"ListenAddress {address}:{SSH_PORT}",
            f"HostKey {hostkey}",
            f"PidFile {hd / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            # No PAM stack and no /run/sshd on the machine: a private /run (below) holds the privsep dir.
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            # Ansible opens many sessions at once (forks, pipelining).
            "MaxStartups 64:30:128",
            "MaxSessions 64",
            "Subsystem sftp internal-sftp",
            "",
        ]))
        log = hd / "sshd.log"
        # A stock root shell: sshd runs every command through root's bash, which reads
        # ~/.bashrc; this machine's (pyenv init) costs ~0.4 s per command, not what a
        # fresh host has. The lab's sessions see an empty one (their mount namespace only).
        (hd / "bashrc").write_text("# lab host: a stock root shell (tests/lab/netns.py)\n")
        bashrc = Path(pwd.getpwuid(0).pw_dir) / ".bashrc"
        hide = f'mount --bind "$6" {shlex.quote(str(bashrc))} && ' if bashrc.is_file() else ""
        # ip netns exec, unshare and sh all exec: the PID we get is sshd's own.
        with open(log, "ab") as err:
            self._sshd[host] = subprocess.Popen(
                ["ip", "netns", "exec", self.netns(host), "unshare", "--mount", "--uts", "--propagation", "private",
                 "/bin/sh", "-c", f'hostname "$1" && mount --bind "$2" /run && {hide}exec "$3" -D -f "$4" -E "$5"',
                 "sh", host, str(hd / "run"), SSHD, str(config), str(log), str(hd / "bashrc")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        return " ".join(hostkey.with_suffix(".pub").read_text().split()[:2])

    def _wait_ssh(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for host, address in self.hosts.items():
            while True:
                proc = self._sshd[host]
                if proc.poll() is not None:
                    raise LabError(f"sshd of {host} exited with {proc.returncode}: "
                                   f"{(self._host_dir(host) / 'sshd.log').read_text()[-1500:]}")
                try:
                    with socket.create_connection((address, SSH_PORT), timeout=1):
                        break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        raise LabError(f"sshd of {host} does not accept connections on {address}:{SSH_PORT} "
                                       f"after {timeout:.0f} s ({exc})") from None
                    time.sleep(0.1)
            out = self.ssh(host, "hostname", check=False)
            if out.returncode != 0 or out.stdout.strip() != host:
                raise LabError(f"ssh root@{address} ({host}) failed: exit {out.returncode}, "
                               f"stdout {out.stdout.strip()!r}, stderr {out.stderr.strip()[-500:]!r}")

    def _save(self) -> None:
        state = {"index": self.index, "owner": self.owner, "holder": holder_record(self.holder) if self.holder else None,
                 "subnet": str(self.subnet), "bridge": self.bridge, "dir": str(self.dir),
                 "key": str(self.key), "known_hosts": str(self.known_hosts),
                 "hosts": {h: {"address": a, "netns": self.netns(h),
                               "sshd_pid": self._sshd[h].pid if h in self._sshd else None}
                           for h, a in self.hosts.items()}}
        (self.dir / "lab.json").write_text(json.dumps(state, indent=2) + "\n")

    # ------------------------------------------------------------------ use
    def ssh_argv(self, host: str) -> list[str]:
        """`ssh ... root@HOST` with the lab's key and known_hosts (append a command)."""
        return ["ssh", "-i", str(self.key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "ConnectTimeout=10", f"root@{self.hosts[host]}"]

    def ssh(self, host: str, command: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a shell command on `host` over SSH; output captured as text."""
        proc = subprocess.run([*self.ssh_argv(host), command], capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise LabError(f"on {host}: `{command}` failed (exit {proc.returncode}): {proc.stderr.strip()[-1000:]}")
        return proc

    def exec(self, host: str, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        """Run `argv` inside the host's network namespace directly (no SSH); output captured as text."""
        return _run(["ip", "netns", "exec", self.netns(host), *argv], check=check)

    def pids(self, host: str) -> list[int]:
        return netns_pids(self.netns(host))

    def ansible_vars(self, host: str) -> dict[str, str]:
        """Inventory variables that make Ansible reach `host` over SSH with the lab's key."""
        return {
            "ansible_host": self.hosts[host],
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts} -o IdentitiesOnly=yes",
            "ansible_control_path_dir": str(self.control_dir),
        }

    # ------------------------------------------------------------------ remove
    def destroy(self) -> list[str]:
        """Remove everything of lab `index` (also what a crashed run left); returns what was removed."""
        removed: list[str] = []
        if self.owner:
            self._check_owner()
        # Ansible's SSH masters live in the root namespace: ask them to exit before their sshd goes.
        if self.control_dir.is_dir():
            for sock in self.control_dir.iterdir():
                subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "lab"],
                               capture_output=True, timeout=10, check=False)
        for ns in [n for n in _netns_names() if n.startswith(self.ns_prefix)]:
            ended = self._end_namespace_processes(ns)
            if ended:
                removed.append(f"{len(ended)} processes in {ns}")
            _run(["ip", "netns", "delete", ns])
            removed.append(f"namespace {ns}")
        for proc in self._sshd.values():
            if proc.poll() is None:
                proc.wait(timeout=10)
        self._sshd.clear()
        for link in _link_names():
            if link.startswith(self.veth_prefix) or link == self.bridge:
                _run(["ip", "link", "delete", link], check=False)
                removed.append(f"link {link}")
        if self.dir.exists():
            shutil.rmtree(self.dir)
            removed.append(f"directory {self.dir}")
        return removed

    def _check_owner(self) -> None:
        state_file = self.dir / "lab.json"
        try:
            recorded = json.loads(state_file.read_text()).get("owner", "")
        except FileNotFoundError:
            if self.leftovers():
                raise LabError(f"lab {self.index} exists without {state_file}: not created by owner {self.owner!r}; "
                               f"not removing it (without --owner, destroy removes it regardless)") from None
            return
        except (OSError, ValueError) as exc:
            raise LabError(f"cannot read {state_file}: {exc}") from None
        if recorded != self.owner:
            raise LabError(f"lab {self.index} belongs to {recorded!r}, not to {self.owner!r}: not removing it "
                           "(without --owner, destroy removes it regardless)")

    @staticmethod
    def _end_namespace_processes(ns: str) -> list[int]:
        """SIGTERM every process in `ns`, SIGKILL what is left after 5 s; wait until none is left."""
        ended: set[int] = set()
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
            pids = netns_pids(ns)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                    ended.add(pid)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(alive(p) for p in netns_pids(ns)):
                time.sleep(0.1)
            if not any(alive(p) for p in netns_pids(ns)):
                return sorted(ended)
        left = [p for p in netns_pids(ns) if alive(p)]
        raise LabError(f"processes {left} in {ns} survived SIGKILL (uninterruptible?); the namespace is kept")

    def leftovers(self) -> list[str]:
        """Anything of this lab that still exists: namespaces, links, its directory, processes naming it."""
        left = [f"namespace {n}" for n in _netns_names() if n.startswith(self.ns_prefix)]
        left += [f"link {n}" for n in _link_names() if n == self.bridge or n.startswith(self.veth_prefix)]
        if self.dir.exists():
            left.append(f"directory {self.dir}")
        marker = str(self.dir).encode()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and int(proc.name) != os.getpid():
                try:
                    cmdline = (proc / "cmdline").read_bytes()
                except OSError:
                    continue
                if marker in cmdline:
                    args = cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]
                    left.append(f"process {proc.name}: {args}")
        return left

    def __enter__(self) -> Lab:
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()


def _parse_host(spec: str) -> tuple[str, str]:
    if "=" not in spec:
        raise argparse.ArgumentTypeError(f"--host {spec!r}: expected NAME=ADDRESS, e.g. head=10.244.51.11")
    name, address = spec.split("=", 1)
    return name, address


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/lab/netns.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    create = sub.add_parser("create", help="build the lab's bridge, namespaces and sshds")
    create.add_argument("--host", action="append", type=_parse_host, required=True, metavar="NAME=ADDRESS")
    destroy = sub.add_parser("destroy", help="remove everything of the lab")
    for p in (create, destroy):
        p.add_argument("--owner", default="", help="who creates / may destroy the lab (destroy: only a lab of this owner)")
    create.add_argument("--holder", default="", metavar="PID|NAME",
                        help="the process whose end makes the lab a leftover that a later create removes: a PID, or "
                             "the nearest ancestor of this command named NAME (e.g. molecule); default: none, the "
                             "lab is never removed by a later create")
    sub.add_parser("leftovers", help="list what is left of the lab")
    for p in sub.choices.values():
        p.add_argument("--index", type=int, required=True, help="the lab's number: subnet 10.244.INDEX.0/24")
    args = parser.parse_args(argv)
    try:
        if args.action == "create":
            lab = Lab(args.index, dict(args.host), owner=args.owner,
                      holder=find_holder(args.holder) if args.holder else None)
            lab.create()
            atexit.unregister(lab.destroy)  # the lab outlives this command; `destroy` removes it
            print(json.dumps({"index": lab.index, "dir": str(lab.dir),
                              "hosts": {h: lab.ansible_vars(h) for h in lab.hosts}}, indent=2))
        elif args.action == "destroy":
            removed = Lab(args.index, owner=args.owner).destroy()
            print("\n".join(f"removed {r}" for r in removed) or f"lab {args.index}: nothing to remove")
        else:
            left = Lab(args.index).leftovers()
            print("\n".join(f"left: {item}" for item in left) or f"lab {args.index}: nothing left")
            return 1 if left else 0
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
