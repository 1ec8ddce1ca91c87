"""A private Slurm on one machine, for tests of `rlrun slurm` with the real thing.

A *Slurm lab* is a complete Slurm 22.05 that this module starts and removes,
none of it under /etc, /run or systemd:

- a munged of its own (private key, socket, pid, log and seed file);
- a slurm.conf written for this machine (proctrack/linuxproc, task/none, no
  accounting: what works without systemd or cgroups), every path under the lab
  directory /tmp/rlrun-slurm<index>;
- a bridge ``rlsl-br<index>`` holding 10.245.<index>.1/24, where slurmctld
  listens, and per node a network namespace ``rlsl<index>-n<k>`` joined to it
  (address 10.245.<index>.<10+k>, no default route) in which the node's slurmd
  runs in a PID namespace of its own. Every node has its own address and port
  space, as real nodes do, so every node of a job uses the same ports; the
  filesystem (/tmp, /dev/shm) stays shared with the machine.

Clients use it with ``SLURM_CONF=<dir>/etc/slurm.conf`` (:meth:`SlurmLab.env`).

    python tests/lab/slurm.py create --index 61 --nodes 3
    python tests/lab/slurm.py destroy --index 61
    python tests/lab/slurm.py leftovers --index 61   # exit 1 if anything is left

Every name is derived from the index, so ``destroy`` needs only the index, also
after a crash: it cancels the lab's jobs and waits for them, ends every process
left in the nodes' namespaces by PID (``ip netns pids``), deletes the
namespaces, veths and bridge, stops slurmctld and munged by the PIDs recorded
in lab.json (each checked to still be that daemon) and removes the directory.
``create`` refuses to start when any of those exists already, unless the lab's
holder has ended (a run killed before its teardown): then it removes the left
lab first, as tests/lab/netns.py does.

Needs root, iproute2, util-linux (``nsenter``, ``unshare``, ``setpriv``) and
Debian's ``slurmctld slurmd slurm-client munge``.
"""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainer.procs import alive

if __package__:
    from tests.lab import netns
else:  # run as a script (python tests/lab/slurm.py): its own directory is on the path
    import netns

LabError, netns_pids, _cmdline = netns.LabError, netns.netns_pids, netns._cmdline
_link_names, _netns_names, _lab_run = netns._link_names, netns._netns_names, netns._run
find_holder, held_by, holder_record = netns.find_holder, netns.held_by, netns.holder_record
reclaim_if_holder_ended = netns.reclaim_if_holder_ended

TOOLS = ("ip", "nsenter", "unshare", "setpriv", "munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue",
         "scontrol", "scancel", "sinfo")


class SlurmLabError(LabError):
    """A Slurm lab cannot be created, used or removed; the message says why and what to do."""


def _run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return _lab_run(argv, check, error=SlurmLabError, **kw)


