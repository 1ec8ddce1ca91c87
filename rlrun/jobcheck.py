"""Can this trainer job run on this cluster? Checked before submit, each refusal with its arithmetic.

:func:`check` is a pure function of a validated :class:`~trainer.config.TrainerConfig` and a
:class:`ClusterView` (alive nodes with their CPUs and GPUs, reward-service health, which paths are
missing on which nodes), so tests describe a 2 x 8-GPU cluster without having one. :func:`gather`
builds the view of a live cluster: nodes from the state API (``/api/v0/nodes``, with the token),
the rest from a probe job (:mod:`rlrun.probe`) that looks at every node (paths, the retrieval service, the
DeepSpeed ops the job loads) and asks the reward services from the head, where the trainer's driver runs.

Batch arithmetic is not here: building the TrainerConfig already ran the trainer's own rules.

Placement is the trainer's own plan (:func:`trainer.placement.plan`, which ``trainer.loop`` builds from),
so this check and the job cannot disagree about what the job asks for.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from rlrun.dashboard import list_nodes, reward_health
from rlrun.jobs import excluded
from rlrun.probe import run_probe
from trainer.config import CUDA_ONLY_FLAGS, TrainerConfig
from trainer.placement import Request, engine_groups_problem, plan

_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class NodeView:
    ip: str
    cpus: float
    gpus: float
    is_head: bool = False


@dataclass(frozen=True)
class ClusterView:
    """What the checks need to know about a cluster."""

    nodes: tuple[NodeView, ...]  # alive nodes
    reward: Mapping[str, str] = field(default_factory=dict)  # URL -> "ok" or why not
    reward_from: str = "this machine"
    # path or hub id -> IPs of the nodes where it is missing; None: the nodes were not looked at
    missing: Mapping[str, tuple[str, ...]] | None = None
    # node IP -> "ok" or why not: the job's retrieval URL (--retriever_url, `{node_ip}` put in) asked on each node
    # by the probe job; empty when the job has none or the nodes were not probed
    retriever: Mapping[str, str] = field(default_factory=dict)
    # node IP -> op name -> the node's `trainer.deepspeed_ops --check` finding ({"state": installed / cached /
    # missing / unknown, "buildable", "why"}) for the ops the job loads (job_ops); None: the nodes were not looked at
    ops: Mapping[str, Mapping[str, Mapping]] | None = None

    @property
    def gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)

    @property
    def cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)

    def describe(self) -> str:
        per = ", ".join(f"{n.ip}{' (head)' if n.is_head else ''}: {n.gpus:g} GPUs {n.cpus:g} CPUs"
                        for n in self.nodes)
        return f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''} ({per})"


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)  # the arithmetic, always shown
    problems: list[str] = field(default_factory=list)  # each one refuses the job
    notes: list[str] = field(default_factory=list)  # worth knowing, not a refusal

    @property
    def ok(self) -> bool:
        return not self.problems


# --- placement ----------------------------------------------------------------------------------------
def uses_gpus(view: ClusterView, expects_gpus: bool) -> bool:
    """The trainer uses GPUs when the cluster has any; a GPU preset is judged as a GPU job regardless."""
    return expects_gpus or view.gpus >= 1


def _gpu_arithmetic(cfg: TrainerConfig) -> str:
    parts = [f"actor {cfg.actor_num_nodes} x {cfg.actor_num_gpus_per_node} = {cfg.actor_world_size}"]
    shared = []
    for role, name, present, world in (("ref", "reference", cfg.needs_ref, cfg.ref_world_size),
                                       ("critic", "critic", cfg.needs_critic, cfg.critic_world_size)):
        if present:
            nodes, per = getattr(cfg, f"{role}_num_nodes"), getattr(cfg, f"{role}_num_gpus_per_node")
            on_actor = cfg.colocate_all_models or (cfg.colocate_actor_ref and role == "ref")
            (shared if on_actor else parts).append(f"{name} {nodes} x {per} = {world}")
    if cfg.rollout_backend == "vllm":
        engines = (f"vLLM {cfg.vllm_num_engines} engines x TP {cfg.vllm_tensor_parallel_size} = "
                   f"{cfg.vllm_total_gpus}")
    else:
        engines = "HF rollout engine 1"
    (shared if cfg.colocate_all_models else parts).append(engines)
    text = " + ".join(parts)
    if shared:
        flag = "--colocate_all_models" if cfg.colocate_all_models else "--colocate_actor_ref"
        text += f" (with {', '.join(shared)} on the actor's GPUs: {flag})"
    return text


def _fits(free: list[float], req: Request) -> int:
    """How many of `req` fit into a node's free [cpu, gpu]."""
    counts = [math.floor(have / need + 1e-9) for have, need in zip(free, (req.cpu, req.gpu), strict=True) if need]
    return min(counts) if counts else req.count


