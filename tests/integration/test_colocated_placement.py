"""Colocated placement on a GPU cluster, on CPU: Ray is told the machine has 2 GPUs (nothing touches them).

A GPU-only bug (on CPU the engine asks for no GPU): with --colocate_all_models the policy's placement
group holds every GPU (one bundle of 1 GPU per rank; policy and reference ranks take a quarter of a bundle
each), and the rollout engine asked Ray for a quarter GPU outside that group, which never becomes free, so
the job would wait forever before its first step. `trainer.loop.engine_options` puts the engine in the
group's bundles; the first test shows both the old request stranded and the new one placed.
"""

from __future__ import annotations

import os
import shutil

import pytest

pytestmark = pytest.mark.integration

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def fake_gpu_cluster():
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a private throwaway cluster; never the user's ~/.ray token
    temp = f"/tmp/rlrun-colo-{os.getpid()}"
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, _temp_dir=temp, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


@ray.remote
class Probe:
    def gpu_ids(self) -> list:
        return ray.get_runtime_context().get_accelerator_ids()["GPU"]


def _colocated_policy_and_ref():
    """What Trainer builds with --colocate_all_models on 2 GPUs: the policy's group and 2+2 quarter-GPU ranks."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from trainer.actors.group import GroupSpec, reserve

    spec = GroupSpec("policy", 1, 2, use_gpus=True, gpus_per_actor=0.25, cpus_per_actor=1.0)
    pg = reserve(spec, timeout_s=60)
    ranks = []
    for owner in ("policy", "ref"):
        for i in range(2):
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
            ranks.append(Probe.options(num_cpus=1 if owner == "policy" else 0, num_gpus=0.25,
                                       scheduling_strategy=strategy).remote())
    ray.get([r.gpu_ids.remote() for r in ranks], timeout=120)
    return pg, ranks


def test_colocated_engine_gets_a_gpu_share_beside_the_policy(fake_gpu_cluster):
    from trainer.loop import engine_options

    pg, ranks = _colocated_policy_and_ref()
    try:
        # As the old code asked: a quarter GPU anywhere. Every GPU is in the placement group: never scheduled.
        stranded = Probe.options(num_cpus=1.0, num_gpus=0.25).remote()
        ready, _ = ray.wait([stranded.gpu_ids.remote()], timeout=10)
        assert ready == []
        ray.kill(stranded)

        engines = [Probe.options(**engine_options(True, True, 1, pg, 2, i)).remote() for i in range(2)]
        got = ray.get([e.gpu_ids.remote() for e in engines], timeout=60)
        policy_gpus = ray.get([r.gpu_ids.remote() for r in ranks[:2]])
        # engine 0 beside policy rank 1, not rank 0 (the weight sender: NCCL takes no two ranks on one GPU)
        assert got == [policy_gpus[1], policy_gpus[0]]
        assert sorted(g[0] for g in got) == ["0", "1"]
        for e in engines:
            ray.kill(e)
    finally:
        for r in ranks:
            ray.kill(r)
        ray.util.remove_placement_group(pg)


def test_split_engine_takes_a_whole_gpu_of_its_own(fake_gpu_cluster):
    from trainer.actors.group import GroupSpec, reserve
    from trainer.loop import engine_options

    pg = reserve(GroupSpec("policy", 1, 1, use_gpus=True), timeout_s=60)
    try:
        options = engine_options(False, True, 1, pg, 1, 0)
        assert "scheduling_strategy" not in options and options["num_gpus"] == 1.0
        engine = Probe.options(**options).remote()
        assert len(ray.get(engine.gpu_ids.remote(), timeout=60)) == 1
        ray.kill(engine)
    finally:
        ray.util.remove_placement_group(pg)
