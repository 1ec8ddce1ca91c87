"""The engines' placement on a GPU cluster, on CPU: Ray is told the machine has 4 GPUs (nothing touches them),
and the engine classes are probes that ask Ray for what the real ones ask.

Two GPU-only hangs these tests keep away (on CPU an engine asks for no GPU):
- with --colocate_all_models the policy's placement group holds every GPU, and the rollout engine used to
  ask Ray for a quarter GPU outside that group, which never becomes free;
- with TP > 1, vLLM's Ray executor starts one worker per bundle named by ``VLLM_RAY_BUNDLE_INDICES``, each
  asking ``VLLM_RAY_PER_WORKER_GPUS`` (default: a whole GPU) of a bundle the policy and the reference already
  hold half of: Ray waits for ever, silently (issue 28, seen on an H100 x4).
The vLLM probe below does what vLLM's ``RayDistributedExecutor._init_workers_ray`` does (vLLM 0.26 and 0.32):
it reads those two variables and starts ``num_cpus=0, num_gpus=VLLM_RAY_PER_WORKER_GPUS`` workers on those
bundles of its current placement group, and waits for them in its constructor.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

pytestmark = pytest.mark.integration

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def fake_gpu_cluster():
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a private throwaway cluster; never the user's ~/.ray token
    import sys

    # the probes are this file's classes: shipped by value (the workers cannot import a test module)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    temp = f"/tmp/rlrun-colo-{os.getpid()}"
    ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, _temp_dir=temp, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


@ray.remote
class Probe:
    def gpu_ids(self) -> list:
        return ray.get_runtime_context().get_accelerator_ids()["GPU"]


class RayWorkerWrapper:
    """Named as vLLM's worker class, so the deadline's line names what a user would see."""

    def gpu_ids(self) -> list:
        return ray.get_runtime_context().get_accelerator_ids()["GPU"]


class VllmRayExecutorProbe:
    """What vLLM's engine asks of Ray: TP > 1 with distributed_executor_backend="ray" starts a worker per
    bundle of VLLM_RAY_BUNDLE_INDICES asking VLLM_RAY_PER_WORKER_GPUS, num_cpus=0, and waits for them."""

    def __init__(self, model_path: str, *, tensor_parallel_size: int = 1, distributed_executor_backend=None,
                 **_kwargs):
        from ray.util.placement_group import get_current_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.workers = []
        if distributed_executor_backend == "ray":
            pg = get_current_placement_group()
            bundles = [int(b) for b in os.environ["VLLM_RAY_BUNDLE_INDICES"].split(",")]
            assert len(bundles) == tensor_parallel_size
            gpus = float(os.environ.get("VLLM_RAY_PER_WORKER_GPUS", "1"))
            worker = ray.remote(RayWorkerWrapper)
            self.workers = [worker.options(num_cpus=0, num_gpus=gpus, scheduling_strategy=(
                PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_capture_child_tasks=True,
                                                 placement_group_bundle_index=b))).remote() for b in bundles]
            ray.get([w.gpu_ids.remote() for w in self.workers])  # vLLM waits for its workers here

        self.kwargs = dict(_kwargs)

    def ready(self) -> str:
        return ray.util.get_node_ip_address()

    def started_with(self) -> tuple[str | None, dict]:
        """The VLLM_PORT this engine's process sees and the vLLM keyword arguments it got."""
        return os.environ.get("VLLM_PORT"), self.kwargs

    def pid(self) -> int:  # the engines' log line names each engine's node and pid
        return os.getpid()

    def startup(self) -> dict:  # Engines reads each engine's start-up marks once they are ready (trainer.startup)
        return {}

    def gpu_ids(self) -> list:
        if self.workers:
            return sorted(g for w in self.workers for g in ray.get(w.gpu_ids.remote()))
        return ray.get_runtime_context().get_accelerator_ids()["GPU"]

    def shutdown(self) -> None:
        pass


class HfProbe(VllmRayExecutorProbe):
    pass


