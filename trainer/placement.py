"""Where the trainer's processes go, and what each of them asks of Ray: one :class:`Plan` for ``trainer.loop``
(which builds it), ``trainer.rollout.engines`` (which starts the engines from it) and rlrun's pre-submit check (which
places it on the live cluster). None of them computes placement or a resource ask on its own.

The plan is a list of **placement groups** the job reserves (:meth:`Plan.placement_groups`, in the order the
trainer reserves them) and a list of **asks** (:meth:`Plan.asks`): every Ray process the job starts, with the
bundle it lands on and the CPUs and GPUs it asks of that bundle. vLLM's own tensor-parallel workers are asks
too: with TP > 1 on GPUs vLLM's Ray executor starts one worker per bundle named by ``VLLM_RAY_BUNDLE_INDICES``,
each asking ``VLLM_RAY_PER_WORKER_GPUS`` of it; both variables come from :attr:`EnginePlan.env`. Every ask
fits the bundle it lands on (``tests/unit/test_placement.py`` proves it for every preset and a grid of
shapes); an ask larger than what is left of its bundle is what made TP > 1 engines wait for ever.

- Each model group (policy, reference, critic) is a PACK placement group of ``num_nodes x gpus_per_node``
  bundles of ``{GPU: 1, CPU: 1}`` (``{CPU: CPU_ONLY_CPUS}`` on a cluster without GPUs, where a "GPU" rank is a
  CPU rank: Ray's CPUs only gate scheduling there).
- ``--colocate_all_models``: the reference and critic ranks join the policy's placement group, every model
  and every engine process takes a ``COLOCATED_GPU_SHARE`` of each GPU, and engine ``i`` sits on the policy's
  bundles ``i*TP .. i*TP+TP-1`` (the config's rule: engines x TP = actor GPUs; the trainer regroups them by
  node once Ray has placed them, :func:`engine_bundle_groups`). With TP > 1 the engine actor itself takes
  nothing (its TP workers hold the GPU shares). Its weights arrive in place through shared buckets (CUDA IPC;
  ``/dev/shm`` without GPUs), since NCCL cannot pair two processes on one GPU.
- ``--colocate_actor_ref``: only the reference joins the policy's placement group, each taking half a GPU.
- Otherwise each engine reserves a placement group of its own: TP bundles of ``{GPU: 1, CPU: 1}``, STRICT_PACK
  (on one node) where a node has TP GPUs, PACK over several nodes where none has (``node_gpus``: an engine
  wider than a node, seed 003's shape). With TP 1 the engine actor takes the bundle's GPU; with TP > 1 it
  takes the bundle's CPU and its TP workers one GPU each. Weights come by a bucketed broadcast over a group
  of their own (NCCL on GPUs, gloo without). The HF engine is one engine of TP 1 and takes safetensors bytes
  through Ray.
- Colocated engines with TP > 1 are regrouped once Ray has placed the policy (:func:`engine_bundle_groups`):
  a TP group lies on one node, or takes whole nodes (TP 4 on two nodes of 2 GPUs: one engine across both,
  its all-reduces over the network). A placement where neither holds (3 + 3 + 2 bundles with TP 4) is
  refused, naming the TP sizes that would fit; rlrun's pre-submit check runs the same function on the
  placement it expects (:func:`rlrun.jobcheck.check_placement`).
- Without GPUs vLLM has no Ray executor: a TP > 1 engine runs its workers as its own processes (``mp``) and
  asks the CPUs of one bundle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

CPU_ONLY_CPUS = 0.25  # policy + reference + critic + engine fit into a 1-CPU slot each way on 2 CPUs
COLOCATED_GPU_SHARE = 0.25  # policy, reference, critic and engine on one GPU
ACTOR_REF_GPU_SHARE = 0.5  # --colocate_actor_ref: policy and reference on one GPU, the engines elsewhere

Transport = Literal["shared", "broadcast", "safetensors"]
Strategy = Literal["PACK", "STRICT_PACK"]


@dataclass(frozen=True)
class PlacementGroupPlan:
    """One placement group the job reserves: ``bundles`` (``{"CPU": c, "GPU": g}`` each) under ``strategy``."""

    name: str  # Ray's name for it is f"rlrun-{name}"
    bundles: tuple[Mapping[str, float], ...]
    strategy: Strategy = "PACK"

    def describe(self) -> str:
        b = self.bundles[0] if self.bundles else {}
        same = all(dict(x) == dict(b) for x in self.bundles)
        shape = _resources_text(b) if same else "; ".join(_resources_text(x) for x in self.bundles)
        where = " on one node" if self.strategy == "STRICT_PACK" and len(self.bundles) > 1 else ""
        return f"{self.name}: {len(self.bundles)} bundle{'s' if len(self.bundles) != 1 else ''} of {{{shape}}}{where}"


@dataclass(frozen=True)
class Ask:
    """One Ray process of the job and what it asks of the bundle it lands on."""

    who: str  # "policy rank 0", "vLLM engine 1", "vLLM engine 1 TP worker 0"
    group: str  # the PlacementGroupPlan's name
    bundle: int
    cpu: float
    gpu: float

    def describe(self) -> str:
        return f"{self.who}: {_resources_text({'CPU': self.cpu, 'GPU': self.gpu}) or 'nothing'} of {self.group} bundle {self.bundle}"


@dataclass(frozen=True)
class GroupPlan:
    """One ranked model group (see :class:`trainer.learn.group.ActorGroup`)."""

    name: str  # "policy", "reference" or "critic"
    num_nodes: int
    gpus_per_node: int
    use_gpus: bool
    gpus_per_actor: float
    cpus_per_actor: float
    in_policy_group: bool  # joins the policy's placement group instead of reserving its own

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def placement_group(self) -> str:
        return "policy" if self.in_policy_group else self.name


@dataclass(frozen=True)
class EnginePlan:
    """The rollout engines: ``count`` actors of ``tp`` workers each, and what every one of them asks."""

    backend: str  # "vllm" or "hf"
    count: int
    tp: int
    colocated: bool  # on the policy's bundles i*tp .. i*tp+tp-1
    use_gpus: bool
    actor_gpus: float  # what the engine actor asks of its first bundle
    actor_cpus: float
    worker_gpus: float  # what each TP worker asks of its bundle (vLLM's Ray executor); 0 without one
    executor: str | None  # vLLM's distributed_executor_backend: "ray" (TP > 1 on GPUs), "mp" (TP > 1 on CPUs)
    bundle_cpus: float = 0.0  # CPUs of an engine's own bundle (split placement)
    spans_nodes: bool = False  # an engine of its own wider than any node: its group is PACK, not STRICT_PACK

    def bundles(self, i: int) -> list[int]:
        """The bundles engine ``i`` lives on: the policy's (colocated) or its own group's (one per TP worker
        with the Ray executor, else one)."""
        if self.colocated:
            return list(range(i * self.tp, (i + 1) * self.tp))
        return list(range(self.tp)) if self.executor == "ray" else [0]

    def placement_group(self, i: int) -> str:
        """The placement group engine ``i`` lives in."""
        return "policy" if self.colocated else f"engine-{i}"

    def env(self, bundles: Sequence[int]) -> dict[str, str]:
        """vLLM's variables for an engine on ``bundles`` (its TP workers' bundles and their GPU ask)."""
        if self.executor != "ray":
            return {}
        return {"VLLM_RAY_BUNDLE_INDICES": ",".join(map(str, bundles)),
                "VLLM_RAY_PER_WORKER_GPUS": f"{self.worker_gpus:g}"}

    @property
    def name(self) -> str:
        return f"vLLM engine (TP {self.tp})" if self.backend == "vllm" else "HF rollout engine"


@dataclass(frozen=True)
class Request:
    """A placement group as rlrun's check places it: ``count`` bundles of ``cpu`` + ``gpu``."""

    what: str
    count: int
    cpu: float
    gpu: float
    bundles: bool = True  # kept for callers that told groups from single actors; every request is a group now
    strict: bool = False  # all bundles on one node (STRICT_PACK)
    group: str = ""  # the PlacementGroupPlan's name ("policy", "engine-0", ...)


