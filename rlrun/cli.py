"""rlrun: provision a Ray RL cluster from an Ansible inventory and run jobs on it.

Thin over the SDKs it wraps: ansible-runner for up / down / check, Ray's Jobs
API for submit / list / status / logs / stop. Every failure is one line on
stderr and a non-zero exit; every wait on the cluster has a timeout.
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

from rlrun.errors import RlrunError, one_line
from rlrun.fabric.check import fabric_options, run_fabric

console = Console()
err_console = Console(stderr=True)
DEFAULT_TIMEOUT = 30.0


def say(text: str) -> None:
    """A line for people on stderr (stdout keeps what scripts read: ids, tables, JSON)."""
    err_console.print(text, highlight=False, markup=False, soft_wrap=True)


class Context:
    def __init__(self, inventory: str | None, vault_password_file: str | None, timeout: float):
        self.inventory_arg = inventory
        self.vault_password_file = vault_password_file
        self.timeout = timeout
        self._cluster = None

    @property
    def inventory(self) -> Path:
        from rlrun.inventory import default_inventory

        if self.inventory_arg is None and os.environ.get("RLRUN_INVENTORY") == "":
            raise RlrunError("RLRUN_INVENTORY is set but empty: give the inventory's path (or unset it to use "
                             "./inventory)")
        return Path(self.inventory_arg) if self.inventory_arg else default_inventory()

    @property
    def inv_flag(self) -> str:
        """` -i INV` for the commands rlrun suggests, when one was given."""
        return f" -i {self.inventory_arg}" if self.inventory_arg else ""

    @property
    def cluster(self):
        if self._cluster is None:
            from rlrun.inventory import load_cluster

            self._cluster = load_cluster(self.inventory, self.vault_password_file)
        return self._cluster

    def jobs(self):
        from rlrun.jobs import Jobs

        return Jobs(self.cluster, timeout=self.timeout)


pass_ctx = click.make_pass_decorator(Context)


def _complete_presets(ctx, param, incomplete: str) -> list[str]:
    """Shell completion of preset names (built-in and $RLRUN_PRESETS_DIR)."""
    try:
        from rlrun import presets as P

        return [p.name for p in P.load_all(P.preset_dirs(())) if p.name.startswith(incomplete)]
    except Exception:  # noqa: BLE001 - completion must never print a traceback into the shell
        return []


def _not_empty(ctx, param, value):
    if value is not None and not str(value).strip():
        raise click.BadParameter("is empty (an unset shell variable?): give the inventory's path")
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-i", "--inventory", envvar="RLRUN_INVENTORY", type=click.Path(), callback=_not_empty,
              help="Ansible inventory of the cluster (default: $RLRUN_INVENTORY, ./inventory, else the embedded one).")
@click.option("--vault-password-file", envvar="ANSIBLE_VAULT_PASSWORD_FILE",
              type=click.Path(exists=True, dir_okay=False),
              help="Vault password file, when the inventory's token is vaulted.")
@click.option("--timeout", type=click.FloatRange(min=0.1), envvar="RLRUN_TIMEOUT", default=DEFAULT_TIMEOUT,
              show_default=True, help="Seconds to wait for each answer from the cluster ($RLRUN_TIMEOUT).")
@click.version_option(package_name="rlrun")
@click.pass_context
def cli(ctx, inventory, vault_password_file, timeout):
    """Stand up a Ray RL-training cluster from an inventory and run jobs on it.

    Shell completion (bash): eval "$(_RLRUN_COMPLETE=bash_source rlrun)"; zsh: zsh_source; fish: fish_source.
    """
    ctx.obj = Context(inventory, vault_password_file, timeout)


# --- cluster: validate / up / down / check / status ----------------------------------------------------------


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


def _playbook(obj: Context, name: str, verbose: bool, action: str, max_time: float,
              show_messages: bool = False) -> None:
    from rlrun.provision import run_playbook

    _refuse_bad_inventory(obj)

    def progress(task: str) -> None:
        if not verbose:
            err_console.print(f"  {task}", style="dim", highlight=False)

    result = run_playbook(name, obj.inventory, verbose=verbose, progress=progress,
                          vault_password_file=obj.vault_password_file, timeout=max_time)
    _print_run(result, action)
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


def _problems_error(obj: Context, problems: list, what: str = "") -> RlrunError:
    n = len(problems)
    return RlrunError(f"inventory {obj.inventory}: {n} problem{'s' if n != 1 else ''}{what}:\n"
                      + "\n".join(f"  - {p}" for p in problems))


def _refuse_bad_inventory(obj: Context) -> None:
    """The offline check of `rlrun validate`, before any playbook touches a host (the validate play repeats
    it inside Ansible for `ansible-playbook` users)."""
    from rlrun.validate import validate_inventory

    problems = validate_inventory(obj.inventory, vault_password_file=obj.vault_password_file).problems
    if problems:
        raise _problems_error(obj, problems, "; nothing was done on any host")


def _max_time(default: int):
    return click.option("--max-time", type=click.FloatRange(min=1), default=default, show_default=True,
                        help="Seconds the whole playbook may take before rlrun stops it.")


@cli.command()
@click.option("-v", "--verbose", is_flag=True, help="Show Ansible's own output.")
@_max_time(3600)
@pass_ctx
def up(obj, verbose, max_time):
    """Provision the cluster: site.yml (validate, stack, Ray head and workers, status)."""
    _playbook(obj, "up", verbose, "up", max_time)


@cli.command()
@click.option("-v", "--verbose", is_flag=True, help="Show Ansible's own output.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask; tear down at once (scripts).")
@_max_time(900)
@pass_ctx
def down(obj, verbose, yes, max_time):
    """Tear this cluster down (its own processes only, by pidfile or unit): asks first, naming the cluster."""
    cluster = obj.cluster
    running = _running_jobs(obj)
    what = (f"cluster '{cluster.name}' from inventory {cluster.inventory} (head {cluster.head}, "
            f"{len(cluster.nodes)} node{'s' if len(cluster.nodes) != 1 else ''}: {', '.join(cluster.nodes)}"
            f"{'; reward service on ' + ', '.join(cluster.reward_hosts) if cluster.reward_hosts else ''}"
            f"{'; retrieval service on ' + ', '.join(cluster.retriever_hosts) if cluster.retriever_hosts else ''})")
    say(f"this stops {what}{running}")
    if not yes:
        if not sys.stdin.isatty():
            raise RlrunError(f"not tearing down {what} without a confirmation: stdin is not a terminal, "
                             "pass --yes")
        if not click.confirm(f"tear down cluster '{cluster.name}'?", default=False, err=True):
            raise RlrunError("nothing torn down")
    _playbook(obj, "down", verbose, "down", max_time)


def _running_jobs(obj: Context) -> str:
    """'; 2 jobs running: a, b' when the cluster answers quickly; '' otherwise (down must work on a dead head)."""
    from rlrun.jobs import Jobs

    try:
        rows = Jobs(obj.cluster, timeout=min(obj.timeout, 5.0)).rows()
    except RlrunError:
        return ""
    live = [r.job_id for r in rows if r.status in ("RUNNING", "PENDING")]
    return f"; it kills {len(live)} running job{'s' if len(live) != 1 else ''}: {', '.join(live)}" if live else ""


@cli.command()
@click.option("-v", "--verbose", is_flag=True, help="Show Ansible's own output.")
@_max_time(900)
@fabric_options
@pass_ctx
def check(obj, verbose, max_time, **fabric):
    """Preflight every host: same versions, ports free (or this cluster's) and reachable,
    ulimit, /dev/shm, NCCL / Gloo interfaces, GPUs, reward and retrieval services; one table of problems.
    --fabric: collectives across the live cluster instead (rlrun/fabric/)."""
    if run_fabric(obj, max_time, **fabric):
        return
    _playbook(obj, "preflight", verbose, "check", max_time, show_messages=True)


def _columns(lines: list[tuple[str, ...]]) -> str:
    """Plain aligned columns (like `kubectl get`): never cut, whatever the terminal's width, so ids can be
    copied and grepped."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def _fmt_time(ms) -> str:
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S") if ms else "-"


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


@cli.command()
@click.argument("job_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("-f", "--follow", is_flag=True, help="With JOB_ID: the progress view until the job ends.")
@pass_ctx
def status(obj, job_id, as_json, follow):
    """Cluster status: nodes, CPUs, GPUs, reward and retrieval services against the inventory (exit 1 when
    anything is off), or one job's status with JOB_ID."""
    if job_id:
        jobs = obj.jobs()
        if follow:
            _follow(obj, jobs, job_id)
            return
        from rlrun.jobs import short_message

        info = jobs.info(job_id)
        message = short_message(info.message)
        if as_json:
            click.echo(json.dumps({"job_id": job_id, "status": str(info.status.value), "message": message}))
        else:
            click.echo(f"{job_id}: {info.status.value}" + (f" ({message})" if message else ""))
        return
    if follow:
        raise RlrunError("--follow needs a JOB_ID (rlrun status -f JOB)")
    from rlrun.dashboard import cluster_problems, list_nodes, retriever_health

    cluster = obj.cluster
    nodes = list_nodes(cluster.dashboard_url, cluster.token, timeout=obj.timeout)
    reward = {u: _reward_health(cluster, u, timeout=min(obj.timeout, 5.0)) for u in cluster.reward_urls}
    retrievers = {u: retriever_health(u, timeout=min(obj.timeout, 5.0)) for u in cluster.retriever_urls.values()}
    problems = cluster_problems(cluster, nodes, reward, retrievers)
    if as_json:
        click.echo(json.dumps({"cluster": cluster.name, "dashboard": cluster.dashboard_url,
                               "nodes": [n.__dict__ for n in nodes], "reward_services": reward,
                               "retrieval_services": retrievers, "problems": problems}))
    else:
        table = Table(title=f"cluster {cluster.name} at {cluster.dashboard_url}")
        for col in ("node", "head", "state", "CPUs", "GPUs"):
            table.add_column(col)
        for n in sorted(nodes, key=lambda n: (not n.is_head, n.node_ip)):
            table.add_row(n.node_ip, "yes" if n.is_head else "", n.state, f"{n.cpus:g}", f"{n.gpus:g}")
        console.print(table)
        alive = [n for n in nodes if n.alive]
        console.print(f"{len(alive)} alive of {len(cluster.nodes)} in the inventory; "
                      f"{sum(n.cpus for n in alive):g} CPUs, {sum(n.gpus for n in alive):g} GPUs")
        for url, health in reward.items():
            console.print(f"reward service {url}: {health}", highlight=False)
        for url, health in retrievers.items():
            console.print(f"retrieval service {url}: {health}", highlight=False)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise RlrunError(f"cluster {cluster.name} is not as the inventory says "
                         f"({len(problems)} problem{'s' if len(problems) != 1 else ''}):\n{lines}")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="The problems as JSON.")
@pass_ctx
def validate(obj, as_json):
    """Check the inventory offline (no host is touched): types, ranges, addresses, paths, groups, cluster name,
    token, ports against each other. Every problem at once; exit 1 when there is any."""
    from rlrun.validate import validate_inventory

    report = validate_inventory(obj.inventory, vault_password_file=obj.vault_password_file)
    if as_json:
        click.echo(json.dumps({"inventory": str(obj.inventory), "problems": [p.to_json() for p in report.problems],
                               "hosts": report.hosts}))
    if report.problems:
        raise _problems_error(obj, report.problems)
    if not as_json:
        click.echo(f"inventory {obj.inventory}: ok (cluster {report.cluster_name}, {len(report.hosts)} "
                   f"host{'s' if len(report.hosts) != 1 else ''}: {', '.join(report.hosts)})")


def _reward_health(cluster, url: str, timeout: float) -> str:
    """A reward service's health, with the reward token (checks it is accepted) and the cluster's reward CA."""
    from rlrun.dashboard import reward_health

    ca = str(cluster.reward_ca) if cluster.reward_ca else None
    try:
        token = cluster.reward_token
    except RlrunError:
        # No reward token on this controller (provisioned from another one, with only cluster__token vaulted):
        # the health check alone; the jobs read the token on the nodes.
        token = None
    return reward_health(url, timeout=timeout, token=token, ca=ca)


# --- jobs: submit / list / logs / stop / plot ---------------------------------------------------------------


def _parse_env(pairs) -> dict[str, str]:
    env = {}
    for pair in pairs:
        if "=" not in pair or pair.startswith("="):
            raise RlrunError(f"--env {pair!r}: expected NAME=VALUE")
        key, value = pair.split("=", 1)
        env[key] = value
    return env


class _SubmitCommand(click.Command):
    """Options end at the first word of the command; options written after it are refused unless a `--`
    says they belong to the command (`rlrun submit python train.py --env A=B` is ambiguous)."""

    def parse_args(self, ctx, args):
        raw = list(args)  # click's parser consumes the list it is given
        rest = super().parse_args(ctx, args)
        entry = ctx.params.get("entrypoint") or ()
        after_dashdash = len(raw) > len(entry) and raw[len(raw) - len(entry) - 1] == "--"
        flags = [w for w in entry[1:] if w.startswith("-")]
        if entry and not after_dashdash and flags:
            raise click.UsageError(
                f"{' '.join(flags[:3])} after the command {entry[0]!r}: rlrun's options go before the command and "
                f"the command after `--`, e.g. rlrun submit [OPTIONS] -- {' '.join(entry)}", ctx)
        return rest


@cli.command(cls=_SubmitCommand, context_settings={"allow_interspersed_args": False})
@click.option("--preset", "-p", "preset_name", metavar="NAME", shell_complete=_complete_presets,
              help="Submit a named trainer job (see `rlrun presets`) instead of a command after `--`.")
@click.option("--set", "set_pairs", multiple=True, metavar="KEY=VALUE",
              help="Override a trainer flag of the preset, e.g. --set train_batch_size=64 (repeatable).")
@click.option("--presets-dir", multiple=True, type=click.Path(file_okay=False),
              help="Extra directory of NAME.yaml presets (also $RLRUN_PRESETS_DIR; repeatable).")
@click.option("--dry-run", is_flag=True, help="Check, print the entrypoint and runtime_env, submit nothing.")
@click.option("--no-check", is_flag=True, help="Skip the checks against the live cluster (placement, reward "
              "service, paths on the nodes); the trainer's own config checks still run.")
@click.option("--debug", is_flag=True, help="Set RAY_DEBUG_POST_MORTEM=1: a failing task waits for Ray's debugger.")
@click.option("--follow", "-f", is_flag=True, help="Follow with a progress view (metrics and errors; the full log "
              "stays in `rlrun logs`); exit non-zero unless the job succeeds.")
@click.option("--working-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory uploaded as the job's working_dir (default: the current directory for a command; "
              "nothing for a preset, which runs the trainer installed on the nodes).")
@click.option("--no-working-dir", is_flag=True, help="Upload nothing; run in the head's default directory.")
@click.option("--exclude", multiple=True, help="Extra pattern left out of the upload (repeatable).")
@click.option("--env", "env_pairs", multiple=True, help="NAME=VALUE for the job's environment (repeatable).")
@click.option("--name", help="A name for the job, shown by `rlrun list` (default: the preset or the command).")
@click.option("--submission-id", help="Job id to use (default: rlrun-<time>-<random>).")
@click.option("--num-cpus", type=float, default=0, show_default=True, help="CPUs reserved for the entrypoint.")
@click.option("--num-gpus", type=float, default=0, show_default=True, help="GPUs reserved for the entrypoint.")
@click.argument("entrypoint", nargs=-1, type=click.UNPROCESSED)
@pass_ctx
def submit(obj, preset_name, set_pairs, presets_dir, dry_run, no_check, debug, follow, working_dir, no_working_dir,
           exclude, env_pairs, name, submission_id, num_cpus, num_gpus, entrypoint):
    """Submit a job: rlrun submit [OPTIONS] -- COMMAND [ARGS]...  or  rlrun submit --preset NAME [--set K=V]..."""
    from rlrun.jobs import DEFAULT_EXCLUDES, build_runtime_env

    if no_working_dir and working_dir:
        raise RlrunError("give --working-dir DIR or --no-working-dir, not both")
    if working_dir:
        wd = working_dir.resolve()
    elif no_working_dir or preset_name:
        wd = None  # a preset runs `python -m trainer...` as installed on the nodes: nothing to upload
    else:
        wd = Path.cwd().resolve()
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
        say("dry run: nothing submitted")
        return
    jobs = obj.jobs()
    metadata = {k: v for k, v in (("preset", preset_name), ("name", name)) if v}
    job_id = jobs.submit(entrypoint, runtime_env, submission_id, num_cpus, num_gpus, metadata=metadata)
    inv = obj.inv_flag
    say(f"submitted {job_id} to cluster {obj.cluster.name}"
        + ("" if wd else " (nothing uploaded: it runs what the nodes have installed)"))
    say(f"dashboard: {obj.cluster.dashboard_url}/#/jobs/{job_id} (it asks for the cluster token)")
    if not follow:
        say(f"next:\n  rlrun{inv} status -f {job_id}   # progress view\n  rlrun{inv} logs -f {job_id}     # the whole "
            f"log\n  rlrun{inv} plot {job_id}\n  rlrun{inv} stop {job_id}")
        click.echo(job_id)
        return
    say(f"following (Ctrl-C stops following, not the job); the whole log: rlrun{inv} logs {job_id}")
    _follow(obj, jobs, job_id)


def _preset_job(obj: Context, name: str, set_pairs, presets_dir, wd: Path | None, dry_run: bool) -> dict:
    """Load, override and validate a preset; make its tiny artefacts; print what differs from it."""
    from rlrun import presets as P

    preset = P.load_preset(name, P.preset_dirs(presets_dir))
    sets = P.parse_sets(set_pairs)
    context = {"workdir": str(wd or Path.cwd().resolve()), "reward_url": ",".join(obj.cluster.reward_urls),
               **P.retriever_context(obj.cluster)}
    cfg = P.build_config(preset, sets, context)
    where = "built-in" if preset.builtin else str(preset.path)
    say(f"preset {preset.name} ({where}): {preset.description}; expects {preset.hardware}")
    for key, old, new in P.differences(preset, sets):
        say(f"  --set {key}: {old!r} (preset) -> {new!r}")
    if not sets:
        say("  no --set overrides")
    todo = P.missing_artifacts(preset, context)
    if dry_run:
        for path, command in todo:
            say(f"  would make {path}: {' '.join(command[1:])}")
    else:
        P.make_artifacts(todo, log=lambda text: say(f"  {text}"))
    named = {**preset.values, **sets}
    return {"config": cfg, "entrypoint": P.entrypoint(cfg, named), "expects_gpus": preset.hardware.accelerator == "gpu"}


def _check_job(obj: Context, job: dict, wd: Path | None, excludes: list[str], probe: bool) -> None:
    """Refuse, with the arithmetic, a trainer job the live cluster cannot run."""
    from rlrun.jobcheck import check, gather

    cluster = obj.cluster
    view = gather(cluster, job["config"], wd, probe=probe, jobs=obj.jobs() if probe else None, timeout=obj.timeout)
    report = check(job["config"], view, expects_gpus=job["expects_gpus"], workdir=wd, excludes=excludes)
    say(f"checks against cluster {cluster.name} at {cluster.dashboard_url}:")
    for line in report.lines:
        say(f"  {line}")
    for note in report.notes:
        say(f"  note: {note}")
    if not probe:
        say("  note: paths on the nodes are looked at by a probe job, which --dry-run does not submit; the reward "
            "service was asked from this machine")
    if report.problems:
        lines = "\n".join(f"  - {p}" for p in report.problems)
        raise RlrunError(f"refused: the job cannot run on cluster {cluster.name} "
                         f"({len(report.problems)} problem{'s' if len(report.problems) != 1 else ''}):\n{lines}\n"
                         "(--no-check skips these checks)")


def _follow(obj: Context, jobs, job_id: str) -> None:
    from rlrun.follow import follow
    from rlrun.jobs import short_message

    inv = obj.inv_flag
    try:
        final, follower = follow(jobs, job_id, err_console)
    except KeyboardInterrupt:
        say(f"\nstopped following; the job keeps running: rlrun{inv} stop {job_id}")
        raise SystemExit(130) from None
    steps = f" after {follower.step}/{follower.total} steps" if follower.total is not None else ""
    summary = f"; last {follower.summary()}" if follower.summary() else ""
    say(f"job {job_id}: {final}{steps}{summary}")
    if follower.curve():
        say(follower.curve())
    if final != "SUCCEEDED":
        info = jobs.info(job_id)
        message = short_message(info.message)
        tail = follower.failure_tail(jobs.logs(job_id), 30)
        if tail.strip():
            say(f"the last lines of the log the view left out (all of it: rlrun{inv} logs {job_id}):\n{tail.rstrip()}")
        raise RlrunError(f"job {job_id} ended {final}" + (f": {message}" if message else ""))


@cli.command()
@click.argument("name", required=False, shell_complete=_complete_presets)
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
        retriever = P.retriever_context(obj.cluster)["retriever_url"]
    except RlrunError:
        reward = retriever = None
    context = {"workdir": str(Path.cwd().resolve()), "reward_url": reward or "http://REWARD-SERVICE/get_reward",
               "retriever_url": retriever or "http://{node_ip}:RETRIEVER-PORT/retrieve"}
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
@click.argument("job_ids", nargs=-1, metavar="[JOB]...")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="PNG to write (default: JOB.png, or JOB1-vs-JOB2.png for several).")
@click.option("--log", "log_files", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Read a run's metrics from a saved job log instead of the cluster (repeatable).")
@click.option("--smooth", type=click.FloatRange(0, 0.999), default=None,
              help="Exponential smoothing weight in [0, 1) (TensorBoard's; default: by run length; 0 = off). "
              "The raw values stay as a faint line.")
@pass_ctx
def plot(obj, job_ids, output, log_files, smooth):
    """Plot jobs' metrics to a PNG: reward and accuracy, KL, losses, lengths, timings, learning rate; several
    jobs (or --log files) are overlaid, one colour each."""
    from rlrun.plot import read_run, write_png

    if not job_ids and not log_files:
        raise RlrunError("give one or more JOB ids (see `rlrun list`) or --log FILE")
    runs = []
    jobs = obj.jobs() if job_ids else None
    for job_id in job_ids:
        info = jobs.info(job_id)
        preset = (info.metadata or {}).get("preset") or (info.metadata or {}).get("name")
        runs.append(read_run(jobs.logs(job_id).splitlines(), job_id, preset))
    for path in log_files:
        runs.append(read_run(path.read_text(encoding="utf-8", errors="replace").splitlines(), path.stem))
    empty = [r.label for r in runs if not r.rows]
    if empty:
        raise RlrunError(f"no @metrics lines in the log of {', '.join(empty)} (has it finished a step yet? is it a "
                         "`python -m trainer.train_ppo_ray` job?)")
    out = output or Path("-vs-".join(r.label for r in runs)[:150] + ".png")
    plotted = write_png(runs, out, smooth=smooth)
    click.echo(f"wrote {out}: " + "; ".join(f"{panel}: {', '.join(keys)}" for panel, keys in plotted.items()))


@cli.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every field, full ids).")
@click.option("--status", "statuses", multiple=True, metavar="STATUS",
              type=click.Choice(["PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"], case_sensitive=False),
              help="Only jobs in this state (repeatable).")
