"""The rollout engines as Ray actors: one builder of engine actors and their Ray options (all of it read from
the placement plan, :mod:`trainer.placement`), start-up deadlines, and the calls a step makes on every engine
(generate, multi-turn generate, sleep, wake).

- Engines on devices of their own reserve one placement group each (the plan's ``engine-<i>``: STRICT_PACK,
  or PACK over nodes for an engine wider than any node)
  once every model group has reserved its own, so they never take a device a model group needs; they start
  at once and come up while the models load.
- Colocated engines live on the policy's bundles. With TP > 1 vLLM's Ray executor starts a worker per bundle
  (``VLLM_RAY_BUNDLE_INDICES``) asking ``VLLM_RAY_PER_WORKER_GPUS`` of it: both come from the plan, and the
  bundles are regrouped by node once Ray has placed the policy (a TP group lies on one node or takes whole
  nodes: :func:`trainer.placement.engine_bundle_groups`).
- :meth:`Engines.wait_ready` waits for every engine within ``--engine_start_timeout``; a pending vLLM worker
  (an ask no bundle can hold) ends the job with one line naming it (:mod:`trainer.deadlines`).
- Faults: every call on the engines has a deadline (``--generate_timeout``); an engine that dies or misses it
  is replaced on its bundle and its share of the call made again (:meth:`Engines.call`), at most
  ``--max_engine_restarts`` times per engine (:class:`Restarts`), then the job ends with one line
  (:class:`EngineFailure`).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from trainer.deadlines import Fault, wait_all
from trainer.errors import one_line
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
    if cfg.vllm_preload_workers and ep.executor == "ray":  # TP workers started with the engine (worker_preload)
        kwargs["preload_workers"] = True
    if cfg.vllm_in_process:
        kwargs["in_process"] = True  # the engine core in the actor's process (the CPU build: always)
    if cfg.vllm_start_with_models and ep.colocated and plan.use_gpus:
        kwargs["kv_upfront"] = True  # started before the models load: no profiling of what they left free
    if plan.use_gpus:
        # The step's batch bounds what the engine schedules at once and the CUDA graphs it captures at start-up
        # (vLLM's default captures up to 512 sequences: most of a small engine's first-step time).
        seqs = min(1024, max(8, 8 * math.ceil(engine_batch(cfg, ep.count) / 8)))
        kwargs["max_num_seqs"] = seqs
        if not cfg.enforce_eager:
            kwargs["compilation_config"] = {"max_cudagraph_capture_size": seqs}
        if cfg.vllm_cudagraph_mode != "auto":
            kwargs["cudagraph_mode"] = cfg.vllm_cudagraph_mode
        if cfg.vllm_compile != "inductor":
            kwargs["compile_mode"] = cfg.vllm_compile
    if cfg.vllm_prewarm_kernels:  # the sampler's kernels are compiled for the settings the job samples with
        kwargs["prewarm_sampling"] = {"n": cfg.n_samples_per_prompt, "temperature": cfg.temperature,
                                      "top_p": cfg.top_p}
    return kwargs


def prewarm_spec(cfg: Any, plan: Plan) -> dict[str, Any] | None:
    """The kernel prewarm's spec of the plan's engines (--vllm_prewarm_kernels; None without it): what each
    :class:`trainer.rollout.vllm_engine.VllmEngine` builds from :func:`vllm_kwargs`, for a copy that the
    driver starts on its own node (trainer.loop.head_prewarm)."""
    from trainer.rollout.kernel_prewarm import engine_spec

    kwargs = vllm_kwargs(cfg, plan)
    if "prewarm_sampling" not in kwargs:
        return None
    return engine_spec(cfg.pretrain, kwargs["dtype"], kwargs, kwargs["enable_prefix_caching"], kwargs["seed"],
                       kwargs["prewarm_sampling"])


def span_kwargs(nodes: Sequence[str]) -> dict[str, Any]:
    """What a vLLM engine whose TP workers sit on ``nodes`` (one entry per worker) is built with beyond
    :func:`vllm_kwargs`: over several nodes, no custom all-reduce. That kernel is NVLink P2P within one node,
    and vLLM decides that its workers share a node by opening each other's shared memory, which two Ray
    nodes on one host (the GPU miniature) can: it then ran its P2P check over all four ranks of a TP-4 engine
    on a node of two GPUs and failed (vLLM 0.26, IndexError in ``_can_p2p``; issue 36)."""
    return {"disable_custom_all_reduce": True} if len(set(nodes)) > 1 else {}


def engine_ports(first_nodes: Sequence[str], span: tuple[int, int] | None) -> list[int | None]:
    """VLLM_PORT for each engine (``first_nodes[i]``: the node engine ``i``'s first process runs on), or None
    each without a rendezvous range. vLLM searches its ports upward from VLLM_PORT and binds them later, so
    engines that start together on one node from the same VLLM_PORT all pick its first port and all but one
    fail (EADDRINUSE; 4 engines of TP 1 on one node, issue 36). The bottom half of the range is vLLM's (the
    trainer's stores take the top): each engine on a node starts its search at its own stretch of it."""
    if span is None:
        return [None] * len(first_nodes)
    slots, seen = [], {}
    for node in first_nodes:
        slots.append(seen.get(node, 0))
        seen[node] = slots[-1] + 1
    half = max(1, (span[1] - span[0] + 1) // 2)
    stride = max(1, half // max(seen.values(), default=1))
    return [span[0] + slot * stride for slot in slots]


class EngineFailure(Fault):
    """An engine failed more often than --max_engine_restarts allows; the message is the one line the job ends
    with (a failed weight push: :class:`trainer.weights.transports.PushFailure`)."""


#: Seconds a liveness ping (before a weight push) may take, at most (a hung engine is replaced, not waited for).
PING_TIMEOUT = 60.0


class Restarts:
    """Replacement bookkeeping: how often each engine slot was replaced, the job's total (the
    ``engines/restarts`` metric), and the limit past which the job ends (``--max_engine_restarts``)."""

    def __init__(self, count: int, limit: int) -> None:
        if count < 1 or limit < 0:
            raise ValueError(f"Restarts({count}, {limit}): expected at least one engine and a limit >= 0")
        self.limit = limit
        self.per_engine = [0] * count
        self.total = 0

    def record(self, i: int, label: str, node: str, error: str) -> None:
        """Count a replacement of engine ``i``; raises :class:`EngineFailure` (one line: the engine, its node, the
        last error) when it is one more than the limit."""
        if self.per_engine[i] >= self.limit:
            raise EngineFailure(f"{label} on node {node} failed {self.per_engine[i] + 1} times (--max_engine_restarts "
                                f"{self.limit}); last error: {error}")
        self.per_engine[i] += 1
        self.total += 1


def replaceable(error: BaseException) -> bool:
    """Whether a failed engine call is the engine's death (replace it and call again), not an error the call
    itself raised (a bad request, a service outage), which would only repeat: a dead actor (Ray's
    RayActorError, ActorDiedError), or a live actor whose vLLM engine core died (EngineDeadError)."""
    import ray.exceptions

    if isinstance(error, ray.exceptions.RayActorError):
        return True
    seen: BaseException | None = getattr(error, "cause", None) or error
    while seen is not None:
        if type(seen).__name__ in ("EngineDeadError", "ActorDiedError"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Engines:
    """The job's rollout engines (Ray actor handles in ``self.handles``) and the calls a step makes on all.

    Every call on the engines has a deadline (``--generate_timeout``). An engine that dies during a call or
    misses its deadline is replaced (:meth:`replace`): killed, a fresh actor started with the same options on
    the same bundle (engines of their own: in their own placement group), waited for (``--engine_start_timeout``),
    and the call made again on it; a caller that needs the engines to hold the current weights passes
    ``restore``, which pushes them before the call is repeated. :attr:`epoch` counts replacements (the
    broadcast weight sync re-forms its group when it changed); ``restarts`` is the bookkeeping.

    Args:
        cfg: the validated TrainerConfig.
        plan: the job's placement plan.
        policy_pg: the policy's placement group (colocated engines live on its bundles).
        policy_bundle_nodes: the node of each policy bundle, as Ray placed it (colocated TP > 1 only).
        head_prewarm: the kernel prewarm the driver started on its node (trainer.loop.head_prewarm): stopped
            once every engine is ready (its GPU memory held until then), and a row of the start-up report.
    """

    def __init__(self, cfg: Any, plan: Plan, policy_pg: Any = None,
                 policy_bundle_nodes: list[str] | None = None, head_prewarm: Any = None) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from trainer.learn.group import bundle_nodes, rendezvous_range, reserve_bundles

        self.cfg, self.plan = cfg, plan
        self.head_prewarm = head_prewarm
        ep = plan.engines
        self.own_pgs: list[Any] = []
        if ep.backend == "vllm":
            from trainer.rollout.vllm_engine import VllmEngine as engine_cls

            self._kwargs = vllm_kwargs(cfg, plan)
        else:
            from trainer.rollout.hf_engine import HfEngine as engine_cls

            self._kwargs = {}
        # the engines call their node's retrieval service (RETRIEVER_TOKEN_ENV says which token they get from here)
        tool_env = {k: os.environ[k] for k in RETRIEVER_TOKEN_ENV if cfg.multi_turn and os.environ.get(k)}
        groups = {pg.name: pg for pg in plan.placement_groups()}
        bundle_sets = [ep.bundles(i) for i in range(ep.count)]
        if ep.colocated and ep.tp > 1 and policy_bundle_nodes:
            from trainer.placement import engine_bundle_groups

            bundle_sets = engine_bundle_groups(policy_bundle_nodes, ep.count, ep.tp)
        self._remote = ray.remote(engine_cls)
        self._options: list[dict[str, Any]] = []  # what each engine is started with (a replacement: the same)
        self._engine_kwargs: list[dict[str, Any]] = []
        self.handles: list[Any] = []
        self.labels: list[str] = []
        pgs, nodes = [], []  # each engine's placement group, and the node of each of its bundles
        for i in range(ep.count):
            if ep.colocated:
                pgs.append(policy_pg)
                nodes.append([policy_bundle_nodes[b] for b in bundle_sets[i]] if policy_bundle_nodes else ["?"])
            else:
                pg = reserve_bundles(groups[ep.placement_group(i)], cfg.placement_timeout)
                self.own_pgs.append(pg)
                pgs.append(pg)
                nodes.append(bundle_nodes(pg) if ep.spans_nodes else ["?"])
        ports = engine_ports([n[0] for n in nodes], rendezvous_range()) if ep.backend == "vllm" else []
        for i in range(ep.count):
            bundles = bundle_sets[i]
            env = {**tool_env, **ep.env(bundles)}
            if ports and ports[i] is not None:
                env["VLLM_PORT"] = str(ports[i])
            options: dict[str, Any] = dict(
                num_cpus=ep.actor_cpus, num_gpus=ep.actor_gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pgs[i], placement_group_bundle_index=bundles[0],
                    placement_group_capture_child_tasks=True))
            if env:
                options["runtime_env"] = {"env_vars": env}
            self._options.append(options)
            self._engine_kwargs.append({**self._kwargs, **(span_kwargs(nodes[i]) if ep.backend == "vllm" else {})})
            self.handles.append(self._start(i))
            self.labels.append(f"{ep.name} {i}")
        self.nodes: list[str] = ["?"] * ep.count
        self.restarts = Restarts(ep.count, cfg.max_engine_restarts)
        self.epoch = 0  # replacements so far: a weight-sync group formed before one must form again
        self._ready = False
        self._startup: dict[str, dict[str, float]] | None = None

    def startup_rows(self) -> dict[str, dict[str, float]]:
        """Each engine's start-up marks (trainer.startup), as read when they were first all ready; {} before."""
        return dict(self._startup or {})

    def _start(self, i: int) -> Any:
        return self._remote.options(**self._options[i]).remote(self.cfg.pretrain, **self._engine_kwargs[i])

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
        if self._startup is None:  # read while every engine is idle (trainer.startup)
            import ray

            self._startup = dict(zip(self.labels, ray.get([h.startup.remote() for h in self.handles]), strict=True))
            if self.head_prewarm is not None:  # its memory back before the first generate
                self._startup["kernel prewarm"] = self.head_prewarm.end()
        print("rollout engines ready: " + ", ".join(self._where(range(len(self.handles)))), flush=True)
        return self.nodes

    def _where(self, indices: Any) -> list[str]:
        """'<label> on node <ip> (pid <pid>)' of the engines ``indices`` (started ones)."""
        import ray

        pids = ray.get([self.handles[i].pid.remote() for i in indices])
        return [f"{self.labels[i]} on node {self.nodes[i]} (pid {pid})" for i, pid in zip(indices, pids, strict=True)]

    # --- faults -----------------------------------------------------------------------------------------
    def replace(self, failed: dict[int, str]) -> None:
        """Replace the engines ``failed`` names (index -> why, one line each): each is counted (past
        --max_engine_restarts the job ends with :class:`EngineFailure`), killed and started afresh with the
        options it had, and every replacement is waited for (--engine_start_timeout). A replacement that dies
        while it starts counts as one more failure of its engine."""
        import ray

        while failed:
            for i, why in sorted(failed.items()):
                ray.kill(self.handles[i], no_restart=True)  # a hung one too (and one past the limit: no waiting on it)
                self.restarts.record(i, self.labels[i], self.nodes[i], why)
                print(f"{self.labels[i]} on node {self.nodes[i]} failed: {why}; replacing it (restart "
                      f"{self.restarts.per_engine[i]} of --max_engine_restarts {self.restarts.limit}, "
                      f"engines/restarts {self.restarts.total})", flush=True)
                self.handles[i] = self._start(i)
                self.epoch += 1
            starting = sorted(failed)
            refs = [self.handles[i].ready.remote() for i in starting]
            labels = [f"{self.labels[i]} (replacement)" for i in starting]
            # one by one: a replacement that fails to start is itself replaced, the others are kept
            wait_all(refs, labels, self.cfg.engine_start_timeout, f"{len(refs)} replacement engine(s) start",
                     check=False)
            failed = {}
            for i, ref in zip(starting, refs, strict=True):
                try:
                    self.nodes[i] = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - counted and replaced again, or the job ends
                    if not replaceable(exc):
                        raise
                    failed[i] = f"replacement did not start: {one_line(exc)}"
            started = [i for i in starting if i not in failed]
            if started:
                print("replaced: " + ", ".join(self._where(started)), flush=True)

    def call(self, method: str, calls: dict[int, tuple[tuple, dict[str, Any]]], timeout_s: float, what: str,
             restore: Callable[[], Any] | None = None) -> dict[int, Any]:
        """``method(*args, **kwargs)`` on engine ``i`` for each ``calls[i]``, all at once, each within
        ``timeout_s``; returns engine index -> result. An engine that dies or misses the deadline is replaced
        (:meth:`replace`), ``restore()`` (if given) hands the replacements the current weights, and its call is
        made again, with the same arguments (the same seeds: the same result). Any other error of a call is
        raised (it would only repeat)."""
        import ray

        results: dict[int, Any] = {}
        todo = dict(calls)
        while todo:
            refs = {i: getattr(self.handles[i], method).remote(*args, **kwargs) for i, (args, kwargs) in todo.items()}
            index = {ref: i for i, ref in refs.items()}
            failed: dict[int, str] = {}
            deadline = time.monotonic() + timeout_s
            pending = list(refs.values())
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    for ref in pending:
                        failed[index[ref]] = f"{what} did not return within {timeout_s:g} s (--generate_timeout)"
                    break
                done, pending = ray.wait(pending, num_returns=1, timeout=min(left, 5.0))
                for ref in done:
                    try:
                        results[index[ref]] = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - replaceable ones are handled, the rest raised
                        if not replaceable(exc):
                            raise
                        failed[index[ref]] = f"died during {what}: {one_line(exc)}"
            if not failed:
                break
            self.replace(failed)
            if restore is not None:
                restore()
            todo = {i: calls[i] for i in failed}
        return results

    def revive(self) -> None:
        """Before a weight push: every engine answers a ping within ``PING_TIMEOUT`` (or --generate_timeout, if
        shorter); one that died since its last call, or hangs, is replaced (its weights come with the push)."""
        timeout = min(PING_TIMEOUT, self.cfg.generate_timeout)
        self.call("ready", {i: ((), {}) for i in range(len(self.handles))}, timeout, "a liveness ping")

    def deadline(self, sequences: int) -> float:
        """The deadline of a generate call of ``sequences`` on one engine: --generate_timeout per engine share of
        a rollout batch it holds (an evaluation set may hold several), plus --retriever_outage_timeout with the
        search tool and --http_tool_outage_timeout with the http tool (an outage is waited out inside the call)."""
        shares = max(1, math.ceil(sequences / engine_batch(self.cfg, len(self.handles))))
        tools = self.cfg.tool_names
        extra = (self.cfg.retriever_outage_timeout if "search" in tools else 0.0) + (
            self.cfg.http_tool_outage_timeout if "http" in tools else 0.0)
        return self.cfg.generate_timeout * shares + extra

    # --- a step's calls ---------------------------------------------------------------------------------
    def _shares(self, texts: list[str], n: int, **kwargs: Any) -> tuple[dict[int, tuple[tuple, dict[str, Any]]], int]:
        parts = shard(len(texts), len(self.handles))
        calls = {i: (([texts[j] for j in idx],), dict(n=n, **kwargs)) for i, idx in enumerate(parts) if idx}
        return calls, max((len(idx) for idx in parts), default=0) * n

    def generate(self, texts: list[str], *, seed: int, logprobs: bool = False, n: int | None = None,
                 temperature: float | None = None, restore: Callable[[], Any] | None = None) -> list[Any]:
        """``n`` (default --n_samples_per_prompt) samples of each text at ``temperature`` (default --temperature;
        0: greedy), prompt-major, the prompts spread over the engines. An engine that fails is replaced and its
        share generated again (see :meth:`call`; ``restore`` pushes the current weights to the replacement)."""
        cfg = self.cfg
        n = cfg.n_samples_per_prompt if n is None else n
        temperature = cfg.temperature if temperature is None else temperature
        calls, most = self._shares(texts, n, temperature=temperature, top_p=cfg.top_p if temperature > 0 else 1.0,
                                   max_new_tokens=cfg.generate_max_len, seed=seed, logprobs=logprobs)
        results = self.call("generate", calls, self.deadline(most), "generate", restore)
        return [s for i in sorted(results) for s in results[i]]  # prompt-major, as the engines return them

    def generate_with_tools(self, texts: list[str], *, seed: int, n: int | None = None,
                            temperature: float | None = None, restore: Callable[[], Any] | None = None,
                            logprobs: bool | None = None) -> tuple[list[Any], list[dict[str, float]]]:
        """Multi-turn tool rollouts: each engine runs the turn loop and the tools in its own process, so it asks
        the services of its node (``{node_ip}`` in --retriever_url) and runs the sandboxes there; see
        trainer.rollout.multiturn and trainer.tools. Returns the samples and each engine's stats (time split, tool
        calls). ``logprobs``: ask the engines for the sampled tokens' log-probs (default: unless
        --skip_rollout_logprobs). Failed engines: as :meth:`generate`."""
        from trainer.tools.registry import settings

        cfg = self.cfg
        n = cfg.n_samples_per_prompt if n is None else n
        temperature = cfg.temperature if temperature is None else temperature
        calls, most = self._shares(
            texts, n, temperature=temperature, top_p=cfg.top_p if temperature > 0 else 1.0,
            max_new_tokens=cfg.generate_max_len, seed=seed, tools=settings(cfg),
            logprobs=not cfg.skip_rollout_logprobs if logprobs is None else logprobs)
        results = self.call("generate_with_tools", calls, self.deadline(most), "generate", restore)
        return ([s for i in sorted(results) for s in results[i][0]], [results[i][1] for i in sorted(results)])

    def sleep(self) -> dict[str, int]:
        """Every engine releases its weights and KV cache (vLLM sleep level 2); returns the bytes freed per
        GPU, summed over the engines sharing one (what waking them needs back there)."""
        need: dict[str, int] = {}
        everyone = {i: ((), {}) for i in range(len(self.handles))}
        for freed in self.call("sleep", everyone, self.cfg.generate_timeout, "sleep").values():
            for device, nbytes in freed.items():
                need[device] = need.get(device, 0) + nbytes
        return need

    def wake(self, tags: list[str] | None = None) -> None:
        everyone = {i: ((), {"tags": tags}) for i in range(len(self.handles))}
        self.call("wake_up", everyone, self.cfg.generate_timeout, "wake-up")

    def shutdown(self) -> None:
        import ray

        if self.head_prewarm is not None:
            self.head_prewarm.finish()
        for engine in self.handles:
            started = self._ready or ray.wait([engine.ready.remote()], timeout=1)[0]
            if started:  # an engine still in its constructor (a start-up deadline passed) is only killed
                try:
                    ray.get(engine.shutdown.remote(), timeout=60)
                except Exception as exc:  # noqa: BLE001 (shutting down regardless; a killed one says so)
                    log.warning("engine shutdown: %s", one_line(exc))
            ray.kill(engine)
        for pg in self.own_pgs:
            ray.util.remove_placement_group(pg)
        self.handles, self.own_pgs = [], []

    def __len__(self) -> int:
        return len(self.handles)