def cfg_of(*sets: str):
    from rlrun import presets as P

    preset = P.load_preset("tiny-rloo", P.preset_dirs())
    base = ["placement_timeout=30", "engine_start_timeout=20", "micro_train_batch_size=4", "train_batch_size=32"]
    return P.build_config(preset, P.parse_sets([*base, *sets]),
                          {"workdir": "/w", "reward_url": "http://10.0.0.5:5001/get_reward"})


@pytest.fixture()
def probes(monkeypatch):
    import trainer.rollout.hf_engine as hf_engine
    import trainer.rollout.vllm_engine as vllm_engine

    monkeypatch.setattr(hf_engine, "HfEngine", HfProbe)
    monkeypatch.setattr(vllm_engine, "VllmEngine", VllmRayExecutorProbe)


def _policy_and_ref(cfg, plan):
    """The policy's placement group and quarter-GPU policy + reference ranks, as Trainer builds them colocated."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from trainer.learn.group import GroupSpec, reserve

    g = plan.group("policy")
    pg = reserve(GroupSpec("policy", g.num_nodes, g.gpus_per_node, True, g.gpus_per_actor, g.cpus_per_actor), 60)
    ranks = []
    for owner in ("policy", "reference"):
        for i in range(g.world_size):
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
            ranks.append(Probe.options(num_cpus=g.cpus_per_actor if owner == "policy" else 0,
                                       num_gpus=g.gpus_per_actor, scheduling_strategy=strategy).remote())
    ray.get([r.gpu_ids.remote() for r in ranks], timeout=120)
    return pg, ranks


def _cleanup(engines, ranks, pg):
    if engines is not None:
        engines.shutdown()
    for r in ranks:
        ray.kill(r)
    if pg is not None:
        ray.util.remove_placement_group(pg)


def test_colocated_engine_gets_a_gpu_share_beside_the_policy(fake_gpu_cluster, probes):
    from trainer.placement import plan
    from trainer.rollout.engines import Engines

    cfg = cfg_of("rollout_backend=hf", "vllm_num_engines=0", "enable_prefix_caching=false", "enforce_eager=false",
                 "colocate_all_models=true",
                 "actor_num_gpus_per_node=2", "ref_num_gpus_per_node=2", "rollout_batch_size=4",
                 "micro_rollout_batch_size=2")
    p = plan(cfg, use_gpus=True)
    pg, ranks = _policy_and_ref(cfg, p)
    engines = None
    try:
        # As the old code asked: a quarter GPU anywhere. Every GPU is in a placement group: never scheduled.
        hold = Probe.options(num_cpus=0, num_gpus=2).remote()  # the other two GPUs, held
        ray.get(hold.gpu_ids.remote(), timeout=60)
        stranded = Probe.options(num_cpus=1.0, num_gpus=0.25).remote()
        ready, _ = ray.wait([stranded.gpu_ids.remote()], timeout=5)
        assert ready == []
        ray.kill(stranded)
        engines = Engines(cfg, p, pg)
        engines.wait_ready()
        got = ray.get([e.gpu_ids.remote() for e in engines.handles], timeout=60)
        policy_gpus = ray.get([r.gpu_ids.remote() for r in ranks[:2]])
        assert len(got) == 1 and got[0] in policy_gpus  # a share of one of the policy's GPUs
        ray.kill(hold)
    finally:
        _cleanup(engines, ranks, pg)


def test_colocated_tp2_workers_take_the_plans_share_of_the_policys_bundles(fake_gpu_cluster, probes):
    from trainer.learn.group import bundle_nodes
    from trainer.placement import plan
    from trainer.rollout.engines import Engines

    cfg = cfg_of("colocate_all_models=true", "vllm_enable_sleep=true", "actor_num_gpus_per_node=2",
                 "ref_num_gpus_per_node=2", "vllm_num_engines=1", "vllm_tensor_parallel_size=2",
                 "rollout_batch_size=4", "micro_rollout_batch_size=2")
    p = plan(cfg, use_gpus=True)
    assert p.engines.env([0, 1]) == {"VLLM_RAY_BUNDLE_INDICES": "0,1", "VLLM_RAY_PER_WORKER_GPUS": "0.25"}
    pg, ranks = _policy_and_ref(cfg, p)
    engines = None
    try:
        engines = Engines(cfg, p, pg, bundle_nodes(pg))
        assert len(engines.wait_ready()) == 1
        workers = ray.get(engines.handles[0].gpu_ids.remote(), timeout=60)
        policy_gpus = sorted(g for r in ranks[:2] for g in ray.get(r.gpu_ids.remote()))
        assert workers == policy_gpus  # one worker on each of the policy's two GPUs
    finally:
        _cleanup(engines, ranks, pg)


def test_a_worker_asking_a_whole_gpu_of_a_shared_bundle_ends_the_job_with_one_line(fake_gpu_cluster, probes,
                                                                                   monkeypatch):
    """The TP > 1 hang, on purpose: the engine's workers ask vLLM's default (a whole GPU) of bundles the policy
    and the reference hold half of. The start-up deadline names the pending worker, its ask and the bundle's
    free share."""
    import trainer.placement as placement
    from trainer.deadlines import StartupTimeout
    from trainer.rollout.engines import Engines

    cfg = cfg_of("colocate_all_models=true", "vllm_enable_sleep=true", "actor_num_gpus_per_node=2",
                 "ref_num_gpus_per_node=2", "vllm_num_engines=1", "vllm_tensor_parallel_size=2",
                 "rollout_batch_size=4", "micro_rollout_batch_size=2")
    good = placement.plan(cfg, use_gpus=True)
    import dataclasses

    old = dataclasses.replace(good, engines=dataclasses.replace(good.engines, worker_gpus=1.0))
    pg, ranks = _policy_and_ref(cfg, good)
    engines = None
    try:
        engines = Engines(cfg, old, pg)
        t0 = time.monotonic()
        with pytest.raises(StartupTimeout) as err:
            engines.wait_ready(timeout_s=8)
        assert time.monotonic() - t0 < 20
        line = str(err.value)
        assert "\n" not in line
        assert line.startswith("1 rollout engine(s) start not done within 8 s (waiting for vLLM engine (TP 2) 0)")
        assert "pending RayWorkerWrapper asks GPU 1 of rlrun-policy bundle" in line, line
        assert "has GPU 0.5 of that bundle free" in line, line
        assert "GPU 2 of 4, CPU 2 of 4 of the node" in line, line  # the policy's group holds the other two
        assert "VllmRayExecutorProbe still in its constructor (pid " in line, line
    finally:
        _cleanup(engines, ranks, pg)


def test_split_tp2_engine_takes_two_whole_gpus_of_its_own(fake_gpu_cluster, probes):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from trainer.learn.group import GroupSpec, reserve
    from trainer.placement import plan
    from trainer.rollout.engines import Engines

    cfg = cfg_of("actor_num_gpus_per_node=1", "ref_num_gpus_per_node=1", "vllm_num_engines=1",
                 "vllm_tensor_parallel_size=2", "rollout_batch_size=4", "micro_rollout_batch_size=2")
    p = plan(cfg, use_gpus=True)
    pg = reserve(GroupSpec("policy", 1, 1, use_gpus=True), timeout_s=60)
    policy = Probe.options(num_cpus=1, num_gpus=1,
                           scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg)).remote()
    engines = None
    try:
        engines = Engines(cfg, p)
        engines.wait_ready()
        got = ray.get(engines.handles[0].gpu_ids.remote(), timeout=60)
        mine = ray.get(policy.gpu_ids.remote(), timeout=60)
        assert len(got) == 2 and not set(got) & set(mine)  # two other GPUs, whole
    finally:
        _cleanup(engines, [policy], pg)


def test_a_group_the_cluster_cannot_hold_fails_within_its_deadline_naming_what_is_free(fake_gpu_cluster):
    from trainer.deadlines import StartupTimeout
    from trainer.learn.group import GroupSpec, reserve

    t0 = time.monotonic()
    with pytest.raises(StartupTimeout) as err:
        reserve(GroupSpec("policy", 1, 8, use_gpus=True), timeout_s=3)
    assert time.monotonic() - t0 < 15
    line = str(err.value)
    assert line.startswith("group policy (1 nodes x 8), policy: 8 bundles of {GPU: 1, CPU: 1} (GPU 8, CPU 8 in all) "
                           "not placed within 3 s: placement group rlrun-policy is not placed (free per node: "), line
    assert line.endswith(": GPU 4 of 4, CPU 4 of 4)"), line
    assert not [p for p in ray.util.placement_group_table().values() if p["state"] == "PENDING"]


def test_engines_sharing_a_node_search_their_ports_from_their_own_stretch(fake_gpu_cluster, probes, monkeypatch):
    """Four engines of TP 1 on one node (7b-ppo on 4 GPUs) all started from the node's VLLM_PORT, and vLLM picks
    the first free port and binds it later: all but one failed with EADDRINUSE on the GPU machine (issue 36).
    Each engine's process now sees a VLLM_PORT of its own from the bottom half of the rendezvous range; one
    node: no engine goes without vLLM's custom all-reduce."""
    from trainer.learn.group import RENDEZVOUS_PORTS_ENV, bundle_nodes
    from trainer.placement import plan
    from trainer.rollout.engines import Engines

    monkeypatch.setenv(RENDEZVOUS_PORTS_ENV, "9730-9749")  # what the node env file gives the job's driver
    cfg = cfg_of("colocate_all_models=true", "vllm_enable_sleep=true", "actor_num_gpus_per_node=4",
                 "ref_num_gpus_per_node=4", "vllm_num_engines=4", "rollout_batch_size=4", "micro_rollout_batch_size=1",
                 "micro_train_batch_size=1", "train_batch_size=16")
    p = plan(cfg, use_gpus=True)
    pg, ranks = _policy_and_ref(cfg, p)
    engines = None
    try:
        engines = Engines(cfg, p, pg, bundle_nodes(pg))
        engines.wait_ready()
        started = ray.get([e.started_with.remote() for e in engines.handles], timeout=60)
        assert [port for port, _ in started] == ["9730", "9732", "9734", "9736"]
        assert all("disable_custom_all_reduce" not in kwargs for _, kwargs in started)
    finally:
        _cleanup(engines, ranks, pg)


