"""`rlrun check --fabric` on the controller: submit the fabric job, follow it, print its table or JSON.

The job (``rlrun/fabric/job.py``) goes through the Jobs API with the inventory's address and token, as
``rlrun submit`` sends a command: ``SHIPPED`` (the job, its actors and what they import, nothing else)
copied into a temporary directory that becomes the job's ``working_dir`` (``jobs.build_runtime_env``).
The job needs no resources of its own (it runs on the head); its ranks reserve a placement group. While it
runs, its ``fabric:`` lines are shown; at the end its ``@fabric`` report is held against the thresholds
(``findings.py``) and the inventory's interface names. Its id starts with ``rlrun-probe-``, so
``rlrun list`` leaves it out (``--all`` shows it); its log stays for ``rlrun logs``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console

from rlrun.contract import open_contract
from rlrun.errors import RlrunError
from rlrun.fabric.findings import Finding, evaluate, has_errors
from rlrun.fabric.job import FABRIC_TAG, PROGRESS
from rlrun.inventory import PROJECT_DIR
from rlrun.jobs import build_runtime_env
from rlrun.probe import PROBE_JOB_PREFIX

# The job's working dir: these files and nothing else (tests/unit/test_fabric_findings.py checks that every
# rlrun / trainer module they import is among them).
SHIPPED = ("rlrun/__init__.py", "rlrun/fabric/__init__.py", "rlrun/fabric/job.py", "rlrun/fabric/rank.py",
           "rlrun/fabric/nccl_log.py", "trainer/__init__.py", "trainer/collective_deadline.py", "trainer/errors.py",
           "trainer/learn/__init__.py", "trainer/learn/group.py")
JOB_PREFIX = f"{PROBE_JOB_PREFIX}fabric-"
DEFAULT_DEADLINE_S = 20.0  # the check's collectives are tiny and its cluster idle: seconds are plenty


def ship(dest: Path) -> Path:
    """Copy SHIPPED under `dest`; returns it."""
    for rel in SHIPPED:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PROJECT_DIR / rel, target)
    return dest


def request(deadline: float, backend: str, size_mib: float | None, place_timeout: float) -> dict:
    return {"deadline_s": deadline, "backend": backend, "place_timeout_s": place_timeout,
            "size_bytes": int(size_mib * 2**20) if size_mib else None}


def parse_report(log: str) -> dict | None:
    for line in reversed(log.splitlines()):
        if line.startswith(FABRIC_TAG + " "):
            return json.loads(line[len(FABRIC_TAG) + 1:])
    return None


def run(jobs, req: dict, max_time: float, progress: Callable[[str], None]) -> tuple[str, dict]:
    """Submit the fabric job, show its progress lines, wait for its report; (job id, report)."""

    job_id = f"{JOB_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory(prefix="rlrun-fabric-") as tmp:
        runtime_env = build_runtime_env(ship(Path(tmp)), {}, [])
        jobs.submit(["python", "-m", "rlrun.fabric.job", json.dumps(req)], runtime_env, job_id,
                    metadata={"rlrun": "fabric"})
    progress(f"submitted {job_id}")
    deadline = time.monotonic() + max_time
    shown = 0
    status = jobs.status(job_id)
    while True:
        log = jobs.logs(job_id)
        lines = [line for line in log.splitlines() if line.startswith(PROGRESS + " ")]
        for line in lines[shown:]:
            progress(line[len(PROGRESS) + 1:])
        shown = len(lines)
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        if time.monotonic() > deadline:
            jobs.stop(job_id)
            raise RlrunError(f"the fabric job {job_id} did not finish within {max_time:g} s (--max-time); it was "
                             f"stopped. Its log: rlrun logs {job_id}")
        time.sleep(1.0)
        status = jobs.status(job_id)
    report = parse_report(log) if status == "SUCCEEDED" else None
    if report is None:
        tail = "\n".join(log.strip().splitlines()[-15:])
        raise RlrunError(f"the fabric job {job_id} ended {status} without a report; its log ends:\n{tail}")
    return job_id, report


def inventory_interfaces(cluster, vault_password_file: str | None = None) -> dict[str, dict[str, str | None]]:
    """Node address -> the inventory's NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME for that host (roles/accel_env's
    variables, their defaults under the inventory's values)."""
    contract = open_contract(cluster.inventory, vault_password_file, roles=("cluster", "accel_env"))
    out = {}
    for host, address in cluster.node_addresses.items():
        variables = contract.variables(host)
        out[address] = {var: (str(contract.get(host, name)) if variables.get(name) else None)
                        for var, name in (("NCCL_SOCKET_IFNAME", "accel_env__nccl_socket_ifname"),
                                          ("GLOO_SOCKET_IFNAME", "accel_env__gloo_socket_ifname"))}
    return out


def full_report(cluster, job_id: str, report: dict, inventory: dict) -> tuple[dict, list[Finding]]:
    findings = evaluate(report, inventory)
    return {"cluster": cluster.name, "job_id": job_id, **report,
            "findings": [f.to_json() for f in findings]}, findings


# --- the table ----------------------------------------------------------------------------------------------
def _gb(value) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) else "-"