@click.option("--name", "name_glob", metavar="PATTERN", help="Only jobs whose name or preset matches (glob).")
@click.option("-n", "--last", "last", type=click.IntRange(min=0), default=20, show_default=True,
              help="The most recent N jobs (0 = all).")
@click.option("--drivers/--no-drivers", default=True, show_default=True,
              help="Include drivers that connected without the Jobs API.")
@click.option("--all", "show_all", is_flag=True, help="Also rlrun's own probe jobs (the pre-submit checks).")
@pass_ctx
def list_(obj, as_json, statuses, name_glob, last, drivers, show_all):
    """List the cluster's jobs: id, name or preset, status, step, start and duration."""
    import fnmatch

    jobs = obj.jobs()
    rows = jobs.rows()
    if not show_all:
        from rlrun.probe import PROBE_JOB_PREFIX

        rows = [r for r in rows if not r.job_id.startswith(PROBE_JOB_PREFIX)]
    if statuses:
        wanted = {s.upper() for s in statuses}
        rows = [r for r in rows if r.status in wanted]
    if name_glob:
        rows = [r for r in rows if fnmatch.fnmatch(r.name, name_glob) or (r.preset and fnmatch.fnmatch(r.preset, name_glob))]
    if not drivers:
        rows = [r for r in rows if r.kind != "DRIVER"]
    if last:
        rows = rows[-last:]
    jobs.add_progress(rows)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows]))
        return
    say(f"jobs on cluster {obj.cluster.name} ({obj.cluster.dashboard_url})")
    lines = [("JOB", "NAME", "STATUS", "STEP", "STARTED", "TOOK")]
    for r in rows:
        step = f"{r.step}/{r.total_steps}" if r.step is not None else (f"0/{r.total_steps}" if r.total_steps else "-")
        name = r.name if len(r.name) <= 28 else r.name[:27] + "…"
        lines.append((r.job_id, name, r.status + (" (driver)" if r.kind == "DRIVER" else ""), step,
                      _fmt_time(r.start_time), _fmt_duration(r.duration)))
    if rows:
        click.echo(_columns(lines))
    else:
        say("no jobs" + (" match" if statuses or name_glob else ""))


