"""What the trainer asks Ray for: one source for ``trainer.loop`` and for rlrun's pre-submit check.

- Each model group (policy, reference, critic) is a PACK placement group of ``num_nodes x
  gpus_per_node`` bundles of ``{GPU: 1, CPU: 1}`` (``{CPU: CPU_ONLY_CPUS}`` on a cluster without
  GPUs, where a "GPU" rank is a CPU rank: Ray's CPUs only gate scheduling there).
- ``--colocate_all_models``: the reference and critic ranks join the policy's placement group and
  every model and engine takes a ``COLOCATED_GPU_SHARE`` of each GPU; engine ``i`` sits on the
  policy's bundles ``i*TP .. i*TP+TP-1`` (the config's rule: engines x TP = actor GPUs).
- Otherwise each engine is one actor asking for ``TP`` GPUs on one node (the HF engine: 1).
  Engines take 1 CPU (``CPU_ONLY_CPUS`` without GPUs) outside the groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CPU_ONLY_CPUS = 0.25  # policy + reference + critic + engine fit into a 1-CPU slot each way on 2 CPUs
COLOCATED_GPU_SHARE = 0.25  # policy, reference, critic and engine on one GPU


def process_cpus(use_gpus: bool) -> float:
    """Logical CPUs of one rank or engine."""
    return 1.0 if use_gpus else CPU_ONLY_CPUS


def gpu_share(cfg: Any) -> float:
    """The share of a GPU one rank or engine process takes."""
    return COLOCATED_GPU_SHARE if cfg.colocate_all_models else 1.0


@dataclass(frozen=True)
class Request:
    """``count`` resource requests of the trainer: bundles of one placement group, or separate actors."""

    what: str
    count: int
    cpu: float
    gpu: float
    bundles: bool  # True: one PACK placement group of `count` bundles; False: `count` actors


def requests(cfg: Any, use_gpus: bool) -> list[Request]:
    """The Ray resources a validated TrainerConfig asks for, in the order the trainer asks."""
    cpu, gpu = process_cpus(use_gpus), 1.0 if use_gpus else 0.0
    reqs = [Request(f"actor {cfg.actor_num_nodes} x {cfg.actor_num_gpus_per_node}", cfg.actor_world_size,
                    cpu, gpu, True)]
    for role, present in (("ref", cfg.needs_ref), ("critic", cfg.needs_critic)):
        if present and not cfg.colocate_all_models:
            nodes, per = getattr(cfg, f"{role}_num_nodes"), getattr(cfg, f"{role}_num_gpus_per_node")
            name = "reference" if role == "ref" else role
            reqs.append(Request(f"{name} {nodes} x {per}", nodes * per, cpu, gpu, True))
    colocated = cfg.colocate_all_models and use_gpus  # inside the policy's bundles: nothing more to ask
    if cfg.rollout_backend == "vllm":
        tp = cfg.vllm_tensor_parallel_size
        reqs.append(Request(f"vLLM engine (TP {tp})", cfg.vllm_num_engines or 0, 0.0 if colocated else cpu,
                            0.0 if cfg.colocate_all_models else tp * gpu, False))
    else:
        reqs.append(Request("HF rollout engine", 1, 0.0 if colocated else cpu,
                            0.0 if cfg.colocate_all_models else gpu, False))
    return [r for r in reqs if r.count and (r.cpu or r.gpu)]