def place(nodes: tuple[NodeView, ...], reqs: list[Request], placed: dict[str, dict[str, int]] | None = None) -> list[str]:
    """Place the placement groups node by node, as Ray does: PACK groups onto the emptiest nodes first (their
    bundles may spread), STRICT_PACK groups (an engine's TP workers) whole onto one node; the problems name
    what did not fit and what was free. ``placed`` (if given) gets each placed group's bundles per node, by
    the group's name, in the order they were taken."""
    free = {n.ip: [n.cpus, n.gpus] for n in nodes}
    problems = []

    def free_text() -> str:
        return ", ".join(f"{ip}: {g:g} GPUs {c:g} CPUs" for ip, (c, g) in free.items()) or "no alive node"

    def need_text(r: Request) -> str:
        return " + ".join(x for x in (f"{r.gpu:g} GPU" if r.gpu else "", f"{r.cpu:g} CPU") if x)

    for req in reqs:
        order = sorted(free, key=lambda ip: (-free[ip][1], -free[ip][0]))
        if req.strict:
            ip = next((ip for ip in order if _fits(free[ip], req) >= req.count), None)
            if ip is None:
                total = Request(req.what, 1, req.cpu * req.count, req.gpu * req.count)
                problems.append(f"{req.what}: {req.count} bundles ({need_text(total)} in all) must share one node; "
                                f"none has room, free then: {free_text()}")
                continue
            free[ip][0] -= req.count * req.cpu
            free[ip][1] -= req.count * req.gpu
            if placed is not None:
                placed[req.group] = {ip: req.count}
            continue
        taken, left = {}, req.count
        for ip in order:
            take = min(_fits(free[ip], req), left)
            if take:
                taken[ip], left = take, left - take
        if left:
            problems.append(f"{req.what}: {req.count} bundles of {{{need_text(req)}}} do not fit, only "
                            f"{req.count - left} do; free then: {free_text()}")
            continue
        for ip, n in taken.items():
            free[ip][0] -= n * req.cpu
            free[ip][1] -= n * req.gpu
        if placed is not None:
            placed[req.group] = taken
    return problems


