"""The placement plan (trainer.placement.plan): what each preset's groups and engines ask for, and proof that
the training loop and rlrun's pre-submit check build from the same plan (they once drifted: the loop used
two constants of its own while the check used ``placement.requests``)."""

from __future__ import annotations

import dataclasses

import pytest

from rlrun import jobcheck
from rlrun import presets as P
from trainer import placement
from trainer.placement import Request


def cfg_of(name: str, *sets: str):
    preset = P.load_preset(name, P.preset_dirs())
    return P.build_config(preset, P.parse_sets(sets), {"workdir": "/w", "reward_url": "http://10.0.0.5:5001/get_reward",
                                                      "retriever_url": "http://{node_ip}:8400/retrieve"})


def test_32b_rloo_colocates_everything_on_the_actors_gpus_and_syncs_in_place():
    p = placement.plan(cfg_of("32b-rloo"), use_gpus=True)
    assert [g.name for g in p.groups] == ["policy", "reference"]
    policy, ref = p.groups
    assert (policy.world_size, policy.gpus_per_actor, policy.in_policy_group) == (8, 0.25, False)
    assert (ref.world_size, ref.gpus_per_actor, ref.in_policy_group) == (8, 0.25, True)
    e = p.engines
    # TP 4 on GPUs: vLLM's Ray executor; the engine actor takes nothing, each TP worker a quarter of its bundle
    assert (e.backend, e.count, e.tp, e.colocated, e.actor_gpus, e.worker_gpus, e.executor) == (
        "vllm", 2, 4, True, 0.0, 0.25, "ray")
    assert [e.bundles(0), e.bundles(1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert e.env(e.bundles(1)) == {"VLLM_RAY_BUNDLE_INDICES": "4,5,6,7", "VLLM_RAY_PER_WORKER_GPUS": "0.25"}
    assert p.weight_transport == "shared"
    # Only the policy's placement group is asked of Ray: everything else lives in its bundles.
    assert p.requests() == [Request("actor 2 x 4", 8, 1.0, 1.0, True, group="policy")]
    on_bundle_5 = [a for a in p.asks() if a.group == "policy" and a.bundle == 5]
    assert sorted((a.who, a.gpu) for a in on_bundle_5) == [
        ("policy rank 5", 0.25), ("reference rank 5", 0.25), ("vLLM engine 1 TP worker 1", 0.25)]
    assert p.overcommitted() == []


def test_the_old_whole_gpu_ask_of_a_tp_worker_is_what_overcommits_a_colocated_bundle():
    """The TP > 1 hang of issue 28: vLLM's default VLLM_RAY_PER_WORKER_GPUS=1 on a bundle the policy and the
    reference already hold half of. The plan's own check names it."""
    p = placement.plan(cfg_of("32b-rloo"), use_gpus=True)
    old = dataclasses.replace(p, engines=dataclasses.replace(p.engines, worker_gpus=1.0))
    problems = old.overcommitted()
    assert len(problems) == 8
    assert problems[0].startswith("policy bundle 0 holds 1 GPU, its asks take 1.5: policy rank 0: GPU: 0.25, CPU: 1")


def test_one_gpu_colocation_puts_the_engine_on_a_quarter_of_bundle_zero():
    cfg = cfg_of("32b-rloo", "actor_num_nodes=1", "actor_num_gpus_per_node=1", "ref_num_nodes=1",
                 "ref_num_gpus_per_node=1", "vllm_num_engines=1", "vllm_tensor_parallel_size=1")
    e = placement.plan(cfg, use_gpus=True).engines
    assert (e.count, e.tp, e.actor_gpus, e.actor_cpus, e.bundles(0), e.executor) == (1, 1, 0.25, 0.0, [0], None)
    assert e.env([0]) == {}


def test_split_placement_gives_each_engine_a_group_of_its_own_gpus_on_one_node():
    cfg = cfg_of("32b-rloo", "colocate_all_models=false", "vllm_enable_sleep=false")
    p = placement.plan(cfg, use_gpus=True)
    assert p.weight_transport == "broadcast"
    assert not any(g.in_policy_group for g in p.groups)
    assert p.requests() == [Request("actor 2 x 4", 8, 1.0, 1.0, True, group="policy"),
                            Request("reference 2 x 4", 8, 1.0, 1.0, True, group="reference"),
                            Request("vLLM engine (TP 4) 1 of 2", 4, 0.25, 1.0, True, True, "engine-0"),
                            Request("vLLM engine (TP 4) 2 of 2", 4, 0.25, 1.0, True, True, "engine-1")]
    pgs = {g.name: g for g in p.placement_groups()}
    assert pgs["engine-1"].strategy == "STRICT_PACK"
    assert [dict(b) for b in pgs["engine-1"].bundles] == [{"CPU": 1.0, "GPU": 1.0}] + [{"GPU": 1.0}] * 3
    e = p.engines
    assert (e.actor_gpus, e.actor_cpus, e.worker_gpus, e.bundles(1)) == (0.0, 1.0, 1.0, [0, 1, 2, 3])
    assert e.env(e.bundles(1))["VLLM_RAY_PER_WORKER_GPUS"] == "1"


def test_without_gpus_ranks_take_a_quarter_cpu_and_the_hf_engine_gets_bytes():
    p = placement.plan(cfg_of("tiny-rloo", "rollout_backend=hf", "vllm_num_engines=0", "enable_prefix_caching=false",
                                  "enforce_eager=false"),
                       use_gpus=False)
    assert all(g.cpus_per_actor == placement.CPU_ONLY_CPUS and not g.use_gpus for g in p.groups)
    assert p.weight_transport == "safetensors"
    assert p.engines.actor_gpus == 0.0 and p.engines.executor is None


def test_ppo_with_gae_adds_a_critic_group():
    p = placement.plan(cfg_of("7b-ppo"), use_gpus=True)
    assert "critic" in [g.name for g in p.groups]


def test_colocated_engines_are_regrouped_by_node_once_ray_has_placed_the_policy():
    # PACK put bundles 0, 2 on node a and 1, 3 on node b: a TP-2 group stays on one node
    assert placement.engine_bundle_groups(["a", "b", "a", "b"], 2, 2) == [[0, 2], [1, 3]]
    assert placement.engine_bundle_groups(["a", "a", "b", "b"], 2, 2) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match=r"Ray placed them 3 on node a, 1 on node b; a TP group must lie on one "
                                         r"node or take whole nodes, and 2 does neither; TP sizes that fit this "
                                         r"placement: 1, 4 "):
        placement.engine_bundle_groups(["a", "a", "a", "b"], 2, 2)


# --- engines wider than a node (seed 003 in small) --------------------------------------------------------
@pytest.mark.parametrize(("nodes", "tp", "groups"), [
    # two nodes of 2: one TP-4 engine on both (the miniature's cross-node shape)
    (["a", "a", "b", "b"], 4, [[0, 1, 2, 3]]),
    # Ray interleaved the bundles: still the whole of both nodes, each node's TP ranks side by side
    (["a", "b", "a", "b"], 4, [[0, 2, 1, 3]]),
    # four nodes of 2, TP 4: two engines of two whole nodes each, in the order of the nodes' first bundles
    (["a", "a", "b", "b", "c", "c", "d", "d"], 4, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    # two nodes of 8, TP 16: one engine over everything
    (["a"] * 8 + ["b"] * 8, 16, [list(range(16))]),
    # 4 + 2 + 2, TP 4: one engine on node a alone, one over b and c
    (["a"] * 4 + ["b"] * 2 + ["c"] * 2, 4, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    # 3 + 1, TP 4: the whole of both
    (["a", "a", "a", "b"], 4, [[0, 1, 2, 3]]),
])
def test_an_engine_wider_than_a_node_takes_whole_nodes(nodes, tp, groups):
    got = placement.engine_bundle_groups(nodes, len(groups), tp)
    assert got == groups
    by_node = {}
    for i, node in enumerate(nodes):
        by_node.setdefault(node, set()).add(i)
    for group in got:  # every node a group touches: all of it, or the group lies on that node alone
        touched = {nodes[i] for i in group}
        assert len(touched) == 1 or all(by_node[n] <= set(group) for n in touched), group


@pytest.mark.parametrize(("counts", "tp", "fits"), [
    ([3, 3, 2], 4, [1, 8]),  # node a would share an engine with b while holding part of another: refused
    ([4, 2], 4, [1, 2, 6]),  # 2 left over on b, no node to complete it with
    ([2, 2, 2], 4, [1, 2, 6]),
    ([8, 8], 3, [1, 2, 4, 8, 16]),  # 3 divides no node and no whole-node sum
])
def test_a_tp_size_that_cannot_be_formed_is_refused_naming_what_would_fit(counts, tp, fits):
    nodes = [name for name, n in zip("abcdefgh"[:len(counts)], counts, strict=True) for _ in range(n)]
    line = f"TP sizes that fit this placement: {', '.join(map(str, fits))} "
    with pytest.raises(ValueError) as err:
        placement.engine_bundle_groups(nodes, sum(counts) // tp or 1, tp)
    assert line in str(err.value) and "\n" not in str(err.value)
    assert placement.tp_sizes_that_fit(counts) == fits
    assert placement.engine_groups_problem(counts, tp) is not None
    for ok in fits:  # and each size it names does form its groups
        assert placement.engine_groups_problem(counts, ok) is None
        assert len(placement.engine_bundle_groups(nodes, sum(counts) // ok, ok)) == sum(counts) // ok


def test_a_split_engine_wider_than_any_node_spreads_its_group_over_nodes():
    cfg = cfg_of("tiny-rloo", "actor_num_gpus_per_node=2", "ref_num_gpus_per_node=2", "vllm_tensor_parallel_size=4",
                 "rollout_batch_size=8", "train_batch_size=16", "micro_rollout_batch_size=4",
                 "micro_train_batch_size=8")
    assert not cfg.colocate_all_models
    wide = placement.plan(cfg, True, node_gpus=2)
    (engine,) = [pg for pg in wide.placement_groups() if pg.name == "engine-0"]
    assert engine.strategy == "PACK" and len(engine.bundles) == 4 and wide.engines.spans_nodes
    # on nodes of 4 GPUs (or when the cluster is not known) the same engine stays on one node
    for node_gpus in (4, 8, None):
        narrow = placement.plan(cfg, True, node_gpus=node_gpus)
        (engine,) = [pg for pg in narrow.placement_groups() if pg.name == "engine-0"]
        assert engine.strategy == "STRICT_PACK" and not narrow.engines.spans_nodes
    _check_plan(wide, "split TP 4 over nodes of 2")
    # rlrun's check places it over two nodes of 2 free GPUs, which a STRICT_PACK group could not use
    two_by_four = (jobcheck.NodeView("10.0.0.1", 64, 4, True), jobcheck.NodeView("10.0.0.2", 64, 4))
    placed = {}
    assert jobcheck.place(two_by_four, wide.requests(), placed) == []
    assert sorted(placed["engine-0"].values()) == [2, 2]


# --- every ask fits its bundle: every preset and a grid of shapes ----------------------------------------
def _grid():
    """(name, sets) of job shapes: nodes x GPUs, engines x TP, colocated or split, with and without a reference
    and a critic, vLLM and HF engines. Shapes the config's rules refuse are skipped by the test (and counted)."""
    out = []
    for nodes in (1, 2, 4):
        for per_node in (1, 2, 4, 8):
            world = nodes * per_node
            for tp in (1, 2, 4, 8):
                for colocate in (True, False):
                    engines = world // tp if colocate else max(1, world // (2 * tp))
                    if engines < 1 or (colocate and world % tp):
                        continue
                    for algo in ("rloo", "rloo-nokl", "gae"):
                        sets = [f"actor_num_nodes={nodes}", f"actor_num_gpus_per_node={per_node}",
                                f"vllm_num_engines={engines}", f"vllm_tensor_parallel_size={tp}",
                                f"colocate_all_models={str(colocate).lower()}",
                                f"vllm_enable_sleep={str(colocate).lower()}",
                                f"rollout_batch_size={8 * world}", f"train_batch_size={8 * world}",
                                "micro_rollout_batch_size=1", "micro_train_batch_size=1"]
                        if algo != "rloo-nokl":
                            sets += [f"ref_num_nodes={nodes}", f"ref_num_gpus_per_node={per_node}"]
                        if algo == "gae":
                            sets += ["advantage_estimator=gae", "critic_pretrain=/m", f"critic_num_nodes={nodes}",
                                     f"critic_num_gpus_per_node={per_node}"]
                        if algo == "rloo-nokl":  # no reference: its flags back to their defaults
                            sets += ["init_kl_coef=0", "ref_num_nodes=1", "ref_num_gpus_per_node=8"]
                        out.append((f"{nodes}x{per_node} {engines}xTP{tp} {'colo' if colocate else 'split'} {algo}",
                                    sets))
    return out


def _check_plan(p, label):
    assert p.overcommitted() == [], label
    groups = {g.name: g for g in p.placement_groups()}
    e = p.engines
    for i in range(e.count):
        bundles = e.bundles(i)
        group = groups[e.placement_group(i)]
        assert all(b < len(group.bundles) for b in bundles), label
        if e.executor == "ray":
            # what vLLM's Ray executor will ask: from the same env the engine actor gets
            env = e.env(bundles)
            assert [int(x) for x in env["VLLM_RAY_BUNDLE_INDICES"].split(",")] == bundles, label
            workers = [a for a in p.asks() if a.who.startswith(f"vLLM engine {i} TP worker")]
            assert [a.bundle for a in workers] == bundles and all(
                a.gpu == float(env["VLLM_RAY_PER_WORKER_GPUS"]) for a in workers), label
            assert all(group.bundles[b].get("GPU", 0) >= 1 for b in bundles), label  # vLLM counts GPU bundles
    # rlrun's check places exactly these groups: a cluster of exactly the asked size passes, one GPU less fails
    if p.use_gpus:
        need_gpu = sum(r.count * r.gpu for r in p.requests())
        assert need_gpu == (p.groups[0].world_size if e.colocated else
                            sum(g.world_size for g in p.groups) + e.count * e.tp), label


@pytest.mark.parametrize("use_gpus", [True, False], ids=["gpus", "cpus"])
def test_every_ask_of_every_preset_fits_its_bundle(use_gpus):
    names = sorted(P.discover(P.preset_dirs()))
    assert len(names) >= 8
    for name in names:
        _check_plan(placement.plan(cfg_of(name), use_gpus), name)


def test_every_ask_of_a_grid_of_shapes_fits_its_bundle_and_the_check_places_the_groups():
    planned = refused = 0
    for label, sets in _grid():
        try:
            cfg = cfg_of("tiny-rloo", *sets)
        except P.PresetError:
            refused += 1
            continue
        for use_gpus in (True, False):
            _check_plan(placement.plan(cfg, use_gpus), f"{label} gpus={use_gpus}")
        # on GPUs: one node of exactly the GPUs the groups ask for holds the job; one GPU less does not
        p = placement.plan(cfg, True)
        need = sum(r.count * r.gpu for r in p.requests())
        exact = (jobcheck.NodeView("10.0.0.1", 1024, need, True),)
        assert jobcheck.place(exact, p.requests()) == [], label
        short = (jobcheck.NodeView("10.0.0.1", 1024, need - 1, True),)
        assert jobcheck.place(short, p.requests()), label
        planned += 1
    assert planned >= 100 and refused < planned / 4, (planned, refused)


# --- one plan, two users ----------------------------------------------------------------------------------
@pytest.fixture()
def odd_plan(monkeypatch):
    """A plan no config gives: the policy asks for 3 GPUs a node. Whoever builds from trainer.placement.plan
    sees it; whoever computes placement on its own does not."""
    real = placement.plan

    def odd(cfg, use_gpus, node_gpus=None):
        p = real(cfg, use_gpus, node_gpus)
        policy = dataclasses.replace(p.groups[0], gpus_per_node=3)
        return dataclasses.replace(p, groups=(policy, *p.groups[1:]))

    import trainer.loop as loop

    # Every module that imported the name: the loop imported before this fixture ran (any earlier test's
    # import) holds the real function otherwise.
    for module in (placement, jobcheck, loop):
        monkeypatch.setattr(module, "plan", odd)
    return odd


def test_rluns_check_places_what_the_plan_asks(odd_plan):
    cfg = cfg_of("32b-rloo", "colocate_all_models=false", "vllm_enable_sleep=false")
    view = jobcheck.ClusterView((jobcheck.NodeView("10.0.0.5", 64, 8, True),), {}, "x", {})
    report = jobcheck.check(cfg, view, expects_gpus=True)
    assert any("actor 2 x 3: 6 x 1" in line for line in report.lines), report.lines


def test_the_loop_builds_its_groups_from_the_plan(odd_plan, monkeypatch):
    """Trainer._group reads only the plan (no Ray: the group class records)."""
    from types import SimpleNamespace

    import trainer.loop as loop

    built = []

    class RecordingGroup:
        def __init__(self, cls, spec, pg=None, **deadlines):
            built.append((spec, pg))
            self.pg = "policy-pg"

    monkeypatch.setattr(loop, "ActorGroup", RecordingGroup)
    cfg = cfg_of("32b-rloo", "colocate_all_models=false", "vllm_enable_sleep=false")
    p = loop.plan(cfg, True)  # what Trainer.__init__ calls
    fake = SimpleNamespace(cfg=cfg, plan=p, policy=None)  # noqa: F841 (Trainer._group reads these)
    fake.policy = loop.Trainer._group(fake, object, p.group("policy"))
    loop.Trainer._group(fake, object, p.group("reference"))
    assert [(s.name, s.num_nodes, s.gpus_per_node, pg) for s, pg in built] == [
        ("policy", 2, 3, None), ("reference", 2, 4, None)]


def test_models_empty_their_caches_only_when_an_engine_would_not_fit():
    """The rule before sleeping engines wake (trainer.rollout.memory.needs_room): emptying the allocators' caches
    costs the next step its allocations, so only when a GPU lacks the room its engines freed."""
    from trainer.rollout.memory import WAKE_MARGIN, needs_room

    gib = 2**30
    a, b = "gpu:a", "gpu:b"
    assert not needs_room([(a, 60 * gib), (b, 55 * gib)], {a: 40 * gib, b: 40 * gib})  # room on every GPU
    assert needs_room([(a, 60 * gib), (b, 41 * gib)], {a: 40 * gib, b: 40 * gib})  # one GPU short of the margin
    assert needs_room([(a, int(WAKE_MARGIN * 40 * gib) - 1)], {a: 40 * gib})
    assert not needs_room([(a, int(WAKE_MARGIN * 40 * gib))], {a: 40 * gib})
    assert not needs_room([("", 0), ("", 0)], {})  # no GPUs, nothing asleep
    assert not needs_room([], {a: 40 * gib})
    # Only the GPU an engine sleeps on needs room; a rank on another GPU with little free memory does not count.
    assert not needs_room([(a, 50 * gib), (b, 1 * gib)], {a: 40 * gib})
    # Two engines asleep on one GPU need room for both: 50 GiB free is enough for one 25 GiB engine, not two.
    assert not needs_room([(a, 50 * gib)], {a: 25 * gib})
    assert needs_room([(a, 50 * gib)], {a: 50 * gib})


def test_the_engines_sum_what_engines_on_one_gpu_freed(monkeypatch):
    """Engines.sleep adds up the per-GPU bytes each engine's sleep freed (two engines on one GPU both need
    their memory back), from each engine's before/after device readings."""
    from types import SimpleNamespace

    from trainer.rollout.engines import Engines
    from trainer.rollout.vllm_engine import freed_per_device

    gib = 2**30
    # A tensor-parallel engine on two GPUs, read before and after its sleep.
    before = [{"device": "gpu:a", "free": 10 * gib}, {"device": "gpu:b", "free": 12 * gib}]
    after = [{"device": "gpu:a", "free": 30 * gib}, {"device": "gpu:b", "free": 12 * gib}]
    assert freed_per_device(before, after) == {"gpu:a": 20 * gib, "gpu:b": 0}

    class Engine:
        def __init__(self, freed):
            self.sleep = SimpleNamespace(remote=lambda: freed)

    fake = SimpleNamespace(handles=[Engine({"gpu:a": 20 * gib}), Engine({"gpu:a": 15 * gib, "gpu:b": 5 * gib})],
                           cfg=SimpleNamespace(generate_timeout=60.0))
    # Engines.call: each engine's result by index, as Ray would hand them back (its faults: test_engine_faults)
    fake.call = lambda method, calls, *_, **__: {i: getattr(fake.handles[i], method).remote() for i in calls}
    assert Engines.sleep(fake) == {"gpu:a": 35 * gib, "gpu:b": 5 * gib}


# --- what an engine is started with beyond the plan -------------------------------------------------------
def test_an_engine_over_several_nodes_goes_without_custom_all_reduce():
    from trainer.rollout.engines import span_kwargs

    assert span_kwargs(["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"]) == {"disable_custom_all_reduce": True}
    assert span_kwargs(["10.0.0.1", "10.0.0.1"]) == {}
    assert span_kwargs(["?"]) == {}


def test_vllm_in_process_reaches_every_engine_and_is_left_to_the_platform_otherwise():
    from trainer.rollout.engines import vllm_kwargs

    cfg = cfg_of("32b-rloo")
    assert "in_process" not in vllm_kwargs(cfg, placement.plan(cfg, use_gpus=True))  # GPU: a spawned core
    cfg = cfg_of("32b-rloo", "vllm_in_process=true")
    kwargs = vllm_kwargs(cfg, placement.plan(cfg, use_gpus=True))
    assert kwargs["in_process"] is True and kwargs["tensor_parallel_size"] == 4


def test_a_cuda_graph_mode_reaches_every_engine_beside_the_largest_graph():
    from trainer.rollout.engines import vllm_kwargs

    cfg = cfg_of("32b-rloo")
    auto = vllm_kwargs(cfg, placement.plan(cfg, use_gpus=True))
    assert "cudagraph_mode" not in auto  # vLLM's own
    assert auto["compilation_config"] == {"max_cudagraph_capture_size": auto["max_num_seqs"]}
    for mode in ("full_decode_only", "piecewise"):
        cfg = cfg_of("32b-rloo", f"vllm_cudagraph_mode={mode}")
        kwargs = vllm_kwargs(cfg, placement.plan(cfg, use_gpus=True))
        assert kwargs["cudagraph_mode"] == mode and kwargs["compilation_config"] == auto["compilation_config"]


def test_the_kernel_prewarm_reaches_every_engine_with_the_jobs_sampling():
    from trainer.rollout.engines import vllm_kwargs

    cfg = cfg_of("32b-rloo")
    assert "prewarm_sampling" not in vllm_kwargs(cfg, placement.plan(cfg, use_gpus=True))
    cfg = cfg_of("32b-rloo", "vllm_prewarm_kernels=true", "top_p=0.95", "temperature=0.7")
    kwargs = vllm_kwargs(cfg, placement.plan(cfg, use_gpus=True))
    assert kwargs["prewarm_sampling"] == {"n": cfg.n_samples_per_prompt, "temperature": 0.7, "top_p": 0.95}


@pytest.mark.parametrize("preset", ["32b-rloo", "7b-ppo", "tiny-rloo"])
def test_the_drivers_kernel_prewarm_compiles_for_the_engines_it_runs_before(preset):
    """trainer.loop.head_prewarm's spec (engines.prewarm_spec) is the one each engine builds from what it is
    started with (vllm_kwargs, split as VllmEngine's signature splits it): the same marker, the same kernels."""
    import inspect

    from trainer.rollout import kernel_prewarm
    from trainer.rollout.engines import prewarm_spec, vllm_kwargs
    from trainer.rollout.vllm_engine import VllmEngine

    assert prewarm_spec(cfg_of(preset), placement.plan(cfg_of(preset), use_gpus=True)) is None
    cfg = cfg_of(preset, "vllm_prewarm_kernels=true", "top_p=0.9")
    p = placement.plan(cfg, use_gpus=True)
    bound = inspect.signature(VllmEngine.__init__).bind(None, cfg.pretrain, **vllm_kwargs(cfg, p))
    bound.apply_defaults()
    a = bound.arguments
    engine = kernel_prewarm.engine_spec(a["model_path"], a["dtype"], a["llm_kwargs"], a["enable_prefix_caching"],
                                        a["seed"], a["prewarm_sampling"])
    assert prewarm_spec(cfg, p) == kernel_prewarm.check_spec(engine)
    assert engine["max_num_seqs"] == vllm_kwargs(cfg, p)["max_num_seqs"] and engine["sampling"]["top_p"] == 0.9


def test_a_compile_mode_reaches_every_engine_and_becomes_vllms_compilation_config():
    """--vllm_compile: inductor (the default) adds nothing; dynamo is vLLM's compile backend eager; none is no
    torch.compile with whole CUDA graphs for the decode steps only (vLLM would make its default full, which
    computes wrong log-probs for prefills on 0.26), or the CUDA-graph mode asked; the conflicts are refused."""
    from trainer.rollout.engines import vllm_kwargs
    from trainer.rollout.vllm_engine import compile_config

    cfg = cfg_of("32b-rloo")
    assert "compile_mode" not in vllm_kwargs(cfg, placement.plan(cfg, use_gpus=True))
    for mode in ("dynamo", "none"):
        cfg = cfg_of("32b-rloo", f"vllm_compile={mode}")
        assert vllm_kwargs(cfg, placement.plan(cfg, use_gpus=True))["compile_mode"] == mode
    assert compile_config("inductor") == {}
    assert compile_config("dynamo", "piecewise") == {"backend": "eager"}
    assert compile_config("none") == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    assert compile_config("none", "none") == {"mode": 0, "cudagraph_mode": "NONE"}
    with pytest.raises(ValueError, match="'none' with cudagraph_mode 'full_and_piecewise': piecewise CUDA graphs"):
        compile_config("none", "full_and_piecewise")
    with pytest.raises(ValueError, match="'dynamo' with enforce_eager: eager engines compile nothing"):
        compile_config("dynamo", enforce_eager=True)
    with pytest.raises(ValueError, match="compile_mode 'fast': expected one of inductor, dynamo, none"):
        compile_config("fast")


def test_cuda_graph_modes_are_vllms_own_and_eager_engines_take_none():
    from trainer.rollout.vllm_engine import check_cudagraph_mode

    for mode in ("full", "full_and_piecewise", "piecewise", "full_decode_only", "none"):
        check_cudagraph_mode(mode)
    check_cudagraph_mode("none", enforce_eager=True)
    with pytest.raises(ValueError, match="'fast' is not one of vLLM's: expected one of full_and_piecewise, full,"):
        check_cudagraph_mode("fast")
    with pytest.raises(ValueError, match="'full' with enforce_eager: eager means no CUDA graphs"):
        check_cudagraph_mode("full", enforce_eager=True)


def test_engines_on_one_node_search_their_ports_from_stretches_of_their_own():
    from trainer.rollout.engines import engine_ports

    # 4 engines of TP 1 on one node (7b-ppo on 4 GPUs), the miniature's range 9730-9749: vLLM's half is 10 ports
    assert engine_ports(["a"] * 4, (9730, 9749)) == [9730, 9732, 9734, 9736]
    # two nodes of 8 engines (7b-ppo as the seed runs it), the default range 8120-8199: per node, not per job
    ports = engine_ports(["a"] * 8 + ["b"] * 8, (8120, 8199))
    assert ports[:8] == ports[8:] == [8120 + 5 * k for k in range(8)]
    assert len(set(ports[:8])) == 8 and max(ports) < 8160  # the top half stays the trainer's stores'
    # more engines on a node than ports in vLLM's half: each still starts its search at a port of its own
    assert engine_ports(["a"] * 3, (9000, 9001)) == [9000, 9001, 9002]
    assert engine_ports(["a", "b"], None) == [None, None]


def test_the_rendezvous_range_is_read_once_for_the_stores_and_the_engines(monkeypatch):
    from trainer.learn.group import RENDEZVOUS_PORTS_ENV, rendezvous_range

    monkeypatch.setenv(RENDEZVOUS_PORTS_ENV, "8120-8199")
    assert rendezvous_range() == (8120, 8199)
    monkeypatch.delenv(RENDEZVOUS_PORTS_ENV)
    assert rendezvous_range() is None
    with pytest.raises(RuntimeError, match=r"RLRUN_RENDEZVOUS_PORTS='8199-8120': expected FIRST-LAST"):
        rendezvous_range("8199-8120")
