"""The cluster's commands: validate (offline), up, down and check (playbooks through ansible-runner),
status (the live cluster against its inventory)."""

from __future__ import annotations

import dataclasses
import sys

import click

from rlrun import dashboard, provision
from rlrun import validate as validation
from rlrun.commands import jobs as job_commands
from rlrun.commands.context import Context, max_time_option, pass_ctx, verbose_option
from rlrun.commands.output import (
    console,
    emit_json,
    err_console,
    host_error,
    json_option,
    plural,
    problem_list,
    say,
    table,
)
from rlrun.errors import RlrunError
from rlrun.fabric.check import fabric_options, run_fabric


def _problems_error(obj: Context, problems: list, what: str = "") -> RlrunError:
    return RlrunError(f"inventory {obj.inventory}: {plural(len(problems), 'problem')}{what}:\n"
                      + problem_list(problems))


def _refuse_bad_inventory(obj: Context) -> None:
    """The offline check of `rlrun validate`, before any playbook touches a host (the validate play repeats
    it inside Ansible for `ansible-playbook` users)."""
    problems = validation.validate_inventory(obj.inventory, vault_password_file=obj.vault_password_file).problems
    if problems:
        raise _problems_error(obj, problems, "; nothing was done on any host")


def _run_json(result: provision.RunResult) -> dict:
    """A playbook run as JSON: each host's task counts and errors, the play's messages and error."""
    return {"rc": result.rc, "timed_out": result.timed_out, "error": result.error, "messages": result.messages,
            "hosts": {host: dataclasses.asdict(r) for host, r in sorted(result.hosts.items())}}


def _playbook(obj: Context, name: str, verbose: bool, action: str, max_time: float, as_json: bool,
              show_messages: bool = False) -> None:
    _refuse_bad_inventory(obj)

    def progress(task: str) -> None:
        if not verbose:
            err_console.print(f"  {task}", style="dim", highlight=False)

    result = provision.run_playbook(name, obj.inventory, verbose=verbose, progress=progress,
                                    vault_password_file=obj.vault_password_file, timeout=max_time)
    if as_json:
        emit_json(_run_json(result))
    else:
        table(f"rlrun {action}", ("host", "ok", "changed", "failed", "unreachable"),
              [(host, str(r.ok), str(r.changed), str(r.failed), str(r.unreachable))
               for host, r in sorted(result.hosts.items())])
        for host, r in sorted(result.hosts.items()):
            for error in r.errors:
                host_error(host, error)
        if show_messages and not verbose:
            for message in result.messages:
                console.print(message, highlight=False)
    if result.timed_out:
        raise RlrunError(f"`rlrun {action}` gave up after {max_time:g} s (--max-time); the hosts may be "
                         "half-changed: run it again, it picks up where it stopped")
    if result.rc != 0:
        failed = sorted(h for h, r in result.hosts.items() if r.failed or r.unreachable)
        if failed:
            raise RlrunError(f"`rlrun {action}` failed on {', '.join(failed)} (ansible exit {result.rc})")
        raise RlrunError(f"`rlrun {action}` stopped on an error outside any host's task (ansible exit {result.rc}): "
                         + (result.error or "run it with -v for Ansible's output"))


@click.command()
@verbose_option
@max_time_option(3600)
@json_option
@pass_ctx
def up(obj, verbose, max_time, as_json):
    """Provision the cluster: site.yml (validate, stack, Ray head and workers, status)."""
    _playbook(obj, "up", verbose, "up", max_time, as_json)


@click.command()
@verbose_option
@click.option("-y", "--yes", is_flag=True, help="Do not ask; tear down at once (scripts).")
@max_time_option(900)
@json_option
@pass_ctx
def down(obj, verbose, yes, max_time, as_json):
    """Tear this cluster down (its own processes only, by pidfile or unit): asks first, naming the cluster."""
    cluster = obj.cluster
    running = _running_jobs(obj)
    what = (f"cluster '{cluster.name}' from inventory {cluster.inventory} (head {cluster.head}, "
            f"{plural(len(cluster.nodes), 'node')}: {', '.join(cluster.nodes)}"
            f"{'; reward service on ' + ', '.join(cluster.reward_hosts) if cluster.reward_hosts else ''}"
            f"{'; retrieval service on ' + ', '.join(cluster.retriever_hosts) if cluster.retriever_hosts else ''})")
    say(f"this stops {what}{running}")
    if not yes:
        if not sys.stdin.isatty():
            raise RlrunError(f"not tearing down {what} without a confirmation: stdin is not a terminal, "
                             "pass --yes")
        if not click.confirm(f"tear down cluster '{cluster.name}'?", default=False, err=True):
            raise RlrunError("nothing torn down")
    _playbook(obj, "down", verbose, "down", max_time, as_json)


