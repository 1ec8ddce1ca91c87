"""The TP worker hosts of ``--vllm_preload_workers`` (trainer.rollout.worker_preload): what decides that a host
may stand for the worker vLLM's Ray executor asks for, and the executor's side of that contract as the
installed vLLM has it. The hosts themselves, started and adopted in a Ray cluster, are tested in
tests/integration/test_colocated_placement.py; vLLM's real executor runs with them only on GPUs
(bench/gpu/pipeline.sh, stages preload1, preload2 and check2; docs/benchmarks.md, eighteenth loan)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainer.rollout import worker_preload as wp


class Worker:
    """A worker class with the public methods vLLM 0.32's RayWorkerProc has."""

    READY_STR = "READY"

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def create_dist_init_method(self): ...
    def get_node_and_physical_gpu_ids(self): ...
    def initialize_worker(self, local_rank, env_vars, driver_env_vars=None, assigned_physical_gpu_ids=None): ...
    def _init_message_queues(self, handle, config): ...
    def wait_for_init(self): ...
    def run(self): ...


def _hosts(bundles=(0, 1), gpus=0.25, env=None):
    group = SimpleNamespace(id="pg-1")
    runtime_env = wp.worker_runtime_env(env if env is not None else {"env_vars": {"A": "1"}})
    return wp.Hosts(group, gpus, runtime_env, {b: f"host-{b}" for b in bundles}, started=0.0)


def _options(hosts, bundle=1, **over):
    strategy = SimpleNamespace(placement_group=SimpleNamespace(id="pg-1"), placement_group_bundle_index=bundle)
    options = {"name": "w", "num_cpus": 0, "num_gpus": hosts.gpus, "scheduling_strategy": strategy,
               "runtime_env": wp.worker_runtime_env({"env_vars": {"A": "1"}})}
    return {**options, **over}


def test_an_exact_ask_is_adoptable():
    hosts = _hosts()
    assert hosts._mismatch(Worker, _options(hosts), ()) == (1, "")


@pytest.mark.parametrize(("over", "args", "why"), [
    ({"num_gpus": 1.0}, (), "asked for num_gpus 1.0, a host has 0.25"),
    ({"num_cpus": 1}, (), "asked for num_cpus 1, a host has 0"),
    ({"enable_tensor_transport": True}, (), "actor options a host does not have: enable_tensor_transport"),
    ({"runtime_env": {"env_vars": {"A": "2", **wp.NOSET_ENV}}}, (), "runtime environment for its workers differs"),
    ({"runtime_env": {"env_vars": {"A": "1"}}}, (), "runtime environment for its workers differs"),  # no NOSET
    ({}, ("config",), "positional constructor arguments"),
])
def test_anything_but_an_exact_ask_falls_back_naming_why(over, args, why):
    hosts = _hosts()
    bundle, reason = hosts._mismatch(Worker, _options(hosts, **over), args)
    assert bundle == 1 and why in reason


def test_another_bundle_or_placement_group_is_not_a_hosts():
    hosts = _hosts(bundles=(0, 1))
    bundle, why = hosts._mismatch(Worker, _options(hosts, bundle=2), ())
    assert bundle is None and "bundle 2, hosts are on [0, 1]" in why
    other = SimpleNamespace(placement_group=SimpleNamespace(id="pg-2"), placement_group_bundle_index=0)
    assert hosts._mismatch(Worker, _options(hosts, scheduling_strategy=other), ()) == (
        0, "the executor's placement group is not the engine's")


def test_a_worker_class_with_a_method_the_host_does_not_forward_is_not_adopted():
    class Grown(Worker):
        def pause(self): ...

    hosts = _hosts()
    assert wp.missing_methods(Worker) == []
    assert wp.missing_methods(Grown) == ["pause"]
    assert hosts._mismatch(Grown, _options(hosts), ())[1] == "Grown has methods a host does not forward: pause"


def test_every_forwarded_method_is_a_method_of_the_host():
    for name in wp.FORWARDED:
        assert callable(getattr(wp.VllmWorkerHost, name)), name


@pytest.mark.parametrize(("raw", "tp", "want"), [
    ("2,3", 2, [2, 3]), ("0", 1, [0]), ("", 2, None), ("0,1", 4, None), ("0,0", 2, None), ("a,b", 2, None),
])
def test_bundle_indices(raw, tp, want):
    assert wp.bundle_indices({"VLLM_RAY_BUNDLE_INDICES": raw} if raw else {}, tp) == want