@dataclass(frozen=True)
class Plan:
    use_gpus: bool
    groups: tuple[GroupPlan, ...]  # policy first
    engines: EnginePlan
    weight_transport: Transport
    notes: tuple[str, ...] = field(default=())

    def group(self, name: str) -> GroupPlan | None:
        return next((g for g in self.groups if g.name == name), None)

    def bundle(self) -> dict[str, float]:
        """A model rank's bundle."""
        return {"CPU": process_cpus(self.use_gpus), "GPU": 1.0} if self.use_gpus else {"CPU": CPU_ONLY_CPUS}

    def placement_groups(self) -> list[PlacementGroupPlan]:
        """Every placement group the job reserves, in the order the trainer reserves them: the model groups
        (policy first), then one per engine on devices of its own."""
        out = [PlacementGroupPlan(g.name, tuple(self.bundle() for _ in range(g.world_size)), "PACK")
               for g in self.groups if not g.in_policy_group]
        e = self.engines
        if not e.colocated:
            # GPUs: one GPU per TP worker (the Ray executor's bundles; TP 1: the engine's own), the engine
            # actor's CPU in the first; without GPUs the mp executor runs the engine and its workers in one actor
            for i in range(e.count):
                bundles = [{"CPU": e.bundle_cpus, "GPU": 1.0} if k == 0 else {"GPU": 1.0} for k in e.bundles(i)]
                if not e.use_gpus:
                    bundles = [{"CPU": e.bundle_cpus}]
                out.append(PlacementGroupPlan(e.placement_group(i), tuple(bundles),
                                              "PACK" if e.spans_nodes else "STRICT_PACK"))
        return out

    def asks(self) -> list[Ask]:
        """Every process the job starts (vLLM's TP workers included) and what it asks of its bundle."""
        out: list[Ask] = []
        for g in self.groups:
            cpus = 0.0 if g.in_policy_group else g.cpus_per_actor
            gpus = g.gpus_per_actor if g.use_gpus else 0.0
            out += [Ask(f"{g.name} rank {r}", g.placement_group, r, cpus, gpus) for r in range(g.world_size)]
        e = self.engines
        for i in range(e.count):
            bundles = e.bundles(i)
            label = f"{'vLLM' if e.backend == 'vllm' else 'HF'} engine {i}"
            out.append(Ask(label, e.placement_group(i), bundles[0], e.actor_cpus, e.actor_gpus))
            if e.executor == "ray":
                out += [Ask(f"{label} TP worker {k}", e.placement_group(i), b, 0.0, e.worker_gpus)
                        for k, b in enumerate(bundles)]
        return out

    def requests(self) -> list[Request]:
        """The placement groups as rlrun's check places them (in the order the trainer reserves them)."""
        reqs = []
        for pg in self.placement_groups():
            n = len(pg.bundles)  # a request's bundles are alike: an engine's (STRICT_PACK) counts its sum
            b = {k: sum(x.get(k, 0.0) for x in pg.bundles) / n for k in ("CPU", "GPU")}
            if pg.name.startswith("engine-"):
                what = f"{self.engines.name} {int(pg.name.removeprefix('engine-')) + 1} of {self.engines.count}"
            else:
                g = self.group(pg.name)
                what = f"{'actor' if pg.name == 'policy' else pg.name} {g.num_nodes} x {g.gpus_per_node}" if g else pg.name
            reqs.append(Request(what, len(pg.bundles), b.get("CPU", 0.0), b.get("GPU", 0.0), True,
                                pg.strategy == "STRICT_PACK" and len(pg.bundles) > 1, pg.name))
        return [r for r in reqs if r.count and (r.cpu or r.gpu)]

    def overcommitted(self) -> list[str]:
        """Bundles whose asks add up to more than the bundle holds (empty for every plan :func:`plan` makes:
        the unit tests hold it to that); each line names the bundle, its asks and what it holds."""
        sizes = {pg.name: pg.bundles for pg in self.placement_groups()}
        by_bundle: dict[tuple[str, int], list[Ask]] = {}
        problems = []
        for ask in self.asks():
            if ask.group not in sizes or ask.bundle >= len(sizes[ask.group]):
                problems.append(f"{ask.who} lands on {ask.group} bundle {ask.bundle}, which the plan does not reserve")
                continue
            by_bundle.setdefault((ask.group, ask.bundle), []).append(ask)
        for (group, idx), asks in by_bundle.items():
            have = sizes[group][idx]
            for key, value in (("CPU", sum(a.cpu for a in asks)), ("GPU", sum(a.gpu for a in asks))):
                if value > have.get(key, 0.0) + 1e-9:
                    problems.append(f"{group} bundle {idx} holds {have.get(key, 0.0):g} {key}, its asks take "
                                    f"{value:g}: " + "; ".join(a.describe() for a in asks))
        return problems