def check_placement(cfg: TrainerConfig, view: ClusterView, expects_gpus: bool, report: Report) -> None:
    gpus = uses_gpus(view, expects_gpus)
    max_node_gpus = max((n.gpus for n in view.nodes), default=0)
    the_plan = plan(cfg, gpus, max_node_gpus if gpus else None)
    reqs = the_plan.requests()
    need_cpu = sum(r.count * r.cpu for r in reqs)
    need_gpu = sum(r.count * r.gpu for r in reqs)
    cpu_text = " + ".join(f"{r.what}: {r.count} x {r.cpu:g}" for r in reqs if r.count)
    report.lines.append(f"cluster: {view.describe()}")
    if not gpus:  # the ranks would stop at start-up (trainer.learn.model_worker): say so before any is placed
        defaults = {f.name: f.default for f in fields(TrainerConfig)}
        for flag in CUDA_ONLY_FLAGS:
            value, default = getattr(cfg, flag), defaults[flag]
            if value != default:  # a switch shows as its name, a choice with its value
                shown, reset = ("", str(default).lower()) if isinstance(value, bool) else (f" {value}", default)
                report.problems.append(f"--{flag}{shown} needs CUDA GPUs and the cluster has none "
                                       f"({view.describe()}): drop it (--set {flag}={reset}) or run on GPU nodes")
    totals_ok = True
    if gpus:
        report.lines.append(f"GPUs: {_gpu_arithmetic(cfg)}; needs {need_gpu:g}, the cluster has {view.gpus:g}")
        if need_gpu > view.gpus:
            totals_ok = False
            report.problems.append(f"not enough GPUs: {_gpu_arithmetic(cfg)} = {need_gpu:g} GPUs needed, "
                                   f"the cluster has {view.gpus:g} ({view.describe()})")
    report.lines.append(f"CPUs (Ray resources): {cpu_text} = {need_cpu:g}; the cluster has {view.cpus:g}")
    if need_cpu > view.cpus + 1e-9:
        totals_ok = False
        report.problems.append(f"not enough CPUs: {cpu_text} = {need_cpu:g} CPUs of Ray resources needed "
                               f"(a rank or engine takes {reqs[0].cpu:g}), the cluster has {view.cpus:g} "
                               f"({view.describe()})")
    # what each engine process asks of its bundle (vLLM's TP workers included): the job's own asks
    engine_asks = [a for a in the_plan.asks() if "engine" in a.who]
    if gpus and engine_asks:
        shown = engine_asks[:1] + [a for a in engine_asks if "TP worker" in a.who][:1]
        report.lines.append("engine asks: " + "; ".join(a.describe() for a in shown)
                            + (f" (x{the_plan.engines.count} engines)" if the_plan.engines.count > 1 else ""))
    report.problems += [f"placement plan: {p}" for p in the_plan.overcommitted()]
    if totals_ok:
        placed: dict[str, dict[str, int]] = {}
        problems = place(view.nodes, reqs, placed)
        report.problems += problems
        if gpus and not problems:
            _check_engine_span(the_plan, placed, max_node_gpus, report)
    if gpus:
        layout = [(role, getattr(cfg, f"{role}_num_nodes"), getattr(cfg, f"{role}_num_gpus_per_node"))
                  for role, present in (("actor", True), ("ref", cfg.needs_ref), ("critic", cfg.needs_critic))
                  if present]
        for role, nodes, per in layout:
            if nodes > len(view.nodes) or per > max_node_gpus:
                report.notes.append(f"--{role}_num_nodes {nodes} x --{role}_num_gpus_per_node {per}: the cluster "
                                    f"has {len(view.nodes)} nodes of at most {max_node_gpus:g} GPUs; the trainer "
                                    "packs ranks onto nodes (Ray PACK), so the layout will differ")


def _check_engine_span(the_plan, placed: dict[str, dict[str, int]], max_node_gpus: float, report: Report) -> None:
    """Engines wider than a node: colocated ones must form their TP groups on the actor's bundles as the
    trainer will (:func:`trainer.placement.engine_groups_problem`, on the placement just simulated); an engine
    that spans nodes is noted (its all-reduces cross the network)."""
    e = the_plan.engines
    if e.backend != "vllm" or e.tp <= 1:
        return
    if e.colocated:
        per_node = placed.get("policy", {})
        problem = engine_groups_problem(list(per_node.values()), e.tp)
        if problem:
            where = " + ".join(f"{n} on {ip}" for ip, n in per_node.items())
            report.problems.append(f"vLLM engines of TP {e.tp} on the actor's GPUs: the actor's ranks would land "
                                   f"{where}; {problem}")
            return
        wide = any(n % e.tp for n in per_node.values())
    else:
        wide = e.spans_nodes
    if wide:
        report.notes.append(f"each vLLM engine of TP {e.tp} spans nodes (the largest node has {max_node_gpus:g} "
                            "GPUs): its tensor-parallel all-reduces cross the network between them")


# --- reward service and paths -----------------------------------------------------------------------------
def classify(value: str, workdir: Path | None) -> str:
    """'absolute' (a path on the nodes), 'workdir' (relative, uploaded with the working dir) or 'hub'."""
    if value.startswith(("/", "~")):
        return "absolute"
    if value.startswith(("./", "../")) or (workdir is not None and (workdir / value).exists()):
        return "workdir"
    return "hub" if _HUB_ID_RE.match(value) else "workdir"


def model_and_data(cfg: TrainerConfig) -> list[tuple[str, str, bool]]:
    """(flag, value, needed on every node) for the inputs the job reads; data is read by the driver only."""
    out = [("pretrain", cfg.pretrain or "", True)]
    if cfg.needs_critic and cfg.critic_pretrain and cfg.critic_pretrain != cfg.pretrain:
        out.append(("critic_pretrain", cfg.critic_pretrain, True))
    out.append(("prompt_data", cfg.prompt_data or "", False))
    if cfg.sft_warmup_steps and cfg.sft_data:
        out.append(("sft_data", cfg.sft_data, False))
    return out


