"""rlrun: provision a Ray RL cluster from an Ansible inventory and run jobs on it.

Thin over the SDKs it wraps: ansible-runner for up / down / check, Ray's Jobs
API for submit / list / status / logs / stop. Every failure is one line on
stderr and a non-zero exit.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from rlrun.errors import RlrunError

console = Console()
err_console = Console(stderr=True)


class Context:
    def __init__(self, inventory: str | None, vault_password_file: str | None):
        self.inventory_arg = inventory
        self.vault_password_file = vault_password_file
        self._cluster = None

    @property
    def inventory(self) -> Path:
        from rlrun.inventory import default_inventory

        return Path(self.inventory_arg) if self.inventory_arg else default_inventory()

    @property
    def cluster(self):
        if self._cluster is None:
            from rlrun.inventory import load_cluster

            self._cluster = load_cluster(self.inventory, self.vault_password_file)
        return self._cluster

    def jobs(self):
        from rlrun.jobs import Jobs

        return Jobs(self.cluster)


pass_ctx = click.make_pass_decorator(Context)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-i", "--inventory", envvar="RLRUN_INVENTORY", type=click.Path(),
              help="Ansible inventory of the cluster (default: ./inventory, else the embedded one).")
@click.option("--vault-password-file", envvar="ANSIBLE_VAULT_PASSWORD_FILE", type=click.Path(),
              help="Vault password file, when the inventory's token is vaulted.")
@click.version_option(package_name="rlrun")
@click.pass_context
def cli(ctx, inventory, vault_password_file):
    """Stand up a Ray RL-training cluster from an inventory and run jobs on it."""
    ctx.obj = Context(inventory, vault_password_file)


def _print_run(result, action: str) -> None:
    table = Table(title=f"rlrun {action}")
    for col in ("host", "ok", "changed", "failed", "unreachable"):
        table.add_column(col)
    for host, res in sorted(result.hosts.items()):
        table.add_row(host, str(res.ok), str(res.changed), str(res.failed), str(res.unreachable))
    console.print(table)
    for host, res in sorted(result.hosts.items()):
        for error in res.errors:
            err_console.print(f"[red]{host}[/red]: {error}", markup=True, highlight=False)


def _playbook(obj: Context, name: str, verbose: bool, action: str, show_messages: bool = False) -> None:
    from rlrun.provision import run_playbook

    def progress(task: str) -> None:
        if not verbose:
            err_console.print(f"  {task}", style="dim", highlight=False)

    result = run_playbook(name, obj.inventory, verbose=verbose, progress=progress,
                          vault_password_file=obj.vault_password_file)
    _print_run(result, action)
    if show_messages and not verbose:
        for message in result.messages:
            console.print(message, highlight=False)
    if result.rc != 0:
        raise RlrunError(f"`rlrun {action}` failed on {sorted(h for h, r in result.hosts.items() if r.failed or r.unreachable)} "
                         f"(ansible exit {result.rc})")


@cli.command()
@click.option("-v", "--verbose", is_flag=True, help="Show Ansible's own output.")
@pass_ctx
def up(obj, verbose):
    """Provision the cluster: site.yml (validate, stack, Ray head and workers, status)."""
    _playbook(obj, "up", verbose, "up")


@cli.command()
@click.option("-v", "--verbose", is_flag=True, help="Show Ansible's own output.")
@pass_ctx
def down(obj, verbose):
    """Tear this cluster down (its own processes only, by pidfile or unit)."""
    _playbook(obj, "down", verbose, "down")


@cli.command()
@click.option("-v", "--verbose", is_flag=True, help="Show Ansible's own output.")
@pass_ctx
def check(obj, verbose):
    """Preflight every host: same versions, ports free (or this cluster's) and reachable,
    ulimit, /dev/shm, NCCL / Gloo interfaces, GPUs, reward service; one table of problems."""
    _playbook(obj, "preflight", verbose, "check", show_messages=True)


def _fmt_time(ms) -> str:
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S") if ms else "-"


@cli.command()
@click.argument("job_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def status(obj, job_id, as_json):
    """Cluster status (nodes, CPUs, GPUs), or one job's status with JOB_ID."""
    if job_id:
        info = obj.jobs().info(job_id)
        if as_json:
            click.echo(json.dumps({"job_id": job_id, "status": str(info.status.value), "message": info.message}))
        else:
            click.echo(f"{job_id}: {info.status.value}" + (f" ({info.message})" if info.message else ""))
        return
    from rlrun.dashboard import list_nodes, reward_health

    cluster = obj.cluster
    nodes = list_nodes(cluster.dashboard_url, cluster.token)
    if as_json:
        click.echo(json.dumps({"cluster": cluster.name, "dashboard": cluster.dashboard_url,
                               "nodes": [n.__dict__ for n in nodes],
                               "reward_services": {u: reward_health(u) for u in cluster.reward_urls}}))
        return
    table = Table(title=f"cluster {cluster.name} at {cluster.dashboard_url}")
    for col in ("node", "head", "state", "CPUs", "GPUs"):
        table.add_column(col)
    for n in sorted(nodes, key=lambda n: (not n.is_head, n.node_ip)):
        table.add_row(n.node_ip, "yes" if n.is_head else "", n.state, f"{n.cpus:g}", f"{n.gpus:g}")
    console.print(table)
    alive = [n for n in nodes if n.alive]
    console.print(f"{len(alive)} alive of {len(cluster.nodes)} in the inventory; "
                  f"{sum(n.cpus for n in alive):g} CPUs, {sum(n.gpus for n in alive):g} GPUs")
    for url in cluster.reward_urls:
        console.print(f"reward service {url}: {reward_health(url)}", highlight=False)


def _parse_env(pairs) -> dict[str, str]:
    env = {}
    for pair in pairs:
        if "=" not in pair or pair.startswith("="):
            raise RlrunError(f"--env {pair!r}: expected NAME=VALUE")
        key, value = pair.split("=", 1)
        env[key] = value
    return env


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--follow", "-f", is_flag=True, help="Stream the logs; exit non-zero unless the job succeeds.")
@click.option("--working-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory uploaded as the job's working_dir (default: the current directory).")
@click.option("--no-working-dir", is_flag=True, help="Upload nothing; run in the head's default directory.")
@click.option("--exclude", multiple=True, help="Extra pattern left out of the upload (repeatable).")
@click.option("--env", "env_pairs", multiple=True, help="NAME=VALUE for the job's environment (repeatable).")
@click.option("--submission-id", help="Job id to use (default: rlrun-<time>-<random>).")
@click.option("--num-cpus", type=float, default=0, show_default=True, help="CPUs reserved for the entrypoint.")
@click.option("--num-gpus", type=float, default=0, show_default=True, help="GPUs reserved for the entrypoint.")
@click.argument("entrypoint", nargs=-1, type=click.UNPROCESSED)
@pass_ctx
def submit(obj, follow, working_dir, no_working_dir, exclude, env_pairs, submission_id, num_cpus, num_gpus,
           entrypoint):
    """Submit a job: rlrun submit [OPTIONS] -- COMMAND [ARGS]..."""
    from rlrun.jobs import build_runtime_env

    wd = None if no_working_dir else (working_dir or Path.cwd())
    runtime_env = build_runtime_env(wd, _parse_env(env_pairs), list(exclude))
    jobs = obj.jobs()
    job_id = jobs.submit(list(entrypoint), runtime_env, submission_id, num_cpus, num_gpus)
    inv = f" -i {obj.inventory_arg}" if obj.inventory_arg else ""
    err_console.print(f"submitted {job_id} to {obj.cluster.dashboard_url}", highlight=False)
    if not follow:
        err_console.print(f"next:\n  rlrun{inv} logs -f {job_id}\n  rlrun{inv} status {job_id}\n"
                          f"  rlrun{inv} stop {job_id}", highlight=False)
        click.echo(job_id)
        return
    _follow(jobs, job_id, inv)


def _follow(jobs, job_id: str, inv: str) -> None:
    try:
        final = jobs.follow(job_id, write=lambda chunk: (sys.stdout.write(chunk), sys.stdout.flush()))
    except KeyboardInterrupt:
        err_console.print(f"\nstopped following; the job keeps running: rlrun{inv} stop {job_id}")
        raise SystemExit(130) from None
    err_console.print(f"job {job_id}: {final}", highlight=False)
    if final != "SUCCEEDED":
        info = jobs.info(job_id)
        raise RlrunError(f"job {job_id} ended {final}" + (f": {info.message}" if info.message else ""))


@cli.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def list_(obj, as_json):
    """List the cluster's jobs."""
    jobs = obj.jobs().list()
    if as_json:
        click.echo(json.dumps([{"job_id": j.submission_id, "status": str(j.status.value),
                                "entrypoint": j.entrypoint, "start_time": j.start_time,
                                "end_time": j.end_time} for j in jobs]))
        return
    table = Table(title=f"jobs on {obj.cluster.dashboard_url}")
    for col in ("job", "status", "started", "ended", "entrypoint"):
        table.add_column(col)
    for j in jobs:
        table.add_row(j.submission_id or j.job_id or "-", str(j.status.value), _fmt_time(j.start_time),
                      _fmt_time(j.end_time), (j.entrypoint or "")[:60])
    console.print(table)


@cli.command()
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the job ends.")
@pass_ctx
def logs(obj, job_id, follow):
    """Print a job's logs."""
    jobs = obj.jobs()
    if follow:
        _follow(jobs, job_id, f" -i {obj.inventory_arg}" if obj.inventory_arg else "")
    else:
        sys.stdout.write(jobs.logs(job_id))


@cli.command()
@click.argument("job_id")
@pass_ctx
def stop(obj, job_id):
    """Stop a running job."""
    jobs = obj.jobs()
    stopped = jobs.stop(job_id)
    click.echo(f"{job_id}: {'stop requested' if stopped else 'not running (' + jobs.status(job_id) + ')'}")


def main(argv: list[str] | None = None) -> int:
    """Entry point: RlrunError -> one line on stderr, exit 1."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        cli.main(args=argv, prog_name="rlrun", standalone_mode=False)
    except RlrunError as exc:
        err_console.print(f"error: {exc}", style="red", highlight=False, soft_wrap=True)
        return exc.exit_code
    except click.exceptions.Abort:
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def run() -> None:
    """Console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    run()