def columns(rows: list[tuple[str, ...]]) -> str:
    """Plain aligned columns, never cut whatever the terminal's width (addresses and lines get copied)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def render(full: dict, findings: list[Finding]) -> str:
    """The report as text: a header line, the pairs, the all-reduce, the findings."""
    ranks, nodes = len(full.get("ranks", [])), len(full.get("nodes", []))
    out = [f"fabric of cluster {full['cluster']}: {ranks} {full.get('backend', '?')} rank{'s' if ranks != 1 else ''} "
           f"on {nodes} node{'s' if nodes != 1 else ''}, {(full.get('size_bytes') or 0) / 2**20:g} MiB messages, "
           f"deadline {full['deadline_s']:g} s; {full.get('seconds', 0):.1f} s in the job "
           f"(its log: rlrun logs {full['job_id']})"]
    if full.get("pairs"):
        rows = [("PAIR", "KIND", "TRANSPORT", "INTERFACE", "A->B GB/s", "B->A GB/s", "LATENCY us", "RESULT")]
        for p in full["pairs"]:
            gbps = p.get("gbps") or {}
            result = "ok" if p.get("status") == "ok" else f"{p.get('status')} ({p.get('phase') or p.get('why')})"
            rows.append((f"{p['a']} <-> {p['b']}", p["kind"], p.get("transport") or "-", p.get("interface") or "-",
                         _gb(gbps.get("a->b")), _gb(gbps.get("b->a")),
                         f"{p['latency_us']:.0f}" if p.get("latency_us") else "-", result))
        out.append(columns(rows))
    reduce = full.get("allreduce") or {}
    if reduce.get("status") == "ok":
        via = ", ".join(f"{k} x{v}" for k, v in sorted((reduce.get("transports") or {}).items()))
        out.append(f"all-reduce over {reduce['ranks']} ranks: {reduce['seconds'] * 1e3:.1f} ms, algbw "
                   f"{reduce['algbw_gbps']:.2f} GB/s, busbw {reduce['busbw_gbps']:.2f} GB/s"
                   + (f" (connections: {via})" if via else ""))
    elif reduce:
        out.append(f"all-reduce over {reduce.get('ranks')} ranks: {reduce.get('status')} "
                   f"({reduce.get('why') or reduce.get('line')})")
    out += [f"node {s['address']} not in the check: {s['why']}" for s in full.get("skipped_nodes", [])]
    if findings:
        out.append(columns([("SEVERITY", "CHECK", "WHERE", "FINDING")]
                           + [(f.severity, f.check, f.where, f.message) for f in findings]))
    else:
        out.append("no findings")
    return "\n".join(out)


def fabric_options(command):
    """The options `rlrun check` takes for --fabric (rlrun/commands/cluster.py adds them with this one decorator;
    --json is the command's own)."""

    for option in reversed([
        click.option("--fabric", is_flag=True, help="Instead of the preflight: run collectives across the live "
                     "cluster (a send/recv between every pair of nodes, an all-reduce across all) and report "
                     "GB/s, latency, transport and interface per pair, and the findings."),
        click.option("--deadline", type=click.FloatRange(min=1), default=DEFAULT_DEADLINE_S, show_default=True,
                     help="With --fabric: seconds a collective may make no progress before it is reported."),
        click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto", show_default=True,
                     help="With --fabric: nccl (one rank per GPU), gloo (one per node); auto: nccl where the "
                     "cluster has GPUs."),
        click.option("--size-mib", type=click.FloatRange(min=0.001), default=None,
                     help="With --fabric: message size for GB/s (default: 256 MiB with NCCL, 16 MiB with gloo)."),
    ]):
        command = option(command)
    return command


def run_fabric(obj, max_time: float, fabric: bool, as_json: bool, deadline: float, backend: str,
               size_mib: float | None) -> bool:
    """`rlrun check --fabric`: run it, print it, exit 1 (RlrunError) on an error-level finding; True when it
    ran, False without --fabric (the preflight then runs)."""

    if not fabric:
        given = [name for name, on in (("--deadline", deadline != DEFAULT_DEADLINE_S),
                                       ("--backend", backend != "auto"), ("--size-mib", size_mib)) if on]
        if given:
            raise RlrunError(f"{', '.join(given)} belong{'s' if len(given) == 1 else ''} to `rlrun check --fabric`; "
                             "the preflight prints its table only")
        return False
    err = Console(stderr=True)

    def say(text: str) -> None:
        err.print(text, highlight=False, markup=False, soft_wrap=True)

    cluster = obj.cluster
    inventory = inventory_interfaces(cluster, obj.vault_password_file)
    say(f"fabric check of cluster {cluster.name} at {cluster.dashboard_url}")
    job_id, report = run(obj.jobs(), request(deadline, backend, size_mib, place_timeout=min(60.0, max_time / 2)),
                         max_time, progress=lambda line: say(f"  {line}"))
    full, findings = full_report(cluster, job_id, report, inventory)
    click.echo(json.dumps(full, default=str) if as_json else render(full, findings))
    if has_errors(findings):
        errors = [f for f in findings if f.severity == "error"]
        raise RlrunError(f"fabric of cluster {cluster.name}: {len(errors)} problem{'s' if len(errors) != 1 else ''}:\n"
                         + "\n".join(f"  - {f.where}: {f.message}" for f in errors))
    return True
