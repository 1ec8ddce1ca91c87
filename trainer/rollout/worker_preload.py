"""TP workers whose processes start with the engine's, not after it (``--vllm_preload_workers``).

An engine of TP > 1 on GPUs runs vLLM's Ray executor (``RayExecutorV2``, vLLM 0.26 and 0.32): once the
engine's own process has imported vLLM and built its configuration, the executor creates one Ray actor per TP
rank (``ray.remote(RayWorkerProc).options(...).remote(...)``), and each of those new processes imports vLLM
again before its device and NCCL come up. At 7B on H200s that is the "TP workers up" 25-28 s of an engine's
start (docs/benchmarks.md, thirteenth loan). With the workers preloaded a 7B-shaped engine of TP 2 on two
H200s was ready in 33.3 s against 54.7 s (median of two each, eighteenth loan).

Here the engine's process starts one **host** actor per TP rank before it imports anything of vLLM itself,
on the bundle, with the GPU ask and with the runtime environment that vLLM's worker will get
(``VLLM_RAY_BUNDLE_INDICES``, ``VLLM_RAY_PER_WORKER_GPUS``, the engine's runtime environment plus
``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``). Each host imports vLLM's worker modules while the engine
imports its own. When the executor creates its workers, :func:`adopting` hands it the host already on that
bundle, which builds the ``RayWorkerProc`` in its warm process: vLLM defers a worker's own set-up until it
knows the worker's GPU ids, so that constructor is all that creating the actor does.

Only an exact match is adopted. The executor must ask for a ``RayWorkerProc`` with nothing but ``name``,
``num_cpus`` 0, the host's GPU ask, the host's placement group and bundle, and the host's runtime
environment. The worker class must define no public method that the host does not forward. The host must
have imported every module. Otherwise that host is killed, which frees its GPU ask, and vLLM starts its own
worker as it would without the flag; a log line says why. Hosts that were not adopted are killed once the
engine is up or has failed. An adopted host is the worker: vLLM's shutdown kills it. Like every actor that
the engine's process creates, it also ends with that process.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

#: What a host imports: the executor's module (RayWorkerProc, WorkerProc), the CUDA worker and its model
#: runner, and the trainer's worker extension that vLLM mixes into that worker.
PRELOAD = ("vllm.v1.executor.ray_executor_v2", "vllm.v1.worker.gpu_worker", "trainer.weights.vllm_worker_ext")
#: vLLM's CUDA platform's ``ray_noset_device_env_vars``: RayExecutorV2 sets each to "1" in its workers' runtime
#: environment (vLLM maps GPU ids itself). A mismatch is caught at adoption (the runtime environments differ).
NOSET_ENV = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
#: RayWorkerProc's methods that the executor calls through the actor (0.26: all but create_dist_init_method).
FORWARDED = ("get_node_and_physical_gpu_ids", "initialize_worker", "wait_for_init", "run", "create_dist_init_method")
#: Actor options a host can stand for (any other, e.g. 0.32's tensor transport for sharded_rdt: vLLM's own).
ADOPTABLE_OPTIONS = frozenset({"name", "num_cpus", "num_gpus", "scheduling_strategy", "runtime_env"})
#: Seconds an adoption waits for a host's imports before vLLM starts its own worker instead.
READY_TIMEOUT_S = 300.0


class VllmWorkerHost:
    """A Ray actor that imports vLLM's worker modules as it starts, then becomes one TP worker of an engine
    (:meth:`adopt`) and forwards the executor's calls to it."""

    def __init__(self, modules: Sequence[str] = PRELOAD) -> None:
        self.began = time.time()
        self.errors: dict[str, str] = {}
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - reported by ready(); the engine falls back to vLLM's worker
                self.errors[name] = f"{type(exc).__name__}: {exc}"
        self.imported = time.time()
        self._proc: Any = None

    def ready(self) -> dict[str, Any]:
        """When this host began and finished its imports (wall clock), what failed to import, its pid."""
        return {"began": self.began, "imported": self.imported, "errors": dict(self.errors), "pid": os.getpid()}

    def adopt(self, worker_cls: type, kwargs: dict[str, Any]) -> None:
        """Build the worker the executor asked for (``RayWorkerProc(**kwargs)``) in this process (the class
        travels by reference: its module is one this host imported)."""
        self._proc = worker_cls(**kwargs)

    def _worker(self) -> Any:
        if self._proc is None:
            raise RuntimeError("VllmWorkerHost: called before adopt()")
        return self._proc

    def get_node_and_physical_gpu_ids(self, *args: Any, **kwargs: Any) -> Any:
        return self._worker().get_node_and_physical_gpu_ids(*args, **kwargs)

    def initialize_worker(self, *args: Any, **kwargs: Any) -> Any:
        return self._worker().initialize_worker(*args, **kwargs)

    def wait_for_init(self, *args: Any, **kwargs: Any) -> Any:
        return self._worker().wait_for_init(*args, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self._worker().run(*args, **kwargs)

    def create_dist_init_method(self, *args: Any, **kwargs: Any) -> Any:
        return self._worker().create_dist_init_method(*args, **kwargs)


def worker_runtime_env(base: Mapping[str, Any] | None) -> dict[str, Any]:
    """The runtime environment RayExecutorV2 gives its workers, from the engine's own (``base``): a deep copy
    with :data:`NOSET_ENV` in its ``env_vars``."""
    env: dict[str, Any] = copy.deepcopy(dict(base)) if base else {}
    env.setdefault("env_vars", {}).update(NOSET_ENV)
    return env


def missing_methods(worker_cls: type) -> list[str]:
    """The public methods ``worker_cls`` itself defines that a host does not forward (vLLM's executor could
    call them through the actor): none, or the host cannot stand for it."""
    return sorted(name for name, value in vars(worker_cls).items()
                  if callable(value) and not name.startswith("_") and name not in FORWARDED)


def bundle_indices(env: Mapping[str, str], tp: int) -> list[int] | None:
    """The bundles of the engine's TP workers (``VLLM_RAY_BUNDLE_INDICES``, one per rank), or None when vLLM
    places them itself (then a host cannot know its bundle)."""
    raw = env.get("VLLM_RAY_BUNDLE_INDICES", "")
    try:
        bundles = [int(b) for b in raw.split(",")] if raw else []
    except ValueError:
        return None
    return bundles if len(bundles) == tp and len(set(bundles)) == tp else None


class Hosts:
    """One engine's hosts, by bundle: started by :func:`start`, adopted by :func:`adopting`, the rest killed
    by :meth:`release`."""

    def __init__(self, placement_group: Any, gpus: float, runtime_env: dict[str, Any],
                 handles: dict[int, Any], started: float) -> None:
        self.placement_group = placement_group
        self.gpus = gpus
        self.runtime_env = runtime_env
        self.handles = handles  # bundle -> host not yet adopted or released
        self.adopted: set[int] = set()  # the bundles whose host became the worker
        self.started = started
        self.reports: dict[int, dict[str, Any]] = {}
        self.fallbacks: list[str] = []  # why a host was not adopted, one line each

    def release(self, why: str = "") -> None:
        """Kill every host not adopted (their GPU asks freed); ``why``, if given, is logged."""
        for bundle in sorted(self.handles):
            self._drop(bundle, why)

    def _drop(self, bundle: int, why: str) -> None:
        """Kill the host on ``bundle`` (not adopted: its GPU ask freed, vLLM's own worker may take it); ``why``,
        if given, is logged and kept in :attr:`fallbacks`."""
        import ray

        handle = self.handles.pop(bundle)
        if why:
            self.fallbacks.append(f"bundle {bundle}: {why}")
            log.warning("TP worker host on bundle %d not used (vLLM starts its own worker): %s", bundle, why)
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)

    def _mismatch(self, worker_cls: type, options: Mapping[str, Any], args: tuple) -> tuple[int | None, str]:
        """(the bundle the executor asks for, or None, and why its host cannot stand for the worker, or "")."""
        strategy = options.get("scheduling_strategy")
        bundle = getattr(strategy, "placement_group_bundle_index", None)
        group = getattr(strategy, "placement_group", None)
        if bundle not in self.handles:
            return None, f"the executor asked for bundle {bundle!r}, hosts are on {sorted(self.handles)}"
        if group is None or getattr(group, "id", None) != getattr(self.placement_group, "id", None):
            return bundle, "the executor's placement group is not the engine's"
        extra = sorted(set(options) - ADOPTABLE_OPTIONS)
        if extra:
            return bundle, f"the executor asked for actor options a host does not have: {', '.join(extra)}"
        if args:
            return bundle, "the executor passed positional constructor arguments"
        if float(options.get("num_cpus", 0) or 0) != 0.0:
            return bundle, f"the executor asked for num_cpus {options.get('num_cpus')}, a host has 0"
        if float(options.get("num_gpus", 0) or 0) != self.gpus:
            return bundle, f"the executor asked for num_gpus {options.get('num_gpus')}, a host has {self.gpus:g}"
        if dict(options.get("runtime_env") or {}) != self.runtime_env:
            return bundle, "the executor's runtime environment for its workers differs from the hosts'"
        missing = missing_methods(worker_cls)
        if missing:
            return bundle, f"{worker_cls.__name__} has methods a host does not forward: {', '.join(missing)}"
        return bundle, ""

    def adopt(self, worker_cls: type, options: Mapping[str, Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        """The host that stands for the worker the executor asks for (adopted: it builds the worker), or None
        (then that bundle's host is killed, and the caller starts vLLM's own worker)."""
        import ray

        bundle, why = self._mismatch(worker_cls, options, args)
        if not why:
            try:
                report = ray.get(self.handles[bundle].ready.remote(), timeout=READY_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - a dead or stuck host: vLLM's own worker instead
                why = f"the host did not answer within {READY_TIMEOUT_S:g} s ({type(exc).__name__}: {exc})"
            else:
                self.reports[bundle] = report
                if report["errors"]:
                    why = "the host could not import " + "; ".join(f"{m} ({e})" for m, e in report["errors"].items())
        if why:
            if bundle in self.handles:
                self._drop(bundle, why)
            else:
                self.fallbacks.append(why)
                log.warning("no TP worker host used: %s", why)
            return None
        handle = self.handles.pop(bundle)
        handle.adopt.remote(worker_cls, dict(kwargs))  # ordered before the executor's calls on it (one caller)
        report = self.reports[bundle]
        log.info("TP worker on bundle %d: the preloaded host (pid %d, its imports took %.1f s, done %.1f s ago)",
                 bundle, report["pid"], report["imported"] - report["began"], time.time() - report["imported"])
        self.adopted.add(bundle)
        return handle

    def marks(self) -> dict[str, float]:
        """The start-up mark (trainer.startup) of the adopted hosts: when the last of them had its imports done
        (``workers_imported``); {} when none was adopted."""
        done = [r["imported"] for b, r in self.reports.items() if b in self.adopted]
        return {"workers_imported": max(done)} if done else {}


def start(tp: int, gpus: float | None = None, env: Mapping[str, str] | None = None,
          modules: Sequence[str] = PRELOAD) -> Hosts | None:
    """In an engine's actor, before it imports vLLM: one host per TP rank on the bundles vLLM's Ray executor
    will use, or None (with a log line) where they cannot be known: outside a placement group, or without
    ``VLLM_RAY_BUNDLE_INDICES`` naming ``tp`` bundles, or with the V1 Ray executor
    (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``)."""
    import ray
    from ray.util.placement_group import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    env = os.environ if env is None else env
    if env.get("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "1").strip() == "0":
        log.info("TP worker hosts: not with the V1 Ray executor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0)")
        return None
    bundles = bundle_indices(env, tp)
    group = get_current_placement_group()
    if bundles is None or group is None:
        why = f"no VLLM_RAY_BUNDLE_INDICES of {tp} bundles" if bundles is None else "not in a placement group"
        log.info("TP worker hosts: not started (%s)", why)
        return None
    if gpus is None:
        gpus = float(env.get("VLLM_RAY_PER_WORKER_GPUS", "1"))
    runtime_env = worker_runtime_env(ray.get_runtime_context().runtime_env)
    host = ray.remote(VllmWorkerHost)
    started = time.time()
    handles = {b: host.options(num_cpus=0, num_gpus=gpus, runtime_env=runtime_env,
                               scheduling_strategy=PlacementGroupSchedulingStrategy(
                                   placement_group=group, placement_group_bundle_index=b)).remote(tuple(modules))
               for b in bundles}
    return Hosts(group, gpus, runtime_env, handles, started)


class _RayWithHosts:
    """The ``ray`` module as vLLM's executor module sees it while :func:`adopting` runs: the same, except that
    ``ray.remote(<the worker class>)`` builds actors through :class:`_Builder`."""

    def __init__(self, real: Any, worker_cls: type, hosts: Hosts) -> None:
        self._real, self._worker_cls, self._hosts = real, worker_cls, hosts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and args[0] is self._worker_cls:
            return _Builder(self._real, self._worker_cls, self._hosts, {})
        return self._real.remote(*args, **kwargs)


class _Builder:
    """``ray.remote(RayWorkerProc)``: ``.options(...)`` kept, ``.remote(...)`` a host when one stands for it
    (:meth:`Hosts.adopt`), else vLLM's own actor with those options."""

    def __init__(self, real: Any, worker_cls: type, hosts: Hosts, options: dict[str, Any]) -> None:
        self._real, self._worker_cls, self._hosts, self._options = real, worker_cls, hosts, options

    def options(self, **options: Any) -> _Builder:
        return _Builder(self._real, self._worker_cls, self._hosts, {**self._options, **options})

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        handle = self._hosts.adopt(self._worker_cls, self._options, args, kwargs)
        if handle is not None:
            return handle
        actor = self._real.remote(self._worker_cls)
        return (actor.options(**self._options) if self._options else actor).remote(*args, **kwargs)


@contextlib.contextmanager
def adopting(hosts: Hosts | None, module: Any = None) -> Iterator[None]:
    """While the block runs (the engine's ``LLM(...)``), vLLM's Ray executor (``module``: vLLM's
    ``ray_executor_v2`` by default) gets ``hosts`` for its workers where they match; afterwards every host not
    adopted is killed, whatever happened."""
    if hosts is None:
        yield
        return
    try:
        if module is None:
            import vllm.v1.executor.ray_executor_v2 as module
        real, worker_cls = module.ray, module.RayWorkerProc
    except (ImportError, AttributeError) as exc:
        hosts.release(f"vLLM has no RayExecutorV2 to hand them to ({type(exc).__name__}: {exc})")
        yield
        return
    module.ray = _RayWithHosts(real, worker_cls, hosts)
    try:
        yield
    finally:
        module.ray = real
        hosts.release("vLLM created no worker on its bundle (its start failed before that, or it placed its "
                      "workers itself)" if hosts.handles else "")
