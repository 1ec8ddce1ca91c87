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
@click.option("--preset", "-p", "preset_name", metavar="NAME",
              help="Submit a named trainer job (see `rlrun presets`) instead of a command after `--`.")
@click.option("--set", "set_pairs", multiple=True, metavar="KEY=VALUE",
              help="Override a trainer flag of the preset, e.g. --set train_batch_size=64 (repeatable).")
@click.option("--presets-dir", multiple=True, type=click.Path(file_okay=False),
              help="Extra directory of NAME.yaml presets (also $RLRUN_PRESETS_DIR; repeatable).")
@click.option("--dry-run", is_flag=True, help="Check, print the entrypoint and runtime_env, submit nothing.")
@click.option("--no-check", is_flag=True, help="Skip the checks against the live cluster (placement, reward "
              "service, paths on the nodes); the trainer's own config checks still run.")
@click.option("--debug", is_flag=True, help="Set RAY_DEBUG_POST_MORTEM=1: a failing task waits for Ray's debugger.")
@click.option("--follow", "-f", is_flag=True, help="Stream the logs with a progress bar; exit non-zero unless "
              "the job succeeds.")
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
def submit(obj, preset_name, set_pairs, presets_dir, dry_run, no_check, debug, follow, working_dir, no_working_dir,
           exclude, env_pairs, submission_id, num_cpus, num_gpus, entrypoint):
    """Submit a job: rlrun submit [OPTIONS] -- COMMAND [ARGS]...  or  rlrun submit --preset NAME [--set K=V]..."""
    from rlrun.jobs import DEFAULT_EXCLUDES, build_runtime_env

    wd = None if no_working_dir else (working_dir or Path.cwd()).resolve()
    env = _parse_env(env_pairs)
    if debug:
        env["RAY_DEBUG_POST_MORTEM"] = "1"
    entrypoint = list(entrypoint)
    job = None
    if preset_name:
        if entrypoint:
            raise RlrunError(f"give either --preset or a command after `--`, not both (got --preset {preset_name} "
                             f"and {' '.join(entrypoint)!r}); change the preset's flags with --set KEY=VALUE")
        job = _preset_job(obj, preset_name, set_pairs, presets_dir, wd, dry_run)
        entrypoint = job["entrypoint"]
    elif set_pairs:
        raise RlrunError("--set needs --preset NAME (a command after `--` takes the trainer's flags directly)")
    else:
        from rlrun.presets import trainer_argv

        argv = trainer_argv(entrypoint)
        if argv is not None:
            from rlrun.presets import config_from_argv

            job = {"config": config_from_argv(argv), "expects_gpus": False}
    if not entrypoint:
        raise RlrunError("no entrypoint: give the command after `--`, e.g. rlrun submit -- python -c 'print(42)', "
                         "or --preset NAME (see `rlrun presets`)")
    runtime_env = build_runtime_env(wd, env, list(exclude))
    if dry_run:
        import shlex

        click.echo(f"entrypoint: {shlex.join(entrypoint)}")
        click.echo(f"runtime_env: {json.dumps(runtime_env)}")
    if job is not None and not no_check:
        _check_job(obj, job, wd, DEFAULT_EXCLUDES + list(exclude), probe=not dry_run)
    if dry_run:
        err_console.print("dry run: nothing submitted", highlight=False, markup=False, soft_wrap=True)
        return
    jobs = obj.jobs()
    job_id = jobs.submit(entrypoint, runtime_env, submission_id, num_cpus, num_gpus,
                         metadata={"preset": preset_name} if preset_name else None)
    inv = f" -i {obj.inventory_arg}" if obj.inventory_arg else ""
    err_console.print(f"submitted {job_id} to {obj.cluster.dashboard_url}", highlight=False, markup=False, soft_wrap=True)
    if not follow:
        err_console.print(f"next:\n  rlrun{inv} logs -f {job_id}\n  rlrun{inv} status {job_id}\n"
                          f"  rlrun{inv} plot {job_id}\n  rlrun{inv} stop {job_id}", highlight=False, markup=False, soft_wrap=True)
        click.echo(job_id)
        return
    err_console.print(f"following (Ctrl-C stops following, not the job); later: rlrun{inv} plot {job_id}",
                      highlight=False, markup=False, soft_wrap=True)
    _follow(jobs, job_id, inv)