@cli.command()
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the job ends.")
@click.option("--tail", "tail", type=click.IntRange(min=1), default=None, metavar="N",
              help="Only the last N lines (with -f: then stream what comes).")
@pass_ctx
def logs(obj, job_id, follow, tail):
    """Print a job's whole log (library warnings included; `rlrun status -f JOB` shows the progress view)."""
    from rlrun.jobs import log_tail

    jobs = obj.jobs()
    if not follow:
        text = jobs.logs(job_id)
        sys.stdout.write(log_tail(text, tail) if tail else text)
        return
    skip = 0
    if tail:
        text = jobs.logs(job_id)
        sys.stdout.write(log_tail(text, tail))
        skip = len(text)

    def write(chunk: str) -> None:
        nonlocal skip
        if skip:
            cut = min(skip, len(chunk))
            chunk, skip = chunk[cut:], skip - cut
        sys.stdout.write(chunk)
        sys.stdout.flush()

    try:
        final = jobs.follow(job_id, write=write)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    say(f"job {job_id}: {final}")


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
    """Entry point: every failure is one line on stderr and a non-zero exit (RLRUN_TRACEBACK=1 shows where)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        cli.main(args=argv, prog_name="rlrun", standalone_mode=False)
    except RlrunError as exc:
        err_console.print(f"error: {exc}", style="red", highlight=False, markup=False, soft_wrap=True)
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        say("interrupted")
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:  # noqa: BLE001 - the CLI's promise: no traceback, one line
        if os.environ.get("RLRUN_TRACEBACK"):
            raise
        err_console.print(f"error: {one_line(exc)}", style="red", highlight=False, markup=False, soft_wrap=True)
        return 1
    return 0


def run() -> None:
    """Console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    run()
