"""Render the sbatch script of a Slurm job (rlrun/slurm/job.sbatch.j2) from the node-start spec."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rlrun.errors import RlrunError
from rlrun.slurm import ports as P
from rlrun.slurm.spec import NodeSpec, heredoc, shell_word

TEMPLATE = Path(__file__).resolve().parent / "job.sbatch.j2"
NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
TIME_RE = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^(\d+-)?\d+$|^UNLIMITED$|^INFINITE$", re.IGNORECASE)
MEM_RE = re.compile(r"^\d+[KMGT]?$")
IFACE_RE = re.compile(r"^iface:[A-Za-z0-9_.@-]{1,15}$")


@dataclass
class JobOptions:
    """Everything `rlrun slurm render` takes besides the inventory; each field is one CLI option."""

    nodes: int = 1
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None
    mem: str | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    job_name: str | None = None
    sbatch_args: list[str] = field(default_factory=list)
    job_root: Path | None = None
    node_tmp: str = "/tmp"
    address_from: str = "nodeaddr"
    reward_node: int | None = 0
    port_window: str = f"{P.DEFAULT_WINDOW[0]}-{P.DEFAULT_WINDOW[1]}"
    port_block: int = P.DEFAULT_BLOCK
    deny_ports: str = P.DEFAULT_DENY_TEXT
    wait_timeout: int = 300
    stop_timeout: int = 20
    cluster_dir: Path | None = None  # set: a long-lived cluster; unset: batch
    workdir: Path = field(default_factory=Path.cwd)
    submit_args: list[str] = field(default_factory=list)  # batch: what `rlrun submit` gets
    title: str = ""
    requeue: bool = False  # #SBATCH --requeue (also when sbatch_args has it)
    ckpt_args: list[str] = field(default_factory=list)  # requeue: added to submit_args on every run
    resume_args: list[str] = field(default_factory=list)  # requeue: added on a requeued run (SLURM_RESTART_COUNT > 0)
    ckpt_shown: str = ""  # requeue: the checkpoint dir, as the log line names it

    @property
    def requeues(self) -> bool:
        return self.requeue or "--requeue" in self.sbatch_args

    @property
    def mode(self) -> str:
        return "cluster" if self.cluster_dir else "batch"


def default_job_root(cluster_name: str) -> Path:
    return Path.home() / ".rlrun" / "slurm" / cluster_name


def check(opts: JobOptions) -> list[str]:
    """Every problem with the options, each naming the option, its value and what is expected."""
    problems = []
    if not 1 <= opts.nodes <= 4096:
        problems.append(f"--nodes {opts.nodes}: expected 1 or more")
    for name, value in (("--gpus-per-node", opts.gpus_per_node), ("--cpus-per-node", opts.cpus_per_node)):
        if value is not None and value < 0:
            problems.append(f"{name} {value}: expected 0 or more")
    if opts.mem is not None and not MEM_RE.match(opts.mem):
        problems.append(f"--mem {opts.mem!r}: expected a size such as 200G (Slurm's --mem)")
    if opts.time is not None and not TIME_RE.match(opts.time):
        problems.append(f"--time {opts.time!r}: expected a Slurm time limit such as 30, 4:00:00 or 2-00:00:00")
    for name, value in (("--partition", opts.partition), ("--account", opts.account), ("--job-name", opts.job_name)):
        if value is not None and not NAME_RE.match(value):
            problems.append(f"{name} {value!r}: expected letters, digits, '.', '_', '+' or '-'")
    for arg in opts.sbatch_args:
        if not arg.startswith("--") or "\n" in arg or "\r" in arg:
            problems.append(f"--sbatch-arg {arg!r}: expected one long sbatch option on one line, e.g. --qos=high")
    if opts.address_from != "nodeaddr" and not IFACE_RE.match(opts.address_from):
        problems.append(f"--address-from {opts.address_from!r}: expected nodeaddr or iface:NAME (e.g. iface:ib0)")
    if not opts.node_tmp.startswith("/") or not re.match(r"^[A-Za-z0-9._/-]+$", opts.node_tmp):
        problems.append(f"--node-tmp {opts.node_tmp!r}: expected an absolute path of letters, digits, '.', '_', '-'")
    elif len(opts.node_tmp) > 24:
        problems.append(f"--node-tmp {opts.node_tmp!r} is {len(opts.node_tmp)} characters: at most 24, so the "
                        "per-job temp dir below it stays within 60 (Ray's socket paths <= 107)")
    nodes = max(opts.nodes, 1)  # a bad --nodes is its own problem: node 0 stays a valid index
    if opts.reward_node is not None and not 0 <= opts.reward_node < nodes:
        problems.append(f"--reward-node {opts.reward_node}: expected a node index 0..{nodes - 1} or 'none'")
    try:
        P.block_bases(P.parse_window(opts.port_window), opts.port_block, P.parse_ranges(opts.deny_ports))
    except P.PortError as exc:
        problems.append(str(exc))
    if opts.wait_timeout < 10:
        problems.append(f"--wait-timeout {opts.wait_timeout}: expected at least 10 seconds")
    if opts.mode == "batch" and not opts.submit_args:
        problems.append("nothing to run: give --preset NAME or a command after `--` (or --cluster-dir DIR for a "
                        "long-lived cluster)")
    if opts.mode == "cluster" and opts.submit_args:
        problems.append("--cluster-dir starts a long-lived cluster and runs no job: drop --preset / the command, "
                        "and submit with `rlrun -i DIR submit ...` once it is up")
    return problems


def render(spec: NodeSpec, opts: JobOptions, version: str = "") -> str:
    """The sbatch script's text."""
    import jinja2  # as slow to import as requests, and only rendering needs it (not `rlrun --help`)

    problems = check(opts)
    if problems:
        raise RlrunError("cannot render the Slurm job:\n" + "\n".join(f"  - {p}" for p in problems))
    job_root = (opts.job_root or default_job_root(spec.cluster_name)).expanduser().resolve()
    cluster_dir = opts.cluster_dir.expanduser().resolve() if opts.cluster_dir else None
    for name, path in (("--job-root", job_root), ("--cluster-dir", cluster_dir), ("--working-dir", opts.workdir)):
        if path is not None and not re.match(r"^[A-Za-z0-9._/+@=-]+$", str(path)):
            raise RlrunError(f"{name} {path}: expected a path of letters, digits and ./_+@=- (it goes into #SBATCH "
                             "lines and env files)")
    lines = [f"--job-name={opts.job_name or 'rlrun-' + spec.cluster_name}", f"--nodes={opts.nodes}",
             "--ntasks-per-node=1"]
    if opts.cpus_per_node is not None:
        lines.append(f"--cpus-per-task={opts.cpus_per_node}")
    gpus = opts.gpus_per_node
    if gpus:
        lines.append(f"--gpus-per-node={gpus}")
    for key, value in (("partition", opts.partition), ("account", opts.account), ("time", opts.time),
                       ("mem", opts.mem)):
        if value is not None:
            lines.append(f"--{key}={value}")
    lines += [f"--output={job_root}/%j.out", f"--chdir={opts.workdir.resolve()}",
              # The batch shell gets SIGTERM 60 s before the time limit: time to stop the steps and clean up.
              "--signal=B:TERM@60", *opts.sbatch_args]
    if opts.requeues:  # a requeued job runs again from the top: keep the earlier run's output above it
        lines += [x for x in ("--requeue", "--open-mode=append") if x not in lines]

    def words(argv: list[str]) -> str:
        return " ".join(shell_word(a) for a in argv)

    # Comments as <#-- --#>: bash's ${#var} would open a Jinja comment.
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             comment_start_string="<#--", comment_end_string="--#>",
                             undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["q"] = lambda v: shlex.quote(str(v)) if v is not None else "''"
    template = env.from_string(TEMPLATE.read_text(encoding="utf-8"))
    return template.render(
        title=opts.title or f"rlrun slurm job of cluster {spec.cluster_name} ({opts.mode})",
        version=version, inventory=spec.inventory, mode=opts.mode, sbatch_lines=lines,
        cluster_name=spec.cluster_name, job_root=str(job_root), cluster_dir=str(cluster_dir or ""),
        node_tmp=opts.node_tmp, address_from=opts.address_from,
        reward_node_index="" if opts.reward_node is None else opts.reward_node,
        port_window=opts.port_window, port_block=opts.port_block, deny_ports=opts.deny_ports,
        wait_timeout=opts.wait_timeout, stop_timeout=opts.stop_timeout, nofile=int(spec.nofile_limit),
        accelerator=spec.accelerator, submit_args=words(opts.submit_args),
        venv=shell_word(spec.venv), head_argv=words(spec.head_argv), worker_argv=words(spec.worker_argv),
        env_files=words(spec.env_files), ray_env_file=shell_word(spec.ray_env_file),
        accel_env_file=shell_word(spec.accel_env_file), accel_env=_ensure_newline(heredoc(spec.accel_env), 'RLRUN_ACCEL_ENV'),
        ray_env=_ensure_newline(heredoc(spec.ray_env), 'RLRUN_RAY_ENV'), reward_argv=words(spec.reward_argv),
        requeue=opts.requeues, ckpt_args=words(opts.ckpt_args), resume_args=words(opts.resume_args),
        ckpt_shown=shell_word(opts.ckpt_shown or "-"), deepspeed_ops=words(spec.deepspeed_ops),
    )


def _ensure_newline(text: str, delimiter: str) -> str:
    """Heredoc body: ends with a newline and holds no line that would end the heredoc early."""
    if any(line.strip() == delimiter for line in text.splitlines()):
        raise RlrunError(f"an env file holds a line '{delimiter}', which would end the script's heredoc")
    return text if text.endswith("\n") or not text else text + "\n"
