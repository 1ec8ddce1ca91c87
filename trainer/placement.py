"""Where the trainer's processes go: one :class:`Plan` for ``trainer.loop`` (which builds it) and for rlrun's
pre-submit check (which validates it against the live cluster). Neither computes placement on its own.

- Each model group (policy, reference, critic) is a PACK placement group of ``num_nodes x gpus_per_node``
  bundles of ``{GPU: 1, CPU: 1}`` (``{CPU: CPU_ONLY_CPUS}`` on a cluster without GPUs, where a "GPU" rank
  is a CPU rank: Ray's CPUs only gate scheduling there).
- ``--colocate_all_models``: the reference and critic ranks join the policy's placement group, every model
  and engine takes a ``COLOCATED_GPU_SHARE`` of each GPU, and engine ``i`` sits on the policy's bundles
  ``i*TP .. i*TP+TP-1`` (the config's rule: engines x TP = actor GPUs). Its weights then arrive in place
  through shared buckets (CUDA IPC; ``/dev/shm`` without GPUs), since NCCL cannot pair two processes on
  one GPU.
- Otherwise each engine is one actor asking for ``TP`` GPUs on one node (the HF engine: 1) and 1 CPU
  (``CPU_ONLY_CPUS`` without GPUs), outside the groups; its weights come by a bucketed broadcast over a
  group of their own (NCCL on GPUs, gloo without). The HF engine takes safetensors bytes through Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

CPU_ONLY_CPUS = 0.25  # policy + reference + critic + engine fit into a 1-CPU slot each way on 2 CPUs
COLOCATED_GPU_SHARE = 0.25  # policy, reference, critic and engine on one GPU

Transport = Literal["shared", "broadcast", "safetensors"]


@dataclass(frozen=True)
class GroupPlan:
    """One ranked model group (see :class:`trainer.actors.group.ActorGroup`)."""

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


@dataclass(frozen=True)
class EnginePlan:
    """The rollout engines: ``count`` actors of ``tp`` workers each."""

    backend: str  # "vllm" or "hf"
    count: int
    tp: int
    gpus: float  # what each engine actor asks Ray for (0 when its TP workers take policy bundles)
    cpus: float
    colocated: bool  # on the policy's bundles i*tp .. i*tp+tp-1

    def bundles(self, i: int) -> list[int]:
        """The policy bundles engine ``i`` lives on (colocated engines only)."""
        return list(range(i * self.tp, (i + 1) * self.tp))


@dataclass(frozen=True)
class Request:
    """``count`` resource requests: bundles of one placement group, or separate actors."""

    what: str
    count: int
    cpu: float
    gpu: float
    bundles: bool  # True: one PACK placement group of `count` bundles; False: `count` actors


@dataclass(frozen=True)
class Plan:
    use_gpus: bool
    groups: tuple[GroupPlan, ...]  # policy first
    engines: EnginePlan
    weight_transport: Transport

    def group(self, name: str) -> GroupPlan | None:
        return next((g for g in self.groups if g.name == name), None)

    def requests(self) -> list[Request]:
        """What Ray is asked for, in the order the trainer asks (what rlrun's check places on the nodes)."""
        gpu = 1.0 if self.use_gpus else 0.0
        reqs = [Request(f"{'actor' if g.name == 'policy' else g.name} {g.num_nodes} x {g.gpus_per_node}",
                        g.world_size, g.cpus_per_actor, gpu, True)
                for g in self.groups if not g.in_policy_group]
        e = self.engines
        what = f"vLLM engine (TP {e.tp})" if e.backend == "vllm" else "HF rollout engine"
        reqs.append(Request(what, e.count, 0.0 if e.colocated else e.cpus, 0.0 if e.colocated else e.gpus, False))
        return [r for r in reqs if r.count and (r.cpu or r.gpu)]


def process_cpus(use_gpus: bool) -> float:
    """Logical CPUs of one rank or engine."""
    return 1.0 if use_gpus else CPU_ONLY_CPUS


def plan(cfg: Any, use_gpus: bool) -> Plan:
    """The placement of a validated TrainerConfig on a cluster with (``use_gpus``) or without GPUs."""
    colocated = bool(cfg.colocate_all_models)
    share = COLOCATED_GPU_SHARE if colocated else 1.0
    cpus = process_cpus(use_gpus)
    groups = [GroupPlan("policy", cfg.actor_num_nodes, cfg.actor_num_gpus_per_node, use_gpus, share, cpus, False)]
    for role, name, present in (("ref", "reference", cfg.needs_ref), ("critic", "critic", cfg.needs_critic)):
        if present:
            groups.append(GroupPlan(name, getattr(cfg, f"{role}_num_nodes"), getattr(cfg, f"{role}_num_gpus_per_node"),
                                    use_gpus, share, cpus, colocated))
    if cfg.rollout_backend == "vllm":
        count, tp = int(cfg.vllm_num_engines or 0), int(cfg.vllm_tensor_parallel_size)
        transport: Transport = "shared" if colocated else "broadcast"
    else:
        count, tp, transport = 1, 1, "safetensors"
    if colocated:  # TP > 1: vLLM's Ray executor puts the workers on the bundles, the engine actor takes none
        gpus = (share if tp == 1 else 0.0) if use_gpus else 0.0
        engine = EnginePlan(cfg.rollout_backend, count, tp, gpus, 0.0, True)
    else:
        engine = EnginePlan(cfg.rollout_backend, count, tp, float(tp) if use_gpus else 0.0, cpus, False)
    return Plan(use_gpus, tuple(groups), engine, transport)