def process_cpus(use_gpus: bool) -> float:
    """Logical CPUs of one rank or engine."""
    return 1.0 if use_gpus else CPU_ONLY_CPUS


def plan(cfg: Any, use_gpus: bool, node_gpus: float | None = None) -> Plan:
    """The placement of a validated TrainerConfig on a cluster with (``use_gpus``) or without GPUs;
    ``node_gpus``: the GPUs of the cluster's largest node, where known (an engine of its own wider than that
    spreads over nodes; unknown: every engine is held to one node)."""
    colocated = bool(cfg.colocate_all_models)
    with_ref = bool(getattr(cfg, "colocate_actor_ref", False)) and not colocated  # policy + reference only
    share = COLOCATED_GPU_SHARE if colocated else ACTOR_REF_GPU_SHARE if with_ref else 1.0
    cpus = process_cpus(use_gpus)
    groups = [GroupPlan("policy", cfg.actor_num_nodes, cfg.actor_num_gpus_per_node, use_gpus, share, cpus, False)]
    for role, name, present in (("ref", "reference", cfg.needs_ref), ("critic", "critic", cfg.needs_critic)):
        if present:
            shared = colocated or (with_ref and name == "reference")
            groups.append(GroupPlan(name, getattr(cfg, f"{role}_num_nodes"), getattr(cfg, f"{role}_num_gpus_per_node"),
                                    use_gpus, share if shared else 1.0, cpus, shared))
    if cfg.rollout_backend == "vllm":
        count, tp = int(cfg.vllm_num_engines or 0), int(cfg.vllm_tensor_parallel_size)
        transport: Transport = "shared" if colocated else "broadcast"
    else:
        count, tp, transport = 1, 1, "safetensors"
    executor = None
    if tp > 1:
        executor = "ray" if use_gpus else "mp"  # vLLM has no Ray executor without GPUs
    gpu_share = share if use_gpus else 0.0
    if colocated:
        if executor == "ray":  # the TP workers take the GPU shares on their bundles; the engine actor nothing
            engine = EnginePlan(cfg.rollout_backend, count, tp, True, use_gpus, 0.0, 0.0, gpu_share, executor)
        else:
            engine = EnginePlan(cfg.rollout_backend, count, tp, True, use_gpus, gpu_share, 0.0, 0.0, executor)
    elif executor == "ray":
        wide = node_gpus is not None and tp > node_gpus
        engine = EnginePlan(cfg.rollout_backend, count, tp, False, use_gpus, 0.0, cpus, 1.0, executor, cpus, wide)
    else:  # TP 1 (the engine takes its bundle's GPU), or TP > 1 without GPUs (mp: one actor, one bundle)
        engine = EnginePlan(cfg.rollout_backend, count, tp, False, use_gpus, 1.0 if use_gpus else 0.0, cpus,
                            0.0, executor, cpus)
    return Plan(use_gpus, tuple(groups), engine, transport)


