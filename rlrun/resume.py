"""`rlrun submit --resume JOB|PATH`: which checkpoint directory a resumed job continues from, the command that
continues it, and whether a complete checkpoint is there before anything is submitted.

JOB is a job of this cluster: its entrypoint (read back through the Jobs API) says its ``--ckpt_path``, and is
the command resubmitted unless a preset or a command is given. PATH is a ``--ckpt_path`` on the nodes. The
new job gets ``--load_checkpoint`` and that ``--ckpt_path``; the trainer takes the newest complete checkpoint
there (:mod:`trainer.checkpoint`). The directory is looked at before submitting: here when this machine sees it
(the one-machine cluster, a shared file system), else by a short job on the head, which is where the trainer's
driver will read it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rlrun import trainer_command
from rlrun.errors import RlrunError
from rlrun.probe import run_short_job
from trainer import checkpoint
from trainer.config import TrainerConfig


@dataclass
class Resume:
    """Where a resumed job continues from."""

    ckpt_path: str
    source: str  # "job X" or "directory P", for the messages
    job_id: str | None = None
    entrypoint: list[str] = field(default_factory=list)  # JOB's command (empty for PATH)
    preset: str | None = None  # JOB's preset (metadata)
    name: str | None = None  # JOB's --name
    env_vars: dict[str, str] = field(default_factory=dict)  # JOB's runtime_env env_vars
    uploaded: bool = False  # JOB ran in an uploaded working dir


def is_path(target: str) -> bool:
    """A checkpoint directory rather than a job id: it has a '/' or starts with '~' or '.'."""
    return "/" in target or target.startswith(("~", "."))


def from_target(jobs_factory, target: str) -> Resume:
    """JOB or PATH, resolved: a path as given; a job through the Jobs API (its command must be the trainer's,
    it must have ended, and a relative --ckpt_path must not point into its uploaded working dir)."""
    if not target.strip():
        raise RlrunError("--resume '': expected a job id of this cluster or a checkpoint directory (--ckpt_path)")
    if is_path(target):
        return Resume(ckpt_path=target, source=f"directory {target}")
    jobs = jobs_factory()
    info = jobs.info(target)
    status = str(getattr(info.status, "value", info.status))
    if status not in ("SUCCEEDED", "FAILED", "STOPPED"):
        raise RlrunError(f"job {target} is {status}: stop it first (rlrun stop {target}); two jobs must not write "
                         "the same checkpoints")
    entry = shlex.split(info.entrypoint or "")
    argv = trainer_command.trainer_argv(entry)
    if argv is None:
        raise RlrunError(f"job {target} runs {shlex.join(entry[:2]) or 'nothing'} ..., not the trainer "
                         f"(python -m trainer.train_ppo_ray): it has no checkpoints to resume")
    cfg = trainer_command.config_from_argv(argv)
    runtime_env = info.runtime_env or {}
    uploaded = bool(runtime_env.get("working_dir"))
    if uploaded and not Path(cfg.ckpt_path).expanduser().is_absolute():
        raise RlrunError(f"job {target} wrote its checkpoints to --ckpt_path {cfg.ckpt_path}, relative to its uploaded "
                         "working dir on the head, which a new job does not share: resume with --resume PATH (that "
                         "directory's absolute path on the head) or give jobs an absolute --ckpt_path")
    meta = info.metadata or {}
    return Resume(ckpt_path=cfg.ckpt_path, source=f"job {target}", job_id=target, entrypoint=entry,
                  preset=meta.get("preset") or None, name=meta.get("name") or None,
                  env_vars=dict(runtime_env.get("env_vars") or {}), uploaded=uploaded)


def command(resume: Resume, entrypoint: list[str]) -> list[str]:
    """``entrypoint`` (a trainer command; JOB's own when empty) with ``--load_checkpoint --ckpt_path P``."""
    entry = list(entrypoint or resume.entrypoint)
    if not entry:
        raise RlrunError(f"--resume {resume.ckpt_path} needs the job to continue: give --preset NAME or the trainer "
                         "command after `--` (or --resume JOB to take a job's own command)")
    if trainer_command.trainer_argv(entry) is None:
        raise RlrunError(f"--resume: {shlex.join(entry[:3])}... is not the trainer (python -m trainer.train_ppo_ray): "
                         "only trainer jobs resume from checkpoints")
    kept: list[str] = []
    words = iter(entry)
    for word in words:  # an earlier --ckpt_path (a job that was itself resumed) goes: one directory, stated once
        if word == "--ckpt_path":
            next(words, None)
        elif not word.startswith("--ckpt_path="):
            kept.append(word)
    flags = [] if "--load_checkpoint" in kept else ["--load_checkpoint"]
    return [*kept, *flags, "--ckpt_path", resume.ckpt_path]


def preset_sets(resume: Resume, set_pairs: tuple[str, ...]) -> tuple[str, ...]:
    """A preset's --set pairs with ``load_checkpoint=true`` and ``ckpt_path=P`` (a --set ckpt_path of another
    directory is a contradiction)."""
    for pair in set_pairs:
        key, _, value = pair.partition("=")
        if key.strip().removeprefix("--") == "ckpt_path" and value.strip() != resume.ckpt_path:
            raise RlrunError(f"--set {pair} and --resume ({resume.source}: --ckpt_path {resume.ckpt_path}) name two "
                             "checkpoint directories: drop one")
    return (*set_pairs, "load_checkpoint=true", f"ckpt_path={resume.ckpt_path}")


def check(resume: Resume, jobs_factory, runtime_env: dict, *, remote: bool) -> str:
    """Look for the newest complete checkpoint before submitting: on this machine when it sees the directory
    (absolute path), else by a short job on the head when ``remote``; returns the line to show. Nothing
    complete is one line naming the directory and what was skipped there."""
    path = Path(resume.ckpt_path).expanduser()
    if path.is_absolute() and path.is_dir():
        skipped: list[str] = []
        found = checkpoint.newest(path, skipped.append)
        return _verdict(resume, found.tag if found else None, found.step if found else None, skipped, "here")
    if not remote:
        return (f"{resume.ckpt_path}: not looked at (not on this machine; --no-check): the trainer starts fresh if no "
                "complete checkpoint is there")
    job_id, status, logs = run_short_job(jobs_factory(), ["python", "-m", "trainer.checkpoint", "--json",
                                                          resume.ckpt_path], runtime_env, "checkpoint")
    answer = next((json.loads(line) for line in reversed(logs.splitlines())
                   if line.startswith('{"directory"')), None)
    if status != "SUCCEEDED" or answer is None:
        tail = " | ".join(logs.strip().splitlines()[-3:])
        raise RlrunError(f"the checkpoint look-up job {job_id} ended {status} without an answer ({tail}); "
                         "--no-check submits without looking")
    skipped = [f"checkpoint {c['tag']} skipped: {c['problem']}" for c in answer["checkpoints"] if c["problem"]]
    return _verdict(resume, answer["newest"], answer["newest_step"], skipped, "on the head")


def _verdict(resume: Resume, tag: str | None, step: int | None, skipped: list[str], where: str) -> str:
    if tag is None:
        why = f" ({'; '.join(skipped)})" if skipped else ""
        raise RlrunError(f"nothing to resume: no complete checkpoint in {resume.ckpt_path} ({where}; "
                         f"{resume.source}){why}")
    note = f"; {'; '.join(skipped)}" if skipped else ""
    return f"resuming from {tag} (step {step}) in {resume.ckpt_path} (looked at {where}){note}"


# --- Slurm: a requeued job resumes by itself --------------------------------------------------------------------


@dataclass
class Requeue:
    """What the sbatch script of a --requeue batch job adds to its `rlrun submit` arguments."""

    ckpt_args: list[str]  # on every run: a checkpoint directory every run of the job id finds (empty: the job's own)
    resume_args: list[str]  # on a requeued run: --load_checkpoint
    ckpt_path: str  # the directory, as the script's log line names it


def requeue_plan(preset_values: dict | None, command: list[str], workdir: Path, job_ckpt: str) -> Requeue | None:
    """How a requeued Slurm batch job resumes: the trainer job of a preset (``preset_values``: its config with
    the --set overrides) or of ``command``; None for another command (run again from the start).

    A relative --ckpt_path is relative to a directory the requeued job does not keep (the Ray head's temp
    dir or the uploaded working dir): the checkpoints then go to ``job_ckpt`` (a path under the job root, the
    same for every run of the job id). A job that saves no checkpoints (--save_steps -1) is refused."""
    if preset_values is not None:
        values = {k: v.replace("{workdir}", str(workdir)) if isinstance(v, str) else v for k, v in preset_values.items()}
        defaults = TrainerConfig.__dataclass_fields__
        ckpt_path = str(values.get("ckpt_path", defaults["ckpt_path"].default))
        save_steps = int(values.get("save_steps", defaults["save_steps"].default))
        own = ["--set", f"ckpt_path={job_ckpt}"]
        resume_args = ["--set", "load_checkpoint=true"]
        how = "--set save_steps=N"
    else:
        argv = trainer_command.trainer_argv(command)
        if argv is None:
            return None
        cfg = trainer_command.config_from_argv(argv)
        ckpt_path, save_steps = cfg.ckpt_path, cfg.save_steps
        own = ["--ckpt_path", job_ckpt]
        resume_args = ["--load_checkpoint"]  # given twice (the command has it already) is the same switch
        how = "--save_steps N in the command"
    if save_steps <= 0:
        raise RlrunError(f"--requeue: the job saves no checkpoints (--save_steps {save_steps}), so a requeued job would "
                         f"start over: give {how}")
    if Path(ckpt_path).expanduser().is_absolute():
        return Requeue([], resume_args, ckpt_path)
    return Requeue(own, resume_args, job_ckpt)