def job_ops(cfg: TrainerConfig) -> list[str]:
    """The DeepSpeed JIT ops the job's training ranks load: cpu_adam (DeepSpeedCPUAdam) with --adam_offload."""
    return ["cpu_adam"] if cfg.adam_offload else []


#: The job's own env vars (``rlrun submit --env``) that decide where a JIT op is built and with what: the probe
#: asks the nodes' check under them, as the job's workers would load the op.
OPS_ENV = ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "CXX")


def probe_request(cfg: TrainerConfig, workdir: Path | None, env: Mapping[str, str] | None = None) -> dict:
    """What the probe job must look at: absolute paths on every node / on the head, hub ids, reward URLs, the
    retrieval URL, the DeepSpeed ops (under the job's ``env``'s OPS_ENV values)."""
    every, head, hub = [], [], []
    for flag, value, on_every in model_and_data(cfg):
        kind = classify(value, workdir)
        if kind == "absolute":
            (every if on_every else head).append(value)
        elif kind == "hub" and flag not in ("prompt_data", "sft_data"):
            hub.append(value)
    request = {"paths": every, "head_paths": head, "hub_ids": hub, "reward_urls": list(cfg.remote_rm_url)}
    if getattr(cfg, "retriever_url", None):  # the trainer's --retriever_url (multi-turn search rollouts)
        request["retriever_url"] = cfg.retriever_url
    ops = job_ops(cfg)
    if ops:
        request["ops"] = ops
        ops_env = {k: v for k, v in (env or {}).items() if k in OPS_ENV}
        if ops_env:
            request["ops_env"] = ops_env
    return request


def check_ops(cfg: TrainerConfig, view: ClusterView, expects_gpus: bool, report: Report) -> None:
    """The DeepSpeed ops the job loads, on the nodes where its training ranks can land (those with GPUs for a GPU
    job, else every node): built there (installed or in torch's extension cache), or compiled by the job at its
    start (a note: a minute or more per node), or neither (a refusal: the job would fail at its optimizer)."""
    ops = job_ops(cfg)
    if not ops:
        return
    flag = "--adam_offload"
    if view.ops is None:
        report.notes.append(f"DeepSpeed op {', '.join(ops)} ({flag}): not looked at on the nodes")
        return
    gpu = uses_gpus(view, expects_gpus)
    trainers = [n.ip for n in view.nodes if n.gpus > 0 or not gpu]
    variable = "ray_node__deepspeed_ops: [" + ", ".join(ops) + "]"
    for op in ops:
        found = {ip: view.ops.get(ip, {}).get(op) or {"state": "unknown", "why": "the probe did not report it"}
                 for ip in trainers}
        built = [ip for ip, f in found.items() if f.get("state") in ("installed", "cached")]
        compiles = [ip for ip, f in found.items() if f.get("state") == "missing" and f.get("buildable")]
        cannot: dict[str, list[str]] = {}  # why -> the nodes (one problem per reason, not per node)
        unknown: dict[str, list[str]] = {}
        for ip, f in found.items():
            if f.get("state") == "missing" and not f.get("buildable"):
                cannot.setdefault(f.get("why") or "no reason given", []).append(ip)
            elif f.get("state") not in ("installed", "cached", "missing"):
                unknown.setdefault(f.get("why") or "no reason given", []).append(ip)
        if built and not (compiles or cannot or unknown):
            report.lines.append(f"DeepSpeed op {op} ({flag}): built on {_nodes(built)}")
        if compiles:
            report.notes.append(f"DeepSpeed op {op} ({flag}) is not built on {_nodes(compiles)}: the job compiles "
                                f"it there as it starts (a minute or more per node); {variable} in the inventory "
                                "builds it on each node when the node is provisioned")
        for why, ips in cannot.items():
            report.problems.append(f"DeepSpeed op {op} ({flag}) is not built on {_nodes(ips)} and cannot be built "
                                   f"there ({why}): the job would fail as it sets up its optimizer; install what is "
                                   f"missing and set {variable} in the inventory (it builds the op when the node "
                                   f"is provisioned), or leave out {flag}")
        for why, ips in unknown.items():
            report.notes.append(f"DeepSpeed op {op} ({flag}) on {_nodes(ips)}: not known ({why})")


def _nodes(ips: list[str]) -> str:
    return f"{ips[0]}" if len(ips) == 1 else f"{len(ips)} nodes ({', '.join(ips)})"