def engine_bundle_groups(bundle_nodes: Sequence[str], count: int, tp: int) -> list[list[int]]:
    """Colocated engines on a placed policy group: ``count`` groups of ``tp`` bundle indices (``bundle_nodes[i]``:
    the node of bundle ``i``, as Ray placed it). Each group lies on one node where the node's bundles divide
    into groups of ``tp``; otherwise it takes whole nodes, the nodes in the order of their first bundle (TP 4
    over two nodes of 2 bundles: one engine on both). Raises ValueError, one line naming the nodes' bundle
    counts and the TP sizes that would fit, where neither holds."""
    by_node: dict[str, list[int]] = {}
    for i, node in enumerate(bundle_nodes):
        by_node.setdefault(node, []).append(i)
    groups = _tp_groups(list(by_node.values()), tp)
    if groups is None:
        counts = ", ".join(f"{len(b)} on node {node}" for node, b in by_node.items())
        raise ValueError(f"engines of TP {tp} on the policy's bundles: Ray placed them {counts}; "
                         + tp_fit_text([len(b) for b in by_node.values()], tp))
    return sorted(groups)[:count]


def _tp_groups(nodes: Sequence[Sequence[int]], tp: int) -> list[list[int]] | None:
    """``nodes``' bundles (one list per node, in placement order) cut into groups of ``tp``, each on one node
    or made of whole nodes; None where they cannot be."""
    if tp < 1:
        return None
    local = [b for b in nodes if len(b) % tp == 0]  # nodes that hold whole engines of their own
    groups = [list(b[k:k + tp]) for b in local for k in range(0, len(b), tp)]
    partial: list[int] = []
    for b in nodes:
        if len(b) % tp == 0:
            continue
        if len(b) > tp:  # part of it would hold an engine, the rest share one with another node
            return None
        partial += b
        if len(partial) == tp:
            groups.append(partial)
            partial = []
        elif len(partial) > tp:
            return None
    return None if partial else groups