def test_worker_runtime_env_copies_the_engines_and_adds_the_noset_variable():
    base = {"env_vars": {"A": "1"}, "working_dir": "gcs://pkg.zip"}
    env = wp.worker_runtime_env(base)
    assert env == {"env_vars": {"A": "1", **wp.NOSET_ENV}, "working_dir": "gcs://pkg.zip"}
    assert base == {"env_vars": {"A": "1"}, "working_dir": "gcs://pkg.zip"}  # the engine's own is untouched
    assert wp.worker_runtime_env(None) == {"env_vars": dict(wp.NOSET_ENV)}


def test_the_engine_starts_no_hosts_where_their_bundles_cannot_be_known():
    pytest.importorskip("ray")
    assert wp.start(2, env={"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0", "VLLM_RAY_BUNDLE_INDICES": "0,1"}) is None
    assert wp.start(2, env={"VLLM_RAY_BUNDLE_INDICES": "0"}) is None  # one bundle for two ranks
    assert wp.start(2, env={"VLLM_RAY_BUNDLE_INDICES": "0,1"}) is None  # not in a placement group (no Ray here)


# --- the installed vLLM's side of the contract ------------------------------------------------------------
def test_the_installed_vllm_creates_its_workers_where_the_hosts_stand_in():
    """RayExecutorV2's module has the two names adopting() swaps in (``ray`` and ``RayWorkerProc``), creates its
    workers with ``ray.remote(RayWorkerProc)``, and its worker class has no public method a host lacks."""
    v2 = pytest.importorskip("vllm.v1.executor.ray_executor_v2")
    assert v2.ray.remote is not None and inspect.isclass(v2.RayWorkerProc)
    assert "ray.remote(RayWorkerProc)" in inspect.getsource(v2.RayExecutorV2._init_executor).replace("\n", "")
    assert wp.missing_methods(v2.RayWorkerProc) == []


def test_the_installed_vllm_builds_its_workers_runtime_env_as_the_hosts_get_theirs(monkeypatch):
    v2 = pytest.importorskip("vllm.v1.executor.ray_executor_v2")
    monkeypatch.setattr(v2, "current_platform", SimpleNamespace(ray_noset_device_env_vars=list(wp.NOSET_ENV)))
    base = {"env_vars": {"RLRUN_X": "1"}, "working_dir": "gcs://pkg.zip"}
    executor = SimpleNamespace(parallel_config=SimpleNamespace(ray_runtime_env=base, ray_workers_use_nsight=False))
    assert v2.RayExecutorV2._build_runtime_env(executor) == wp.worker_runtime_env(base)


def test_noset_env_is_vllms_cuda_platforms():
    """vLLM's CUDA platform cannot be imported on the CPU build: its class attribute is read from the source."""
    cuda = pytest.importorskip("vllm.platforms").__path__[0] + "/cuda.py"
    tree = ast.parse(Path(cuda).read_text())
    values = [ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.AnnAssign | ast.Assign)
              and "ray_noset_device_env_vars" in ast.unparse(node.target if isinstance(node, ast.AnnAssign)
                                                             else node.targets[0])]
    assert values == [list(wp.NOSET_ENV)]


@pytest.mark.parametrize("in_process, started", [(False, False), (None, False), (True, True)])
def test_an_engine_starts_hosts_only_when_its_core_runs_in_its_own_process(monkeypatch, caplog, in_process, started):
    """The stage xnode2 (2026-11-29): with the engine's core in a process vLLM spawns, that process builds the
    Ray executor, out of ``adopting()``'s reach, and the hosts sat idle on their bundles with nothing said. The
    engine starts them only with ``in_process=True``, else it says why. (The engine stops at its sleep_level
    check, after the hosts' start and before vLLM builds anything.)"""
    from trainer.rollout import vllm_engine

    calls = []
    monkeypatch.setattr(vllm_engine.worker_preload, "start", lambda tp: calls.append(tp))
    with pytest.raises(ValueError, match="sleep_level"):
        vllm_engine.VllmEngine("/nonexistent/model", tensor_parallel_size=2, distributed_executor_backend="ray",
                               preload_workers=True, in_process=in_process, sleep_level=3)
    assert calls == ([2] if started else [])
    said = [r.getMessage() for r in caplog.records if "no TP worker hosts started" in r.getMessage()]
    assert bool(said) != started, said