def end_pids(pids: list[int], grace: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL after `grace` s; returns the PIDs signalled."""
    ended: set[int] = set()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in [p for p in pids if alive(p)]:
            try:
                os.kill(pid, sig)
                ended.add(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)
        if not any(alive(p) for p in pids):
            break
    return sorted(ended)


@dataclass
class SlurmLab:
    """Lab `index` (1-254) with `nodes` nodes of `cpus` CPUs each."""

    index: int
    nodes: int = 3
    cpus: int = 4
    owner: str = ""
    kill_wait: int = 30
    # The PID whose end makes the lab a leftover that a later create removes (tests/lab/netns.py's doc): by
    # default the process that makes the SlurmLab; None records none.
    holder: int | None = field(default_factory=os.getpid)
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.index, int) or not 1 <= self.index <= 254:
            raise SlurmLabError(f"slurm lab index = {self.index!r}: expected an integer from 1 to 254 "
                                "(the third octet of 10.245.x.0/24)")
        if not 1 <= self.nodes <= 16:
            raise SlurmLabError(f"nodes = {self.nodes}: expected 1 to 16")
        if not 1 <= self.cpus <= 64:
            raise SlurmLabError(f"cpus = {self.cpus}: expected 1 to 64 per node")

    # Names, all derived from the index.
    @property
    def dir(self) -> Path:
        return Path(f"/tmp/rlrun-slurm{self.index}")

    @property
    def node_tmp(self) -> Path:
        """The jobs' ``--node-tmp`` (their nodes' private dirs): inside the lab, so a lab removed after a crash takes
        what its killed jobs left with it (the lab's job ids start at 1 again: a dir of an earlier lab's job 1
        shared with the machine's /tmp would stop the next lab's job 1)."""
        return self.dir / "nt"

    @property
    def conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    @property
    def cluster_name(self) -> str:
        return f"rlrunlab{self.index}"

    @property
    def partition(self) -> str:
        return "lab"

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.245.{self.index}.0/24")

    @property
    def controller_address(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def controller_port(self) -> int:
        return 6817

    @property
    def node_port(self) -> int:
        return 6818

    @property
    def bridge(self) -> str:
        return f"rlsl-br{self.index}"

    @property
    def ns_prefix(self) -> str:
        return f"rlsl{self.index}-"

    @property
    def veth_prefix(self) -> str:
        return f"rs{self.index}v"

    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def node_address(self, name: str) -> str:
        return str(self.subnet.network_address + 10 + int(name[1:]))

    def netns(self, name: str) -> str:
        return f"{self.ns_prefix}{name}"

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "run" / "munge.socket"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose Slurm commands talk to this lab (no Slurm variables of an enclosing job)."""
        env = dict(os.environ if base is None else base)
        for var in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            del env[var]
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sinfo, squeue, scontrol, ...) against the lab."""
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=self.env(), timeout=timeout)
        if check and proc.returncode != 0:
            raise SlurmLabError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): "
                                f"{proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    # ------------------------------------------------------------------ create
    def _refuse_existing(self) -> None:
        if os.geteuid() != 0:
            raise SlurmLabError("a Slurm lab needs root (namespaces, munged as user munge, slurmd)")
        for tool in TOOLS:
            if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
                raise SlurmLabError(f"`{tool}` not found: install iproute2, util-linux, and Slurm with munge "
                                    "(apt-get install slurmctld slurmd slurm-client munge)")
        try:
            pwd.getpwnam("munge")
        except KeyError:
            raise SlurmLabError("no user `munge`: install the munge package (apt-get install munge)") from None
        reclaim_if_holder_ended(self.dir / "lab.json", f"slurm lab {self.index}", lambda: SlurmLab(self.index).destroy())
        found = [f"namespace {n}" for n in _netns_names() if n.startswith(self.ns_prefix)]
        found += [f"link {n}" for n in _link_names() if n == self.bridge or n.startswith(self.veth_prefix)]
        if self.dir.exists():
            found.append(f"directory {self.dir}")
        for entry in json.loads(_run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]"):
            for info in entry.get("addr_info", []):
                if ipaddress.IPv4Address(info["local"]) in self.subnet:
                    found.append(f"address {info['local']} on {entry['ifname']}")
        if found:
            raise SlurmLabError(f"slurm lab {self.index} cannot be created, these exist already: {', '.join(found)}"
                                f"{held_by(self.dir / 'lab.json')}. "
                                f"If a previous run left them: python tests/lab/slurm.py destroy --index {self.index}; "
                                "else choose another --index")

    def create(self, ready_timeout: float = 30.0) -> SlurmLab:
        """Start the lab; on any failure remove what was started and raise SlurmLabError."""
        self._refuse_existing()
        atexit.register(self.destroy)
        try:
            self._create(ready_timeout)
        except BaseException:
            self.destroy()
            raise
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.dir / "log" / f"{name}.out"
        with open(log, "ab") as out:
            self._procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                                 env=self.env(), start_new_session=True)
        self._save()

    def _create(self, ready_timeout: float) -> None:
        self.dir.mkdir(mode=0o755)
        for sub in ("etc", "state", "log", "spool"):
            (self.dir / sub).mkdir(mode=0o755)
        self._save()
        self._start_munged(ready_timeout)
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.controller_address}/{self.subnet.prefixlen}", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for k, node in enumerate(self.node_names(), start=1):
            ns, veth = self.netns(node), f"{self.veth_prefix}{k}"
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "link", "set", veth, "master", self.bridge, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.node_address(node)}/{self.subnet.prefixlen}", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        self.conf.write_text(self._slurm_conf())
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.run("scontrol", "ping", check=False).returncode == 0, "slurmctld", ready_timeout,
                   "slurmctld")
        for node in self.node_names():
            (self.dir / "spool" / node).mkdir(mode=0o755)
            # nsenter execs unshare, which forks slurmd as PID 1 of a PID namespace of its own (with a /proc
            # to match): the node sees only its own processes, and when unshare ends, the kernel ends
            # everything in that namespace. Not `ip netns exec`, which remounts /sys.
            self._spawn(f"slurmd-{node}", ["nsenter", f"--net=/run/netns/{self.netns(node)}", "unshare", "--pid",
                                           "--fork", "--kill-child", "--mount-proc",
                                           "slurmd", "-D", "-f", str(self.conf), "-N", node])
        self._wait(self._all_idle, f"{self.nodes} idle nodes", ready_timeout, None)

    def _start_munged(self, ready_timeout: float) -> None:
        munge = pwd.getpwnam("munge")
        mdir = self.dir / "munge"
        for sub in ("", "etc", "run", "lib", "log"):
            d = mdir / sub
            # munged refuses a socket directory without execute permission for all.
            d.mkdir(mode=0o755 if sub in ("", "run") else 0o700, exist_ok=True)
            os.chown(d, munge.pw_uid, munge.pw_gid)
        key = mdir / "etc" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        os.chown(key, munge.pw_uid, munge.pw_gid)
        # setpriv execs munged as user munge: the PID recorded is munged's own.
        self._spawn("munged", ["setpriv", f"--reuid={munge.pw_uid}", f"--regid={munge.pw_gid}", "--clear-groups",
                               "munged", "--foreground", f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={mdir / 'run' / 'munged.pid'}", f"--log-file={mdir / 'log' / 'munged.log'}",
                               f"--seed-file={mdir / 'lib' / 'munged.seed'}"])
        self._wait(lambda: self.munge_socket.exists(), "munged's socket", ready_timeout, "munged")

    def _all_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return all(states.get(n) == "idle" for n in self.node_names())

    def _wait(self, ready, what: str, timeout: float, proc: str | None) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, p in self._procs.items():
                if (proc is None or name == proc) and p.poll() is not None:
                    raise SlurmLabError(f"{name} exited with {p.returncode} before {what} was ready: "
                                        f"{self._tail(name)}")
            if time.monotonic() > deadline:
                raise SlurmLabError(f"{what} not ready after {timeout:.0f} s; logs under {self.dir / 'log'}")
            time.sleep(0.1)

    def _tail(self, name: str) -> str:
        logs = [self.dir / "log" / f"{name}.out", self.dir / "log" / f"{name}.log"]
        return " | ".join(p.read_text(errors="replace")[-800:] for p in logs if p.exists())

    def _slurm_conf(self) -> str:
        host = socket.gethostname().split(".")[0]
        log = self.dir / "log"
        lines = [
            f"# Slurm lab {self.index} (tests/lab/slurm.py): every path under {self.dir}.",
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={host}({self.controller_address})",
            f"SlurmctldPort={self.controller_port}",
            f"SlurmdPort={self.node_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.dir / 'state'}",
            f"SlurmdSpoolDir={self.dir / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.dir / 'state' / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.dir / 'spool' / '%n' / 'slurmd.pid'}",
            f"SlurmctldLogFile={log / 'slurmctld.log'}",
            f"SlurmdLogFile={log / 'slurmd-%n.log'}",
            # What runs without systemd or cgroups.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "ReturnToService=2",
            # The nodes declare more CPUs than this host has: several jobs share it.
            "SlurmdParameters=config_overrides",
            f"KillWait={self.kill_wait}",
            "MinJobAge=600",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
        ]
        for node in self.node_names():
            lines.append(f"NodeName={node} NodeAddr={self.node_address(node)} NodeHostname={host} "
                         f"CPUs={self.cpus} State=UNKNOWN")
        lines.append(f"PartitionName={self.partition} Nodes={','.join(self.node_names())} Default=YES "
                     "MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _save(self) -> None:
        state = {"index": self.index, "owner": self.owner,
                 "holder": holder_record(self.holder) if self.holder else None, "dir": str(self.dir), "conf": str(self.conf),
                 "bridge": self.bridge, "subnet": str(self.subnet),
                 "nodes": {n: {"address": self.node_address(n), "netns": self.netns(n)} for n in self.node_names()},
                 "pids": {name: p.pid for name, p in self._procs.items()}}
        (self.dir / "lab.json").write_text(json.dumps(state, indent=2) + "\n")

    def _recorded(self) -> dict:
        try:
            return json.loads((self.dir / "lab.json").read_text())
        except (OSError, ValueError):
            return {}

    # ------------------------------------------------------------------ use
    def jobs(self) -> list[str]:
        """Ids of the lab's jobs that have not ended."""
        out = self.run("squeue", "-h", "-o", "%i", check=False)
        return out.stdout.split() if out.returncode == 0 else []

    def daemon_pids(self) -> set[int]:
        """The lab's own processes: munged, slurmctld, and per node unshare and its slurmd."""
        pids = set(self._recorded().get("pids", {}).values())
        for pid in list(pids):
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            if "unshare" in _cmdline(pid):
                pids.update(int(c) for c in children)
        return pids

    def job_pids(self, node: str | None = None) -> list[int]:
        """Processes on the lab's nodes (all of them, or `node`) other than slurmd: slurmstepds and
        everything the jobs started, also what escaped Slurm's process tracking."""
        daemons = self.daemon_pids()
        nodes = [node] if node else self.node_names()
        return sorted(p for n in nodes for p in netns_pids(self.netns(n)) if p not in daemons and alive(p))

    # ------------------------------------------------------------------ remove
    def destroy(self) -> list[str]:
        """Remove everything of lab `index` (also what a crashed run left); returns what was removed."""
        removed: list[str] = []
        recorded = self._recorded()
        if self.owner and recorded and recorded.get("owner", "") != self.owner:
            raise SlurmLabError(f"slurm lab {self.index} belongs to {recorded.get('owner')!r}, not to {self.owner!r}: "
                                "not removing it (without --owner, destroy removes it regardless)")
        pids = recorded.get("pids", {})
        if self.conf.exists() and "slurmctld" in pids and alive(pids["slurmctld"]):
            jobs = self.jobs()
            if jobs:
                self.run("scancel", *jobs, check=False)
                removed.append(f"jobs {' '.join(jobs)}")
                deadline = time.monotonic() + self.kill_wait + 30
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.5)
        for ns in [n for n in _netns_names() if n.startswith(self.ns_prefix)]:
            ended = end_pids(netns_pids(ns))
            if ended:
                removed.append(f"{len(ended)} processes in {ns}")
            if any(alive(p) for p in netns_pids(ns)):
                raise SlurmLabError(f"processes {netns_pids(ns)} in {ns} survived SIGKILL; the namespace is kept")
            _run(["ip", "netns", "delete", ns])
            removed.append(f"namespace {ns}")
        for link in _link_names():
            if link.startswith(self.veth_prefix) or link == self.bridge:
                _run(["ip", "link", "delete", link], check=False)
                removed.append(f"link {link}")
        for name in ("slurmctld", "munged"):
            pid = pids.get(name)
            if pid and alive(pid) and str(self.dir) in _cmdline(pid):
                end_pids([pid])
                removed.append(f"{name} ({pid})")
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.wait(timeout=10)
        self._procs.clear()
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
            removed.append(f"directory {self.dir}")
        atexit.unregister(self.destroy)
        return removed

    def leftovers(self) -> list[str]:
        """Anything of this lab that still exists: namespaces, links, its directory, processes naming it."""
        left = [f"namespace {n}" for n in _netns_names() if n.startswith(self.ns_prefix)]
        left += [f"link {n}" for n in _link_names() if n == self.bridge or n.startswith(self.veth_prefix)]
        if self.dir.exists():
            left.append(f"directory {self.dir}")
        marker = str(self.dir).encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if marker in cmdline and alive(int(proc.name)):
                args = cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]
                left.append(f"process {proc.name}: {args}")
        return left

    def __enter__(self) -> SlurmLab:
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/lab/slurm.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    create = sub.add_parser("create", help="start munged, slurmctld and the nodes' slurmds")
    create.add_argument("--nodes", type=int, default=3)
    create.add_argument("--cpus", type=int, default=4, help="CPUs each node declares")
    destroy = sub.add_parser("destroy", help="cancel the lab's jobs, stop its daemons, remove everything")
    for p in (create, destroy):
        p.add_argument("--owner", default="", help="who creates / may destroy the lab (destroy: only a lab of this owner)")
    create.add_argument("--holder", default="", metavar="PID|NAME",
                        help="the process whose end makes the lab a leftover that a later create removes: a PID, or "
                             "the nearest ancestor of this command named NAME; default: none")
    sub.add_parser("leftovers", help="list what is left of the lab")
    for p in sub.choices.values():
        p.add_argument("--index", type=int, required=True, help="the lab's number: subnet 10.245.INDEX.0/24")
    args = parser.parse_args(argv)
    try:
        if args.action == "create":
            lab = SlurmLab(args.index, nodes=args.nodes, cpus=args.cpus, owner=args.owner,
                           holder=find_holder(args.holder) if args.holder else None).create()
            atexit.unregister(lab.destroy)  # the lab outlives this command; `destroy` removes it
            print(json.dumps({"index": lab.index, "dir": str(lab.dir), "SLURM_CONF": str(lab.conf),
                              "nodes": {n: lab.node_address(n) for n in lab.node_names()}}, indent=2))
        elif args.action == "destroy":
            removed = SlurmLab(args.index, owner=args.owner).destroy()
            print("\n".join(f"removed {r}" for r in removed) or f"slurm lab {args.index}: nothing to remove")
        else:
            left = SlurmLab(args.index).leftovers()
            print("\n".join(f"left: {item}" for item in left) or f"slurm lab {args.index}: nothing left")
            return 1 if left else 0
    except LabError as exc:  # this lab's errors and the netns helpers' it uses
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