def _preset_job(obj: Context, name: str, set_pairs, presets_dir, wd: Path | None, dry_run: bool) -> dict:
    """Load, override and validate a preset; make its tiny artefacts; print what differs from it."""
    from rlrun import presets as P

    preset = P.load_preset(name, P.preset_dirs(presets_dir))
    sets = P.parse_sets(set_pairs)
    context = {"workdir": str(wd or Path.cwd().resolve()), "reward_url": ",".join(obj.cluster.reward_urls)}
    cfg = P.build_config(preset, sets, context)
    where = "built-in" if preset.builtin else str(preset.path)
    err_console.print(f"preset {preset.name} ({where}): {preset.description}; expects {preset.hardware}",
                      highlight=False, markup=False, soft_wrap=True)
    for key, old, new in P.differences(preset, sets):
        err_console.print(f"  --set {key}: {old!r} (preset) -> {new!r}", highlight=False, markup=False, soft_wrap=True)
    if not sets:
        err_console.print("  no --set overrides", highlight=False, markup=False, soft_wrap=True)
    todo = P.missing_artifacts(preset, context)
    if dry_run:
        for path, command in todo:
            err_console.print(f"  would make {path}: {' '.join(command[1:])}", highlight=False, markup=False, soft_wrap=True)
    else:
        P.make_artifacts(todo, log=lambda text: err_console.print(f"  {text}", highlight=False, markup=False, soft_wrap=True))
    named = {**preset.values, **sets}
    return {"config": cfg, "entrypoint": P.entrypoint(cfg, named), "expects_gpus": preset.hardware.accelerator == "gpu"}


def _check_job(obj: Context, job: dict, wd: Path | None, excludes: list[str], probe: bool) -> None:
    """Refuse, with the arithmetic, a trainer job the live cluster cannot run."""
    from rlrun.jobcheck import check, gather

    cluster = obj.cluster
    view = gather(cluster, job["config"], wd, probe=probe, jobs=obj.jobs() if probe else None)
    report = check(job["config"], view, expects_gpus=job["expects_gpus"], workdir=wd, excludes=excludes)
    err_console.print(f"checks against cluster {cluster.name} at {cluster.dashboard_url}:", highlight=False, markup=False, soft_wrap=True)
    for line in report.lines:
        err_console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
    for note in report.notes:
        err_console.print(f"  note: {note}", highlight=False, markup=False, soft_wrap=True)
    if not probe:
        err_console.print("  note: paths on the nodes are looked at by a probe job, which --dry-run does not "
                          "submit; the reward service was asked from this machine", highlight=False, markup=False, soft_wrap=True)
    if report.problems:
        lines = "\n".join(f"  - {p}" for p in report.problems)
        raise RlrunError(f"refused: the job cannot run on cluster {cluster.name} "
                         f"({len(report.problems)} problem{'s' if len(report.problems) != 1 else ''}):\n{lines}\n"
                         "(--no-check skips these checks)")


def _follow(jobs, job_id: str, inv: str) -> None:
    from rlrun.follow import follow

    try:
        final, follower = follow(jobs, job_id, err_console)
    except KeyboardInterrupt:
        err_console.print(f"\nstopped following; the job keeps running: rlrun{inv} stop {job_id}", soft_wrap=True)
        raise SystemExit(130) from None
    steps = f" after {follower.step}/{follower.total} steps" if follower.total is not None else ""
    summary = f"; last {follower.summary()}" if follower.summary() else ""
    err_console.print(f"job {job_id}: {final}{steps}{summary}", highlight=False, markup=False, soft_wrap=True)
    if follower.curve():
        err_console.print(follower.curve(), highlight=False, markup=False, soft_wrap=True)
    if final != "SUCCEEDED":
        info = jobs.info(job_id)
        raise RlrunError(f"job {job_id} ended {final}" + (f": {info.message}" if info.message else ""))


