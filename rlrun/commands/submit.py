"""`rlrun submit`: a command after `--`, or a preset (`--preset NAME [--set K=V]...`), checked against the
live cluster (rlrun/jobcheck.py) and submitted through Ray's Jobs API; with --follow, the progress view."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from rlrun import jobcheck, presets, resume, trainer_command
from rlrun.commands.context import Amount, Context, complete_presets, pass_ctx, presets_dir_option
from rlrun.commands.jobs import follow_job
from rlrun.commands.output import echo, plural, problem_list, say
from rlrun.errors import RlrunError
from rlrun.jobs import DEFAULT_EXCLUDES, build_runtime_env


def parse_env(pairs) -> dict[str, str]:
    """--env NAME=VALUE pairs as a dict."""
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


@click.command(cls=_SubmitCommand, context_settings={"allow_interspersed_args": False})
@click.option("--preset", "-p", "preset_name", metavar="NAME", shell_complete=complete_presets,
              help="Submit a named trainer job (see `rlrun presets`) instead of a command after `--`.")
@click.option("--set", "set_pairs", multiple=True, metavar="KEY=VALUE",
              help="Override a trainer flag of the preset, e.g. --set train_batch_size=64 (repeatable).")
@presets_dir_option
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
@click.option("--num-cpus", type=Amount("a number of CPUs"), default=0, show_default=True,
              help="CPUs reserved for the entrypoint.")
@click.option("--num-gpus", type=Amount("a number of GPUs"), default=0, show_default=True,
              help="GPUs reserved for the entrypoint.")
@click.option("--resume", "resume_from", metavar="JOB|PATH",
              help="Continue from the newest complete checkpoint: of job JOB (its --ckpt_path; its own command "
              "unless --preset or a command is given) or in the checkpoint directory PATH (a --ckpt_path on the "
              "nodes). The job gets --load_checkpoint and that --ckpt_path; any GPU count.")
@click.argument("entrypoint", nargs=-1, type=click.UNPROCESSED)
@pass_ctx
def submit(obj, preset_name, set_pairs, presets_dir, dry_run, no_check, debug, follow, working_dir, no_working_dir,
           exclude, env_pairs, name, submission_id, num_cpus, num_gpus, resume_from, entrypoint):
    """Submit a job: rlrun submit [OPTIONS] -- COMMAND [ARGS]...  or  rlrun submit --preset NAME [--set K=V]..."""
    if no_working_dir and working_dir:
        raise RlrunError("give --working-dir DIR or --no-working-dir, not both")
    entrypoint = list(entrypoint)
    env = parse_env(env_pairs)
    resuming, label = None, preset_name  # label: the preset `rlrun list` shows
    if resume_from is not None:
        resuming = resume.from_target(obj.jobs, resume_from)
        env = {**resuming.env_vars, **env}
        name = name or resuming.name
        if preset_name:
            set_pairs = resume.preset_sets(resuming, tuple(set_pairs))
        else:  # the command given, or JOB's own (a preset job's: what the nodes have installed, as then)
            label = None if entrypoint else resuming.preset
            no_working_dir = no_working_dir or (label is not None and not working_dir)
            entrypoint = resume.command(resuming, entrypoint)
    if working_dir:
        wd = working_dir.resolve()
    elif no_working_dir or preset_name:
        wd = None  # a preset runs `python -m trainer...` as installed on the nodes: nothing to upload
    else:
        wd = Path.cwd().resolve()
    if debug:
        env["RAY_DEBUG_POST_MORTEM"] = "1"
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
        argv = trainer_command.trainer_argv(entrypoint)
        if argv is not None:
            job = {"config": trainer_command.config_from_argv(argv), "expects_gpus": False}
    if not entrypoint:
        raise RlrunError("no entrypoint: give the command after `--`, e.g. rlrun submit -- python -c 'print(42)', "
                         "or --preset NAME (see `rlrun presets`)")
    runtime_env = build_runtime_env(wd, env, list(exclude))
    if resuming is not None:
        say(resume.check(resuming, obj.jobs, runtime_env, remote=not (no_check or dry_run)))
    if dry_run:
        echo(f"entrypoint: {shlex.join(entrypoint)}")
        echo(f"runtime_env: {json.dumps(runtime_env)}")
    if job is not None and not no_check:
        _check_job(obj, job, wd, DEFAULT_EXCLUDES + list(exclude), probe=not dry_run, env=env)
    if dry_run:
        say("dry run: nothing submitted")
        return
    jobs = obj.jobs()
    metadata = {k: v for k, v in (("preset", label), ("name", name), ("resumed_from", resume_from)) if v}
    job_id = jobs.submit(entrypoint, runtime_env, submission_id, num_cpus, num_gpus, metadata=metadata)
    inv = obj.inv_flag
    say(f"submitted {job_id} to cluster {obj.cluster.name}"
        + ("" if wd else " (nothing uploaded: it runs what the nodes have installed)"))
    say(f"dashboard: {obj.cluster.dashboard_url}/#/jobs/{job_id} (it asks for the cluster token)")
    if not follow:
        say(f"next:\n  rlrun{inv} status -f {job_id}   # progress view\n  rlrun{inv} logs -f {job_id}     # the whole "
            f"log\n  rlrun{inv} plot {job_id}\n  rlrun{inv} stop {job_id}")
        echo(job_id)
        return
    say(f"following (Ctrl-C stops following, not the job); the whole log: rlrun{inv} logs {job_id}")
    follow_job(obj, jobs, job_id)


def _preset_job(obj: Context, name: str, set_pairs, presets_dir, wd: Path | None, dry_run: bool) -> dict:
    """Load, override and validate a preset; make its tiny artefacts; print what differs from it."""
    preset = presets.load_preset(name, presets.preset_dirs(presets_dir))
    sets = presets.parse_sets(set_pairs)
    context = {"workdir": str(wd or Path.cwd().resolve()), "reward_url": ",".join(obj.cluster.reward_urls),
               **presets.retriever_context(obj.cluster)}
    cfg = presets.build_config(preset, sets, context)
    where = "built-in" if preset.builtin else str(preset.path)
    say(f"preset {preset.name} ({where}): {preset.description}; expects {preset.hardware}")
    for key, old, new in presets.differences(preset, sets):
        say(f"  --set {key}: {old!r} (preset) -> {new!r}")
    if not sets:
        say("  no --set overrides")
    todo = presets.missing_artifacts(preset, context)
    if dry_run:
        for path, command in todo:
            say(f"  would make {path}: {' '.join(command[1:])}")
    else:
        presets.make_artifacts(todo, log=lambda text: say(f"  {text}"))
    named = {**preset.values, **sets}
    return {"config": cfg, "entrypoint": trainer_command.entrypoint(cfg, named),
            "expects_gpus": preset.hardware.accelerator == "gpu"}


def _check_job(obj: Context, job: dict, wd: Path | None, excludes: list[str], probe: bool,
               env: dict[str, str] | None = None) -> None:
    """Refuse, with the arithmetic, a trainer job the live cluster cannot run."""
    cluster = obj.cluster
    view = jobcheck.gather(cluster, job["config"], wd, probe=probe, jobs=obj.jobs() if probe else None,
                           timeout=obj.timeout, env=env)
    report = jobcheck.check(job["config"], view, expects_gpus=job["expects_gpus"], workdir=wd, excludes=excludes)
    say(f"checks against cluster {cluster.name} at {cluster.dashboard_url}:")
    for line in report.lines:
        say(f"  {line}")
    for note in report.notes:
        say(f"  note: {note}")
    if not probe:
        say("  note: paths on the nodes are looked at by a probe job, which --dry-run does not submit; the reward "
            "service was asked from this machine")
    if report.problems:
        raise RlrunError(f"refused: the job cannot run on cluster {cluster.name} "
                         f"({plural(len(report.problems), 'problem')}):\n{problem_list(report.problems)}\n"
                         "(--no-check skips these checks)")