def test_the_drivers_kernel_prewarm_is_stopped_once_the_engines_are_ready(fake_gpu_cluster, probes, tmp_path):
    """trainer.loop.head_prewarm's copy on the driver's node holds its GPU memory after its work until the engines
    stop it: once every engine is ready (before the first generate), its whole process group is ended and the
    step-1 start-up report gets its row. Here the copy is a process that has reported its work done and holds,
    as trainer.rollout.kernel_prewarm's child does (its vLLM run: tests/integration/test_vllm_engine.py); each
    engine is still started with its own prewarm (the engines of other nodes)."""
    import json
    import subprocess
    import tempfile

    from trainer.learn.group import bundle_nodes
    from trainer.placement import plan
    from trainer.procs import alive
    from trainer.rollout.engines import Engines
    from trainer.rollout.kernel_prewarm import Prewarm

    cfg = cfg_of("colocate_all_models=true", "vllm_enable_sleep=true", "actor_num_gpus_per_node=2",
                 "ref_num_gpus_per_node=2", "vllm_num_engines=2", "rollout_batch_size=4", "micro_rollout_batch_size=2",
                 "vllm_start_with_models=true", "vllm_prewarm_kernels=true")
    p = plan(cfg, use_gpus=True)
    began = time.time()
    line = json.dumps({"prewarm": {"status": "done", "ended": began + 1.0, "detail": ""}})
    log = tempfile.TemporaryFile()  # noqa: SIM115 (Prewarm.finish closes it)
    child = subprocess.Popen(["bash", "-c", f"echo '{line}'; sleep 300 & echo $! >&2; wait"], stdout=log,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    grandchild = int(child.stderr.readline())
    prewarm = Prewarm(child, log, began)
    assert prewarm.wait(10) is not None
    pg, ranks = _policy_and_ref(cfg, p)
    engines = None
    try:
        engines = Engines(cfg, p, pg, bundle_nodes(pg), head_prewarm=prewarm)
        assert child.poll() is None  # the engines are starting: it still holds
        engines.wait_ready()
        assert child.returncode is not None
        deadline = time.monotonic() + 10
        while alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(grandchild)
        assert engines.startup_rows()["kernel prewarm"] == {"prewarm": began, "prewarmed": began + 1.0}
        for engine in engines.handles:
            _, kwargs = ray.get(engine.started_with.remote(), timeout=60)
            assert kwargs["prewarm_sampling"] == {"n": cfg.n_samples_per_prompt, "temperature": cfg.temperature,
                                                  "top_p": cfg.top_p}
    finally:
        _cleanup(engines, ranks, pg)
        prewarm.finish()
        child.stderr.close()


# --- --vllm_preload_workers: TP workers started with the engine (trainer.rollout.worker_preload) ---------------
class RayWorkerProc:
    """Stands for vLLM's worker class: its public methods are those the hosts forward; it notes the process it
    was built in and whether that process had imported the host's module before (``tabnanny``: nothing of Ray
    or of this test imports it)."""

    READY_STR = "READY"

    def __init__(self, rank: int):
        import sys

        self.rank, self.pid, self.preloaded = rank, os.getpid(), "tabnanny" in sys.modules

    def get_node_and_physical_gpu_ids(self):
        return ray.get_runtime_context().get_node_id(), ray.get_runtime_context().get_accelerator_ids()["GPU"]

    def initialize_worker(self, local_rank, env_vars, driver_env_vars=None, assigned_physical_gpu_ids=None):
        self.local_rank = local_rank

    def wait_for_init(self):
        return {"status": self.READY_STR, "rank": self.rank, "pid": self.pid, "preloaded": self.preloaded}


class VllmPreloadProbe(VllmRayExecutorProbe):
    """VllmEngine's start with --vllm_preload_workers, down to vLLM's RayExecutorV2 creating its workers: the
    hosts started first (trainer.rollout.worker_preload.start), then the executor's actor creation (its step 5,
    vLLM 0.26 and 0.32: the runtime environment built from the engine's own) inside ``adopting``, then its
    calls on each worker. With ``extra_env`` the executor's workers get one more variable (a runtime environment
    no host has)."""

    extra_env = False

    def __init__(self, model_path: str, *, tensor_parallel_size: int = 1, distributed_executor_backend=None,
                 preload_workers: bool = False, **_kwargs):
        import copy
        from types import SimpleNamespace

        from ray.util.placement_group import get_current_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from trainer.rollout import worker_preload

        assert preload_workers and distributed_executor_backend == "ray"
        self.kwargs = dict(_kwargs)
        hosts = worker_preload.start(tensor_parallel_size, modules=("tabnanny",))
        executor = SimpleNamespace(ray=ray, RayWorkerProc=RayWorkerProc)  # vllm.v1.executor.ray_executor_v2
        with worker_preload.adopting(hosts, module=executor):
            runtime_env = copy.deepcopy(dict(ray.get_runtime_context().runtime_env))
            runtime_env.setdefault("env_vars", {}).update({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"})
            if self.extra_env:
                runtime_env["env_vars"]["EXTRA"] = "1"
            bundles = [int(b) for b in os.environ["VLLM_RAY_BUNDLE_INDICES"].split(",")]
            self.workers = [
                executor.ray.remote(executor.RayWorkerProc).options(
                    name=f"worker-{rank}-{os.getpid()}", num_cpus=0,
                    num_gpus=float(os.environ["VLLM_RAY_PER_WORKER_GPUS"]), runtime_env=runtime_env,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=get_current_placement_group(), placement_group_bundle_index=b)).remote(rank=rank)
                for rank, b in enumerate(bundles)]
            self.gpus = ray.get([w.get_node_and_physical_gpu_ids.remote() for w in self.workers], timeout=60)
            ray.get([w.initialize_worker.remote(i, {}) for i, w in enumerate(self.workers)], timeout=60)
            self.inits = ray.get([w.wait_for_init.remote() for w in self.workers], timeout=60)
        self.hosts = {b: r["pid"] for b, r in hosts.reports.items()}
        self.fallbacks = list(hosts.fallbacks)
        self.marks = hosts.marks()

    def preload_report(self) -> dict:
        return {"inits": self.inits, "host_pids": self.hosts, "fallbacks": self.fallbacks, "marks": self.marks,
                "gpus": sorted(g for _, ids in self.gpus for g in ids)}

    def gpu_ids(self) -> list:
        return sorted(g for _, ids in self.gpus for g in ids)


class VllmPreloadMismatchProbe(VllmPreloadProbe):
    extra_env = True


def _preload_engine(monkeypatch, probe, extra_share: bool):
    import trainer.rollout.vllm_engine as vllm_engine
    from trainer.learn.group import bundle_nodes
    from trainer.placement import plan
    from trainer.rollout.engines import Engines

    monkeypatch.setattr(vllm_engine, "VllmEngine", probe)
    cfg = cfg_of("colocate_all_models=true", "vllm_enable_sleep=true", "actor_num_gpus_per_node=2",
                 "ref_num_gpus_per_node=2", "vllm_num_engines=1", "vllm_tensor_parallel_size=2",
                 "rollout_batch_size=4", "micro_rollout_batch_size=2", "vllm_preload_workers=true",
                 "vllm_in_process=true")
    p = plan(cfg, use_gpus=True)
    pg, ranks = _policy_and_ref(cfg, p)
    if extra_share:  # a quarter more of each bundle held: a host and vLLM's own worker cannot both fit on one
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ranks += [Probe.options(num_cpus=0, num_gpus=0.25, scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=b)).remote() for b in (0, 1)]
        ray.get([r.gpu_ids.remote() for r in ranks[-2:]], timeout=60)
    engines = None
    try:
        engines = Engines(cfg, p, pg, bundle_nodes(pg))
        engines.wait_ready(60)
        report = ray.get(engines.handles[0].preload_report.remote(), timeout=60)
        policy_gpus = sorted(g for r in ranks[:2] for g in ray.get(r.gpu_ids.remote()))
        return report, policy_gpus
    finally:
        _cleanup(engines, ranks, pg)


def test_preloaded_hosts_become_the_tp_workers_vllm_asks_for(fake_gpu_cluster, monkeypatch):
    """Each TP worker the executor creates is the host already on its bundle: built in the host's process
    (which had imported its module first), with the plan's GPU share of that bundle."""
    report, policy_gpus = _preload_engine(monkeypatch, VllmPreloadProbe, extra_share=False)
    assert report["fallbacks"] == []
    assert [i["rank"] for i in report["inits"]] == [0, 1]
    assert [i["pid"] for i in report["inits"]] == [report["host_pids"][0], report["host_pids"][1]]
    assert all(i["preloaded"] for i in report["inits"])
    assert report["gpus"] == policy_gpus  # one worker on each of the policy's two GPUs
    assert set(report["marks"]) == {"workers_imported"}


def test_a_host_that_cannot_stand_for_the_worker_is_killed_before_vllms_own_starts(fake_gpu_cluster, monkeypatch):
    """The executor's workers get a runtime environment the hosts do not have: each host is killed (its GPU
    share freed: with a quarter more of each bundle held, vLLM's own worker could not be placed beside it) and
    the executor's own worker is started in a fresh process, without the preloaded module."""
    report, policy_gpus = _preload_engine(monkeypatch, VllmPreloadMismatchProbe, extra_share=True)
    assert len(report["fallbacks"]) == 2
    assert all("runtime environment for its workers differs" in f for f in report["fallbacks"])
    assert not any(i["preloaded"] for i in report["inits"])
    assert report["gpus"] == policy_gpus
    assert report["marks"] == {}
