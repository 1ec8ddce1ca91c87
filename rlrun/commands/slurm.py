"""`rlrun slurm render|submit|status|logs|cancel`: the cluster of the inventory, inside a Slurm allocation."""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import click

from rlrun import presets, resume
from rlrun.commands.context import Amount
from rlrun.commands.output import emit_json, json_option
from rlrun.errors import RlrunError
from rlrun.slurm import control, ports
from rlrun.slurm.script import JobOptions, default_job_root
from rlrun.slurm.script import render as render_script
from rlrun.slurm.spec import evaluate, ph


def _job_options(f):
    """The options shared by render and submit, defined once."""
    options = [
        click.option("--preset", "-p", "preset_name", metavar="NAME",
                     help="Batch mode: the trainer preset the job runs (`rlrun presets`)."),
        click.option("--set", "set_pairs", multiple=True, metavar="KEY=VALUE",
                     help="Override a preset's trainer flag (repeatable), as `rlrun submit --set`."),
        click.option("--cluster-dir", type=click.Path(file_okay=False, path_type=Path),
                     help="Long-lived mode: run no job; write the running cluster as an inventory to this "
                          "shared directory (`rlrun -i DIR submit ...`) until scancel or the time limit."),
        click.option("--nodes", "-N", type=int, default=1, show_default=True, help="Nodes (head on the first)."),
        click.option("--gpus-per-node", type=int, help="GPUs per node (#SBATCH --gpus-per-node)."),
        click.option("--cpus-per-node", type=int, help="CPUs per node (#SBATCH --cpus-per-task, one task per node)."),
        click.option("--mem", help="Memory per node, e.g. 200G (#SBATCH --mem)."),
        click.option("--partition", help="Slurm partition."),
        click.option("--account", help="Slurm account."),
        click.option("--time", help="Time limit, e.g. 4:00:00 or 2-00:00:00."),
        click.option("--job-name", help="Slurm job name (default: rlrun-<cluster name>)."),
        click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="--OPT=VALUE",
                     help="Any other #SBATCH line, e.g. --sbatch-arg=--qos=high (repeatable)."),
        click.option("--job-root", type=click.Path(file_okay=False, path_type=Path),
                     help="Shared directory for the job's output, record, tokens (default: "
                          "~/.rlrun/slurm/<cluster name>)."),
        click.option("--node-tmp", default="/tmp", show_default=True,
                     help="Node-local parent of each step's private temp dir (short: Ray's socket paths)."),
        click.option("--address-from", default="nodeaddr", show_default=True,
                     help="Each node's address: nodeaddr (Slurm's NodeAddr) or iface:NAME (e.g. iface:ib0)."),
        click.option("--reward-node", default="0", show_default=True,
                     help="Index of the node that runs the reward service, or 'none'."),
        click.option("--port-window", default=None, help="Ports the job's block is taken from, LOW-HIGH "
                     "(default 16384-29999, below the ephemeral range)."),
        click.option("--port-block", type=int, default=None, help="Ports per job (default 256)."),
        click.option("--deny-ports", default=None, help="Ports no block may touch, e.g. 29400-29510,27017 "
                     "(default: torchrun, MASTER_PORT, MongoDB, GlusterFS, NFS)."),
        click.option("--wait-timeout", type=int, default=300, show_default=True,
                     help="Seconds to wait for every node and the reward service."),
        click.option("--working-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="The batch step's directory, uploaded as the job's working_dir (default: here)."),
        click.option("--requeue", is_flag=True,
                     help="Let Slurm requeue the job (preemption, node failure; #SBATCH --requeue, as "
                          "--sbatch-arg=--requeue): a trainer job keeps its checkpoints where every run of the job "
                          "finds them and a requeued run resumes from the newest complete one."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _refuse_retriever(preset, sets) -> None:
    """A job that needs the retrieval service of its nodes ({retriever_url}) cannot run on Slurm yet: the sbatch
    script starts Ray and the reward service only, so it is refused here, not on the allocation."""
    values = {**preset.values, **sets}
    uses = sorted(k for k, v in values.items()
                  if any(isinstance(t, str) and "{retriever_url}" in t for t in (v if isinstance(v, list | tuple) else [v])))
    if uses:
        raise RlrunError(f"preset {preset.name}: {', '.join(uses)} uses {{retriever_url}}, the retrieval service of "
                         "each node (group retrievers), but rlrun slurm does not start retrieval services yet: run "
                         "one yourself and pass its URL with --set " + uses[0] + "=URL, or run the job on a cluster "
                         "brought up with site.yml")


def _render(obj, preset_name, set_pairs, cluster_dir, nodes, gpus_per_node, cpus_per_node, mem, partition, account,
            time, job_name, sbatch_args, job_root, node_tmp, address_from, reward_node, port_window, port_block,
            deny_ports, wait_timeout, working_dir, requeue, command):
    if preset_name and command:
        raise RlrunError(f"give either --preset or a command after `--`, not both (got --preset {preset_name} and "
                         f"{' '.join(command)!r})")
    if set_pairs and not preset_name:
        raise RlrunError("--set needs --preset NAME")
    submit_args: list[str] = []
    preset_values = None
    if preset_name:
        preset = presets.load_preset(preset_name, presets.preset_dirs())  # unknown: fails here, not on the allocation
        sets = presets.parse_sets(set_pairs)
        _refuse_retriever(preset, sets)
        submit_args = ["--preset", preset_name, *[a for s in set_pairs for a in ("--set", s)]]
        preset_values = {**preset.values, **sets}
    elif command:
        submit_args = ["--", *command]
    if reward_node.lower() == "none":
        reward_index = None
    elif reward_node.isdigit():
        reward_index = int(reward_node)
    else:
        raise RlrunError(f"--reward-node {reward_node!r}: expected a node index (0 = the head's node) or 'none'")
    spec = evaluate(obj.inventory, obj.vault_password_file)
    opts = JobOptions(
        nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_node=cpus_per_node, mem=mem, partition=partition,
        account=account, time=time, job_name=job_name, sbatch_args=list(sbatch_args), job_root=job_root,
        node_tmp=node_tmp, address_from=address_from, reward_node=reward_index,
        port_window=port_window or f"{ports.DEFAULT_WINDOW[0]}-{ports.DEFAULT_WINDOW[1]}",
        port_block=port_block or ports.DEFAULT_BLOCK,
        deny_ports=ports.DEFAULT_DENY_TEXT if deny_ports is None else deny_ports,
        wait_timeout=wait_timeout, cluster_dir=cluster_dir, workdir=(working_dir or Path.cwd()).resolve(),
        submit_args=submit_args, requeue=requeue)
    if opts.requeues and submit_args:
        plan = resume.requeue_plan(preset_values, command, opts.workdir, ph("JOB_CKPT"))
        if plan is None:
            click.echo("note: --requeue with a command that is not the trainer: a requeued job runs it again from "
                       "the start", err=True)
        else:
            opts.ckpt_args, opts.resume_args, opts.ckpt_shown = plan.ckpt_args, plan.resume_args, plan.ckpt_path
    text = render_script(spec, opts, version=version("rlrun"))
    root = (job_root or default_job_root(spec.cluster_name)).expanduser().resolve()
    return spec, opts, root, text


def _root(obj, job_root: Path | None) -> Path:
    if job_root:
        return job_root.expanduser().resolve()
    return default_job_root(evaluate(obj.inventory, obj.vault_password_file).cluster_name).resolve()


@click.group()
def slurm():
    """Run the inventory's cluster, and a job, inside a Slurm allocation (no SSH, no root on the nodes)."""


@slurm.command(context_settings={"ignore_unknown_options": True})
@_job_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here (default: stdout).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def render(obj, output, command, **kw):
    """Write the sbatch script: rlrun slurm render --preset NAME --nodes 3 [-o job.sbatch]  (or -- COMMAND)."""
    _, _, _, text = _render(obj, command=list(command), **kw)
    if output:
        output.write_text(text, encoding="utf-8")
        output.chmod(0o700)
        click.echo(f"wrote {output}: sbatch {output}  (or rlrun slurm submit ...)", err=True)
    else:
        sys.stdout.write(text)


@slurm.command(context_settings={"ignore_unknown_options": True})
@_job_options
@click.option("--follow/--no-follow", "-f", default=True, show_default=True,
              help="Stream the job's output until it ends; exit non-zero unless Slurm shows it COMPLETED.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def submit(obj, follow, command, **kw):
    """Render the script, sbatch it, and follow the job (batch: its Ray job's result is the exit status)."""
    spec, opts, root, text = _render(obj, command=list(command), **kw)
    script = control.write_script(root, text, opts.job_name or f"rlrun-{spec.cluster_name}")
    job_id = control.sbatch(script)
    inv = f" -i {obj.inventory_arg}" if obj.inventory_arg else ""
    jr = f" --job-root {root}" if kw.get("job_root") else ""
    click.echo(f"submitted Slurm job {job_id} ({opts.mode}, {opts.nodes} nodes; script {script}, "
               f"output {root / (job_id + '.out')})", err=True)
    if opts.mode == "cluster":
        click.echo(f"when it is up: rlrun -i {opts.cluster_dir} status; rlrun -i {opts.cluster_dir} submit ...",
                   err=True)
    if not follow or opts.mode == "cluster":
        click.echo(f"next:\n  rlrun{inv} slurm status {job_id}{jr}\n  rlrun{inv} slurm logs -f {job_id}{jr}\n"
                   f"  rlrun{inv} slurm cancel {job_id}", err=True)
        click.echo(job_id)
        return
    try:
        state, exit_code = control.follow(root, job_id, lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    except KeyboardInterrupt:
        click.echo(f"\nstopped following; the job keeps running: rlrun{inv} slurm cancel {job_id}", err=True)
        raise SystemExit(130) from None
    rec = control.record(root, job_id)
    click.echo(f"Slurm job {job_id}: {state} (exit {exit_code or rec.get('exit', '?')})"
               + (f"; Ray job {rec['ray_job']} exit {rec.get('ray_exit')}" if "ray_job" in rec else ""), err=True)
    if state != "COMPLETED":
        raise RlrunError(f"Slurm job {job_id} ended {state}; its output: {root / (job_id + '.out')}")


@slurm.command()
@click.argument("job_id", required=False)
@click.option("--job-root", type=click.Path(file_okay=False, path_type=Path), help="As given to submit.")
@json_option
@click.pass_obj
def status(obj, job_id, job_root, as_json):
    """One job's state and record (head, dashboard, ports, inventory), or every job of the job root."""
    root = _root(obj, job_root)
    ids = [control.check_job_id(job_id)] if job_id else control.known_jobs(root)
    rows = [control.status(root, i) for i in ids]
    if as_json:
        emit_json(rows if not job_id else rows[0])
        return
    if not rows:
        click.echo(f"no jobs under {root}")
    for row in rows:
        extra = ", ".join(f"{k}={row[k]}" for k in ("state", "exit", "head", "dashboard", "inventory", "ray_job",
                                                       "ray_exit") if row.get(k) not in (None, ""))
        click.echo(f"{row['job_id']}: Slurm {row['slurm_state']}" + (f" ({row['slurm_exit']})" if row["slurm_exit"]
                                                                     else "") + (f"; {extra}" if extra else ""))


@slurm.command()
@click.argument("job_id")
@click.option("--job-root", type=click.Path(file_okay=False, path_type=Path), help="As given to submit.")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the job ends.")
@click.pass_obj
def logs(obj, job_id, job_root, follow):
    """The job's output (batch step and every node's step)."""
    root = _root(obj, job_root)
    job_id = control.check_job_id(job_id)
    if follow:
        state, _ = control.follow(root, job_id, lambda s: (sys.stdout.write(s), sys.stdout.flush()))
        click.echo(f"Slurm job {job_id}: {state}", err=True)
        return
    out = root / f"{job_id}.out"
    if not out.exists():
        raise RlrunError(f"no output {out} (yet): is {job_id} a job of this job root? (rlrun slurm status)")
    sys.stdout.write(out.read_text(encoding="utf-8", errors="replace"))


@slurm.command()
@click.argument("job_id")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until Slurm shows the job ended.")
@click.option("--timeout", type=Amount("a time in seconds"), default=120, show_default=True,
              help="Seconds --wait waits.")
@click.pass_obj
def cancel(obj, job_id, wait, timeout):
    """scancel the job: every step ends its own processes by PID and removes its temp dirs (never Ray's
    host-wide stop command, which would end other jobs' Ray on shared nodes)."""
    job_id = control.check_job_id(job_id)
    control.cancel(job_id)
    if wait:
        click.echo(f"Slurm job {job_id}: {control.wait_ended(job_id, timeout)}")
    else:
        click.echo(f"Slurm job {job_id}: cancel requested")