@cli.command()
@click.argument("name", required=False)
@click.option("--presets-dir", multiple=True, type=click.Path(file_okay=False),
              help="Extra directory of NAME.yaml presets (also $RLRUN_PRESETS_DIR; repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def presets(obj, name, presets_dir, as_json):
    """List the presets, or show one: its file, the resolved trainer command and derived sizes."""
    from rlrun import presets as P

    dirs = P.preset_dirs(presets_dir)
    if not name:
        found = P.load_all(dirs)
        if as_json:
            click.echo(json.dumps([{"name": p.name, "description": p.description, "hardware": str(p.hardware),
                                    "algorithm": p.values.get("advantage_estimator", "gae"),
                                    "path": str(p.path), "builtin": p.builtin} for p in found]))
            return
        table = Table(title="presets (rlrun presets NAME shows one; rlrun submit --preset NAME runs it)")
        for col in ("preset", "algorithm", "hardware", "description", "from"):
            table.add_column(col)
        for p in found:
            table.add_row(p.name, str(p.values.get("advantage_estimator", "gae")), str(p.hardware), p.description,
                          "built-in" if p.builtin else str(p.path.parent))
        console.print(table)
        return
    preset = P.load_preset(name, dirs)
    try:
        reward = ",".join(obj.cluster.reward_urls) or None
    except RlrunError:
        reward = None
    context = {"workdir": str(Path.cwd().resolve()), "reward_url": reward or "http://REWARD-SERVICE/get_reward"}
    cfg = P.build_config(preset, {}, context)
    if as_json:
        click.echo(json.dumps({"name": preset.name, "path": str(preset.path), "values": preset.values,
                               "config": cfg.to_dict(redact=True)}, default=list))
        return
    import shlex

    click.echo(f"# {preset.path}")
    click.echo(preset.text.rstrip())
    click.echo(f"\n# resolved ({{workdir}} = {context['workdir']}, {{reward_url}} = {context['reward_url']}):")
    click.echo(shlex.join(P.entrypoint(cfg, preset.values)))
    derived = {k: v for k, v in cfg.to_dict().items() if k not in preset.values and k in _derived_names()}
    click.echo("# derived: " + ", ".join(f"{k}={v}" for k, v in derived.items()))


def _derived_names() -> tuple[str, ...]:
    from trainer.config import TrainerConfig
    from trainer.config.fields import derived_names

    return derived_names(TrainerConfig)


@cli.command()
@click.argument("job_id", required=False)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="PNG to write (default: JOB_ID.png).")
@click.option("--log", "log_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Read the metrics from a saved job log instead of the cluster.")
@pass_ctx
def plot(obj, job_id, output, log_file):
    """Plot a job's reward, KL, losses and phase timings (from its @metrics log lines) to a PNG."""
    from rlrun.plot import read_log, write_png

    if not job_id and not log_file:
        raise RlrunError("give a JOB_ID (see `rlrun list`) or --log FILE")
    text = log_file.read_text(encoding="utf-8", errors="replace") if log_file else obj.jobs().logs(job_id)
    source = str(log_file) if log_file else f"job {job_id}"
    plan, rows = read_log(text.splitlines())
    if not rows:
        raise RlrunError(f"{source}: no @metrics lines in the log (has it finished a step yet? is it a "
                         "`python -m trainer.train_ppo_ray` job?)")
    out = output or Path(f"{job_id or log_file.stem}.png")
    total = f"/{plan['total_steps']}" if "total_steps" in plan else ""
    plotted = write_png(rows, out, f"{source}: {len(rows)}{total} steps")
    click.echo(f"wrote {out}: " + "; ".join(f"{panel}: {', '.join(keys)}" for panel, keys in plotted.items()))


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


def _add_slurm() -> None:
    from rlrun.slurm.cli import slurm

    cli.add_command(slurm)


_add_slurm()


def main(argv: list[str] | None = None) -> int:
    """Entry point: RlrunError -> one line on stderr, exit 1."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        cli.main(args=argv, prog_name="rlrun", standalone_mode=False)
    except RlrunError as exc:
        err_console.print(f"error: {exc}", style="red", highlight=False, markup=False, soft_wrap=True)
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