def _running_jobs(obj: Context) -> str:
    """'; 2 jobs running: a, b' when the cluster answers quickly; '' otherwise (down must work on a dead head)."""
    try:
        rows = obj.jobs(timeout=min(obj.timeout, 5.0)).rows()
    except RlrunError:
        return ""
    live = [r.job_id for r in rows if r.status in ("RUNNING", "PENDING")]
    return f"; it kills {plural(len(live), 'running job')}: {', '.join(live)}" if live else ""


@click.command()
@verbose_option
@max_time_option(900)
@json_option
@fabric_options
@pass_ctx
def check(obj, verbose, max_time, as_json, **fabric):
    """Preflight every host: same versions, ports free (or this cluster's) and reachable,
    ulimit, /dev/shm, NCCL / Gloo interfaces, GPUs, reward and retrieval services; one table of problems.
    --fabric: collectives across the live cluster instead (rlrun/fabric/)."""
    if run_fabric(obj, max_time, as_json=as_json, **fabric):
        return
    _playbook(obj, "preflight", verbose, "check", max_time, as_json, show_messages=True)


@click.command()
@click.argument("job_id", required=False)
@json_option
@click.option("-f", "--follow", is_flag=True, help="With JOB_ID: the progress view until the job ends.")
@pass_ctx
def status(obj, job_id, as_json, follow):
    """Cluster status: nodes, CPUs, GPUs, reward and retrieval services against the inventory (exit 1 when
    anything is off), or one job's status with JOB_ID."""
    if job_id:
        job_commands.job_status(obj, job_id, as_json, follow)
        return
    if follow:
        raise RlrunError("--follow needs a JOB_ID (rlrun status -f JOB)")
    cluster = obj.cluster
    nodes = dashboard.list_nodes(cluster.dashboard_url, cluster.token, timeout=obj.timeout)
    reward = {u: _reward_health(cluster, u, timeout=min(obj.timeout, 5.0)) for u in cluster.reward_urls}
    retrievers = {u: dashboard.retriever_health(u, timeout=min(obj.timeout, 5.0))
                  for u in cluster.retriever_urls.values()}
    problems = dashboard.cluster_problems(cluster, nodes, reward, retrievers)
    if as_json:
        emit_json({"cluster": cluster.name, "dashboard": cluster.dashboard_url,
                   "nodes": [n.__dict__ for n in nodes], "reward_services": reward,
                   "retrieval_services": retrievers, "problems": problems})
    else:
        table(f"cluster {cluster.name} at {cluster.dashboard_url}", ("node", "head", "state", "CPUs", "GPUs"),
              [(n.node_ip, "yes" if n.is_head else "", n.state, f"{n.cpus:g}", f"{n.gpus:g}")
               for n in sorted(nodes, key=lambda n: (not n.is_head, n.node_ip))])
        alive = [n for n in nodes if n.alive]
        console.print(f"{len(alive)} alive of {len(cluster.nodes)} in the inventory; "
                      f"{sum(n.cpus for n in alive):g} CPUs, {sum(n.gpus for n in alive):g} GPUs")
        for url, health in reward.items():
            console.print(f"reward service {url}: {health}", highlight=False)
        for url, health in retrievers.items():
            console.print(f"retrieval service {url}: {health}", highlight=False)
    if problems:
        raise RlrunError(f"cluster {cluster.name} is not as the inventory says "
                         f"({plural(len(problems), 'problem')}):\n{problem_list(problems)}")


def _reward_health(cluster, url: str, timeout: float) -> str:
    """A reward service's health, with the reward token (checks it is accepted) and the cluster's reward CA."""
    ca = str(cluster.reward_ca) if cluster.reward_ca else None
    try:
        token = cluster.reward_token
    except RlrunError:
        # No reward token on this controller (provisioned from another one, with only cluster__token vaulted):
        # the health check alone; the jobs read the token on the nodes.
        token = None
    return dashboard.reward_health(url, timeout=timeout, token=token, ca=ca)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="The problems as JSON.")
@pass_ctx
def validate(obj, as_json):
    """Check the inventory offline (no host is touched): types, ranges, addresses, paths, groups, cluster name,
    token, ports against each other. Every problem at once; exit 1 when there is any."""
    report = validation.validate_inventory(obj.inventory, vault_password_file=obj.vault_password_file)
    if as_json:
        emit_json({"inventory": str(obj.inventory), "problems": [p.to_json() for p in report.problems],
                   "hosts": report.hosts})
    if report.problems:
        raise _problems_error(obj, report.problems)
    if not as_json:
        click.echo(f"inventory {obj.inventory}: ok (cluster {report.cluster_name}, "
                   f"{plural(len(report.hosts), 'host')}: {', '.join(report.hosts)})")


COMMANDS = (validate, up, down, check, status)
