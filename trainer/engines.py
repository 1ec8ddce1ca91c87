"""The rollout engines as Ray actors: one builder of engine actors and their Ray options (all of it read from
the placement plan, :mod:`trainer.placement`), start-up deadlines, and the calls a step makes on every engine
(generate, multi-turn generate, sleep, wake).

- Engines on devices of their own reserve one STRICT_PACK placement group each (the plan's ``engine-<i>``)
  once every model group has reserved its own, so they never take a device a model group needs; they start
  at once and come up while the models load.
- Colocated engines live on the policy's bundles. With TP > 1 vLLM's Ray executor starts a worker per bundle
  (``VLLM_RAY_BUNDLE_INDICES``) asking ``VLLM_RAY_PER_WORKER_GPUS`` of it: both come from the plan, and the
  bundles are regrouped by node once Ray has placed the policy (a TP group never spans two nodes).
- :meth:`Engines.wait_ready` waits for every engine within ``--engine_start_timeout``; a pending vLLM worker
  (an ask no bundle can hold) ends the job with one line naming it (:mod:`trainer.deadlines`).
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from trainer.deadlines import wait_all
from trainer.experience import shard
from trainer.placement import Plan

log = logging.getLogger(__name__)

# The retrieval token's value, when the driver has it, goes to the engines; a token *file* never does: its path
# is per node (the cluster role's RLRUN_RETRIEVER_TOKEN_FILE in every node's Ray environment), and each engine
# reads its own node's.
RETRIEVER_TOKEN_ENV = ("RLRUN_RETRIEVER_TOKEN",)


def engine_batch(cfg: Any, count: int) -> int:
    """Sequences one engine decodes at once in a step: its share of the prompts x samples per prompt."""
    return math.ceil(cfg.rollout_batch_size / max(count, 1)) * cfg.n_samples_per_prompt


def vllm_kwargs(cfg: Any, plan: Plan) -> dict[str, Any]:
    """What :class:`trainer.rollout.vllm_engine.VllmEngine` is built with, for every engine of the plan."""
    ep = plan.engines
    kwargs: dict[str, Any] = dict(
        tensor_parallel_size=ep.tp, gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        enable_prefix_caching=cfg.enable_prefix_caching, enable_sleep=cfg.vllm_enable_sleep,
        enforce_eager=cfg.enforce_eager, seed=cfg.seed,
        # new weights always arrive before the next generate: sleeping drops the old ones
        sleep_level=2,
        # a prompt and its response at most: a smaller graph capture, no oversized KV rows
        max_model_len=cfg.max_sequence_len,
        # the policy's dtype: samples come from the weights that are trained
        dtype="bfloat16" if cfg.bf16 else "float32")
    if ep.executor:
        kwargs["distributed_executor_backend"] = ep.executor
    if cfg.vllm_start_with_models and ep.colocated and plan.use_gpus:
        kwargs["kv_upfront"] = True  # started before the models load: no profiling of what they left free
    if plan.use_gpus:
        # The step's batch bounds what the engine schedules at once and the CUDA graphs it captures at start-up
        # (vLLM's default captures up to 512 sequences: most of a small engine's first-step time).
        seqs = min(1024, max(8, 8 * math.ceil(engine_batch(cfg, ep.count) / 8)))
        kwargs["max_num_seqs"] = seqs
        if not cfg.enforce_eager:
            kwargs["compilation_config"] = {"max_cudagraph_capture_size": seqs}
    return kwargs


class Engines:
    """The job's rollout engines (Ray actor handles in ``self.handles``) and the calls a step makes on all.

    Args:
        cfg: the validated TrainerConfig.
        plan: the job's placement plan.
        policy_pg: the policy's placement group (colocated engines live on its bundles).
        policy_bundle_nodes: the node of each policy bundle, as Ray placed it (colocated TP > 1 only).
    """

    def __init__(self, cfg: Any, plan: Plan, policy_pg: Any = None,
                 policy_bundle_nodes: list[str] | None = None) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from trainer.actors.group import reserve_bundles

        self.cfg, self.plan = cfg, plan
        ep = plan.engines
        self.own_pgs: list[Any] = []
        if ep.backend == "vllm":
            from trainer.rollout.vllm_engine import VllmEngine as engine_cls

            kwargs = vllm_kwargs(cfg, plan)
        else:
            from trainer.rollout.hf_engine import HfEngine as engine_cls

            kwargs = {}
        # the engines call their node's retrieval service (RETRIEVER_TOKEN_ENV says which token they get from here)
        tool_env = {k: os.environ[k] for k in RETRIEVER_TOKEN_ENV if cfg.multi_turn and os.environ.get(k)}
        groups = {pg.name: pg for pg in plan.placement_groups()}
        bundle_sets = [ep.bundles(i) for i in range(ep.count)]
        if ep.colocated and ep.tp > 1 and policy_bundle_nodes:
            from trainer.placement import node_local_bundles

            bundle_sets = node_local_bundles(policy_bundle_nodes, ep.count, ep.tp)
        self.handles: list[Any] = []
        self.labels: list[str] = []
        remote = ray.remote(engine_cls)
        for i in range(ep.count):
            if ep.colocated:
                pg = policy_pg
            else:
                pg = reserve_bundles(groups[ep.placement_group(i)], cfg.placement_timeout)
                self.own_pgs.append(pg)
            bundles = bundle_sets[i]
            env = {**tool_env, **ep.env(bundles)}
            options: dict[str, Any] = dict(
                num_cpus=ep.actor_cpus, num_gpus=ep.actor_gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundles[0],
                    placement_group_capture_child_tasks=True))
            if env:
                options["runtime_env"] = {"env_vars": env}
            self.handles.append(remote.options(**options).remote(cfg.pretrain, **kwargs))
            self.labels.append(f"{ep.name} {i}")
        self._ready = False

    # --- start-up ---------------------------------------------------------------------------------------
    def wait_ready(self, timeout_s: float | None = None) -> list[str]:
        """Every engine constructed (vLLM up: weights, KV cache, graphs) within ``timeout_s`` (default
        ``--engine_start_timeout``); returns their nodes. Idempotent."""
        if self._ready:
            return self.nodes
        timeout_s = self.cfg.engine_start_timeout if timeout_s is None else timeout_s
        self.nodes = wait_all([h.ready.remote() for h in self.handles], self.labels, timeout_s,
                              f"{len(self.handles)} rollout engine(s) start")
        self._ready = True
        return self.nodes

    # --- a step's calls ---------------------------------------------------------------------------------
    def generate(self, texts: list[str], *, seed: int, logprobs: bool = False) -> list[Any]:
        """``--n_samples_per_prompt`` samples of each text, prompt-major, the prompts spread over the engines."""
        import ray

        cfg = self.cfg
        parts = shard(len(texts), len(self.handles))
        refs = [engine.generate.remote([texts[i] for i in idx], n=cfg.n_samples_per_prompt,
                                       temperature=cfg.temperature, top_p=cfg.top_p,
                                       max_new_tokens=cfg.generate_max_len, seed=seed, logprobs=logprobs)
                for engine, idx in zip(self.handles, parts, strict=True) if idx]
        return [s for chunk in ray.get(refs) for s in chunk]  # prompt-major, as the engines return them

    def generate_with_tools(self, texts: list[str], *, seed: int) -> tuple[list[Any], list[dict[str, float]]]:
        """Multi-turn search rollouts: each engine runs the turn loop in its own process, so it asks the
        retrieval service of its node (``{node_ip}`` in --retriever_url); see trainer.rollout.tools. Returns
        the samples and each engine's time split."""
        import ray

        cfg = self.cfg
        parts = shard(len(texts), len(self.handles))
        refs = [engine.generate_with_tools.remote(
                    [texts[i] for i in idx], n=cfg.n_samples_per_prompt, temperature=cfg.temperature,
                    top_p=cfg.top_p, max_new_tokens=cfg.generate_max_len, seed=seed,
                    retriever_url=cfg.retriever_url, retriever_topk=cfg.retriever_topk, max_turns=cfg.max_turns,
                    retriever_timeout=cfg.retriever_timeout, retriever_retries=cfg.retriever_retries)
                for engine, idx in zip(self.handles, parts, strict=True) if idx]
        results = ray.get(refs)
        return [s for chunk, _ in results for s in chunk], [stats for _, stats in results]

    def sleep(self) -> dict[str, int]:
        """Every engine releases its weights and KV cache (vLLM sleep level 2); returns the bytes freed per
        GPU, summed over the engines sharing one (what waking them needs back there)."""
        import ray

        need: dict[str, int] = {}
        for freed in ray.get([engine.sleep.remote() for engine in self.handles]):
            for device, nbytes in freed.items():
                need[device] = need.get(device, 0) + nbytes
        return need

    def wake(self, tags: list[str] | None = None) -> None:
        import ray

        ray.get([engine.wake_up.remote(tags=tags) for engine in self.handles])

    def shutdown(self) -> None:
        import ray

        for engine in self.handles:
            started = self._ready or ray.wait([engine.ready.remote()], timeout=1)[0]
            if started:  # an engine still in its constructor (a start-up deadline passed) is only killed
                try:
                    ray.get(engine.shutdown.remote(), timeout=60)
                except Exception as exc:  # noqa: BLE001 (shutting down regardless)
                    log.warning("engine shutdown: %s", exc)
            ray.kill(engine)
        for pg in self.own_pgs:
            ray.util.remove_placement_group(pg)
        self.handles, self.own_pgs = [], []

    def __len__(self) -> int:
        return len(self.handles)