def _numbered(node_bundles: Sequence[int]) -> list[list[int]]:
    """Nodes holding ``node_bundles`` bundles each, as lists of consecutive bundle indices."""
    out, first = [], 0
    for n in node_bundles:
        out.append(list(range(first, first + n)))
        first += n
    return out


def tp_sizes_that_fit(node_bundles: Sequence[int]) -> list[int]:
    """The TP sizes whose groups :func:`engine_bundle_groups` can form on nodes holding ``node_bundles``
    bundles each (the divisors of their sum that cut them into whole-node or one-node groups)."""
    total = sum(node_bundles)
    return [t for t in range(1, total + 1) if total % t == 0 and _tp_groups(_numbered(node_bundles), t) is not None]


def tp_fit_text(node_bundles: Sequence[int], tp: int) -> str:
    """Why TP ``tp`` does not fit nodes of ``node_bundles`` bundles, and what would: the one line both the
    trainer and rlrun's check end with."""
    fits = tp_sizes_that_fit(node_bundles)
    return (f"a TP group must lie on one node or take whole nodes, and {tp} does neither; TP sizes that fit "
            f"this placement: {', '.join(map(str, fits))} (or place the actor so that each node holds a "
            f"multiple of {tp} ranks)")


def engine_groups_problem(node_bundles: Sequence[int], tp: int) -> str | None:
    """None where engines of TP ``tp`` can be formed on nodes holding ``node_bundles`` policy bundles each;
    else the one-line reason (what rlrun's check refuses before submit, as the trainer would after it)."""
    if _tp_groups(_numbered(node_bundles), tp) is not None:
        return None
    return tp_fit_text(node_bundles, tp)


def _resources_text(res: Mapping[str, float]) -> str:
    return ", ".join(f"{k}: {v:g}" for k, v in (("GPU", res.get("GPU", 0)), ("CPU", res.get("CPU", 0))) if v)