def check_inputs(cfg: TrainerConfig, view: ClusterView, workdir: Path | None, excludes: list[str],
                 report: Report) -> None:
    for url in cfg.remote_rm_url:
        status = view.reward.get(url)
        if status is None:
            report.notes.append(f"reward service {url}: not checked")
        elif status != "ok":
            report.problems.append(f"reward service {url}: {status} (asked from {view.reward_from}); the "
                                   "trainer checks it at start and would stop there (`rlrun status` shows "
                                   "the inventory's reward services)")
        else:
            report.lines.append(f"reward service {url}: ok (asked from {view.reward_from})")
    for ip, status in sorted(view.retriever.items()):
        url = str(getattr(cfg, "retriever_url", "")).replace("{node_ip}", ip)
        if status != "ok":
            report.problems.append(f"retrieval service {url} (node {ip}): {status}; the job's rollouts on that node "
                                   "would fail their searches (`rlrun status` shows the inventory's retrieval "
                                   "services)")
        else:
            report.lines.append(f"retrieval service {url}: ok (asked on its node)")
    for flag, value, on_every in model_and_data(cfg):
        kind = classify(value, workdir)
        where = "every node" if on_every else "the head (the driver reads it)"
        if kind == "absolute":
            if view.missing is None:
                report.notes.append(f"--{flag} {value}: not looked for on the nodes")
                continue
            missing = view.missing.get(value, ())
            if missing:
                report.problems.append(f"--{flag} {value} does not exist on {', '.join(missing)} (it must be on "
                                       f"{where}; copy it there or --set {flag}=PATH_ON_THE_NODES)")
            else:
                report.lines.append(f"--{flag} {value}: present on {where}")
        elif kind == "workdir":
            if workdir is None:
                report.notes.append(f"--{flag} {value}: relative to the head's directory (no working dir uploaded)")
            elif not (workdir / value).exists():
                report.problems.append(f"--{flag} {value}: not in the working dir {workdir}")
            elif excluded(str(Path(value)), excludes):
                report.problems.append(f"--{flag} {value}: in the working dir, but the upload leaves it out "
                                       "(excluded pattern); keep it on the nodes and give an absolute path")
            else:
                report.lines.append(f"--{flag} {value}: uploaded with the working dir")
        else:
            missing = (view.missing or {}).get(value, ())
            text = f"--{flag} {value}: a hub id, fetched by the job"
            if missing:
                text += f"; not in the Hugging Face cache of {', '.join(missing)} (needs the hub from the nodes)"
            report.notes.append(text)


def check(cfg: TrainerConfig, view: ClusterView, *, expects_gpus: bool = False, workdir: Path | None = None,
          excludes: list[str] | None = None) -> Report:
    """Everything that would stop ``cfg`` on the cluster ``view``; pure (no I/O but local paths)."""
    report = Report()
    if not view.nodes:
        report.problems.append("the cluster has no alive node")
        return report
    check_placement(cfg, view, expects_gpus, report)
    check_inputs(cfg, view, workdir, excludes or [], report)
    check_ops(cfg, view, expects_gpus, report)
    return report


# --- the live cluster ----------------------------------------------------------------------------------------
def gather(cluster, cfg: TrainerConfig, workdir: Path | None, *, probe: bool, jobs=None,
           timeout: float = 10.0, env: Mapping[str, str] | None = None) -> ClusterView:
    """The view of a live cluster: nodes from the state API; reward health and paths from a probe job
    (``probe=True``), else reward health from this machine and paths not looked at."""
    nodes = tuple(NodeView(n.node_ip, n.cpus, n.gpus, n.is_head)
                  for n in list_nodes(cluster.dashboard_url, cluster.token, timeout=timeout) if n.alive)
    request = probe_request(cfg, workdir, env)
    if not any(request.values()):  # nothing on the nodes to look at
        return ClusterView(nodes, {}, "this machine", {})
    if not probe:
        ca = str(cluster.reward_ca) if getattr(cluster, "reward_ca", None) else None
        return ClusterView(nodes, {u: reward_health(u, timeout=min(timeout, 5.0), ca=ca) for u in cfg.remote_rm_url},
                           "this machine", None)
    found = run_probe(jobs, request)
    missing = {k: tuple(v) for k, v in found["missing"].items()}
    return ClusterView(nodes, found["reward"], f"the head {found['head']}", missing, found.get("retriever") or {},
                       (found.get("ops") or {}) if request.get("ops") else None)
