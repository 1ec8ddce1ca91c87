"""Checks of a job against a described cluster (no cluster needed): placement arithmetic per node,
reward health, model and data paths, the DeepSpeed ops an --adam_offload job loads."""

from __future__ import annotations

import pytest

from rlrun import presets as P
from rlrun.jobcheck import ClusterView, NodeView, check, classify, job_ops, probe_request
from rlrun.jobs import DEFAULT_EXCLUDES

REWARD = "http://10.0.0.5:5001/get_reward"
TWO_BY_EIGHT = (NodeView("10.0.0.5", 64, 8, is_head=True), NodeView("10.0.0.4", 64, 8))
ONE_MACHINE = (NodeView("127.0.0.2", 2, 0, is_head=True),)


def job(name: str, *sets: str, workdir="/w"):
    preset = P.load_preset(name, P.preset_dirs())
    cfg = P.build_config(preset, P.parse_sets(sets), {"workdir": str(workdir), "reward_url": REWARD})
    return cfg, preset.hardware.accelerator == "gpu"


def healthy(nodes, missing=None) -> ClusterView:
    return ClusterView(nodes, {REWARD: "ok"}, "the head 10.0.0.5", {} if missing is None else missing)


def flat(report) -> str:
    return "\n".join(report.lines + report.problems + report.notes)


@pytest.mark.parametrize("name", ["1.5b-grpo", "32b-rloo", "32b-rloo-1node", "7b-ppo", "qwen2-7b-ppo", "tiny-ppo", "tiny-rloo"])
def test_every_preset_fits_a_two_by_eight_gpu_cluster(name):
    cfg, gpus = job(name)
    report = check(cfg, healthy(TWO_BY_EIGHT), expects_gpus=gpus)
    assert report.ok, report.problems
    assert any(line.startswith("GPUs: actor") and line.endswith("the cluster has 16") for line in report.lines)
    assert f"reward service {REWARD}: ok (asked from the head 10.0.0.5)" in report.lines


def test_32b_rloo_on_the_one_machine_cluster_is_refused_with_the_gpu_arithmetic():
    cfg, gpus = job("32b-rloo")
    report = check(cfg, healthy(ONE_MACHINE), expects_gpus=gpus)
    assert report.problems[0] == (
        "not enough GPUs: actor 2 x 4 = 8 (with reference 2 x 4 = 8, vLLM 2 engines x TP 4 = 8 on the actor's "
        "GPUs: --colocate_all_models) = 8 GPUs needed, the cluster has 0 (1 node (127.0.0.2 (head): 0 GPUs 2 CPUs))")
    # Colocated engines live on the actor's bundles (trainer.placement): only the actor's CPUs count.
    assert report.problems[1].startswith("not enough CPUs: actor 2 x 4: 8 x 1 = 8 CPUs")


def test_the_one_node_32b_variant_fits_one_node_of_four_gpus_and_its_engine_spans_them():
    cfg, gpus = job("32b-rloo-1node")
    report = check(cfg, healthy((NodeView("10.0.0.5", 64, 4, True),)), expects_gpus=gpus)
    assert report.ok, report.problems
    assert "GPUs: actor 1 x 4 = 4 (with reference 1 x 4 = 4, vLLM 1 engines x TP 4 = 4 on the actor's GPUs: " \
           "--colocate_all_models); needs 4, the cluster has 4" in report.lines
    assert not any("spans nodes" in n for n in report.notes)


def test_colocation_fits_one_node_of_eight_with_a_note_on_the_layout():
    cfg, gpus = job("32b-rloo")
    report = check(cfg, healthy((NodeView("10.0.0.5", 64, 8, True),)), expects_gpus=gpus)
    assert report.ok, report.problems
    assert any("--actor_num_nodes 2 x --actor_num_gpus_per_node 4: the cluster has 1 nodes" in n for n in report.notes)


def test_without_colocation_every_group_needs_its_own_gpus():
    cfg, gpus = job("32b-rloo", "colocate_all_models=false", "vllm_enable_sleep=false")
    report = check(cfg, healthy(TWO_BY_EIGHT), expects_gpus=gpus)
    assert report.problems == [
        "not enough GPUs: actor 2 x 4 = 8 + reference 2 x 4 = 8 + vLLM 2 engines x TP 4 = 8 = 24 GPUs needed, "
        "the cluster has 16 (2 nodes (10.0.0.5 (head): 8 GPUs 64 CPUs, 10.0.0.4: 8 GPUs 64 CPUs))"]


def test_enough_gpus_in_total_but_an_engine_does_not_fit_on_one_node():
    # actor 6 + reference 6 + 1 engine of TP 4 = 16 GPUs, but the groups leave 2 + 2 free on the two nodes
    cfg, gpus = job("tiny-rloo", "actor_num_gpus_per_node=6", "ref_num_gpus_per_node=6",
                    "vllm_tensor_parallel_size=4", "rollout_batch_size=12", "train_batch_size=48",
                    "micro_rollout_batch_size=4", "micro_train_batch_size=8")
    report = check(cfg, healthy(TWO_BY_EIGHT), expects_gpus=gpus)
    # the engine's placement group: 4 bundles of 1 GPU on one node (its actor's CPU in the first)
    assert report.problems == [
        "vLLM engine (TP 4) 1 of 1: 4 bundles (4 GPU + 1 CPU in all) must share one node; none has room, free "
        "then: 10.0.0.5: 2 GPUs 58 CPUs, 10.0.0.4: 2 GPUs 58 CPUs"]


def test_an_engine_wider_than_any_node_spans_whole_nodes_with_a_note():
    # seed 003 in small: 2 engines of TP 8 on the actor's 16 GPUs over four nodes of 4, each engine on two nodes
    cfg, gpus = job("1.5b-grpo", "vllm_num_engines=2", "vllm_tensor_parallel_size=8")
    nodes = tuple(NodeView(f"10.0.0.{i}", 32, 4) for i in range(4))
    report = check(cfg, healthy(nodes), expects_gpus=gpus)
    assert report.ok, report.problems
    assert ("each vLLM engine of TP 8 spans nodes (the largest node has 4 GPUs): its tensor-parallel all-reduces "
            "cross the network between them") in report.notes


def test_the_miniature_cross_node_engine_is_accepted():
    # the two-node miniature of bench/gpu/miniature (2 x 2 GPUs), one engine of TP 4 over both
    cfg, gpus = job("32b-rloo", "actor_num_gpus_per_node=2", "ref_num_gpus_per_node=2", "vllm_num_engines=1",
                    "rollout_batch_size=16", "micro_train_batch_size=8")
    report = check(cfg, healthy((NodeView("127.0.0.7", 8, 2, True), NodeView("127.0.0.8", 8, 2))), expects_gpus=gpus)
    assert report.ok, report.problems
    assert any(n.startswith("each vLLM engine of TP 4 spans nodes") for n in report.notes)


def test_the_two_gpu_miniature_engine_spans_its_nodes_with_its_workers_preloaded():
    # bench/gpu/miniature/inventory-x2 (two nodes of ONE GPU: stage xnode2), one engine of TP 2 over both with
    # --vllm_preload_workers (and the in-process core it needs): a GPU cluster takes the flag; its note says the
    # TP group crosses the nodes
    cfg, gpus = job("32b-rloo", "actor_num_gpus_per_node=1", "ref_num_gpus_per_node=1", "vllm_num_engines=1",
                    "vllm_tensor_parallel_size=2", "vllm_preload_workers=true", "vllm_in_process=true",
                    "rollout_batch_size=16", "micro_train_batch_size=8")
    assert cfg.vllm_preload_workers
    report = check(cfg, healthy((NodeView("127.0.0.7", 16, 1, True), NodeView("127.0.0.8", 16, 1))),
                   expects_gpus=gpus)
    assert report.ok, report.problems
    assert any(n.startswith("each vLLM engine of TP 2 spans nodes") for n in report.notes), report.notes


def test_a_tp_size_that_cannot_be_placed_is_refused_before_submit_in_one_line():
    # the actor's 6 ranks land 3 + 3 on two nodes of 3 GPUs: TP 2 groups would straddle a node, TP 6 would not
    cfg, gpus = job("32b-rloo", "actor_num_gpus_per_node=3", "ref_num_gpus_per_node=3", "vllm_num_engines=3",
                    "vllm_tensor_parallel_size=2", "rollout_batch_size=12", "train_batch_size=48",
                    "micro_train_batch_size=2", "micro_rollout_batch_size=4")
    report = check(cfg, healthy((NodeView("10.0.0.5", 8, 3, True), NodeView("10.0.0.4", 8, 3))), expects_gpus=gpus)
    assert report.problems == [
        "vLLM engines of TP 2 on the actor's GPUs: the actor's ranks would land 3 on 10.0.0.5 + 3 on 10.0.0.4; a TP "
        "group must lie on one node or take whole nodes, and 2 does neither; TP sizes that fit this placement: 1, "
        "3, 6 (or place the actor so that each node holds a multiple of 2 ranks)"]


def test_a_group_that_fits_in_total_but_not_in_free_bundles_is_refused():
    # 16 actor bundles of {GPU 1, CPU 1}: the node with 4 CPUs holds 4 of its 8 GPUs' bundles, so only 12 fit
    cfg, gpus = job("1.5b-grpo")
    nodes = (NodeView("10.0.0.5", 40, 8, True), NodeView("10.0.0.4", 4, 8))
    report = check(cfg, healthy(nodes), expects_gpus=gpus)
    assert report.problems == ["actor 2 x 8: 16 bundles of {1 GPU + 1 CPU} do not fit, only 12 do; free then: "
                               "10.0.0.5: 8 GPUs 40 CPUs, 10.0.0.4: 8 GPUs 4 CPUs"]


def test_cpu_cluster_counts_a_quarter_cpu_per_rank_and_engine():
    cfg, gpus = job("tiny-ppo")
    assert check(cfg, healthy(ONE_MACHINE), expects_gpus=gpus).ok
    report = check(cfg, healthy((NodeView("127.0.0.6", 0.5, 0, True),)), expects_gpus=gpus)
    assert report.problems[0].startswith(
        "not enough CPUs: actor 1 x 1: 1 x 0.25 + reference 1 x 1: 1 x 0.25 + critic 1 x 1: 1 x 0.25 + vLLM engine "
        "(TP 1) 1 of 1: 1 x 0.25 = 1 CPUs of Ray resources needed (a rank or engine takes 0.25), the cluster has 0.5")


@pytest.mark.parametrize("flag", ["use_liger_kernel", "flash_attn", "vllm_prewarm_kernels"])
def test_a_gpu_kernel_flag_on_a_cpu_cluster_is_refused_before_submit(flag):
    cfg, gpus = job("tiny-rloo", f"{flag}=true")
    report = check(cfg, healthy(ONE_MACHINE), expects_gpus=gpus)
    assert report.problems == [f"--{flag} needs CUDA GPUs and the cluster has none (1 node (127.0.0.2 (head): "
                               f"0 GPUs 2 CPUs)): drop it (--set {flag}=false) or run on GPU nodes"]
    # on GPUs the flag is the nodes' business (the package), not the placement's
    assert check(cfg, healthy(TWO_BY_EIGHT), expects_gpus=True).ok


def test_preloaded_tp_workers_on_a_cpu_cluster_are_refused_before_submit():
    """--vllm_preload_workers acts on vLLM's Ray executor, which only GPU engines of TP > 1 run: on a cluster
    without GPUs it would be accepted and do nothing."""
    cfg, gpus = job("tiny-rloo", "vllm_tensor_parallel_size=2", "vllm_preload_workers=true", "vllm_in_process=true")
    report = check(cfg, healthy(ONE_MACHINE), expects_gpus=gpus)
    assert "--vllm_preload_workers needs CUDA GPUs and the cluster has none" in "\n".join(report.problems)
    assert not any("preload" in p for p in check(cfg, healthy(TWO_BY_EIGHT), expects_gpus=True).problems)


def test_a_cuda_graph_mode_on_a_cpu_cluster_is_refused_before_submit():
    cfg, gpus = job("tiny-rloo", "vllm_cudagraph_mode=piecewise", "enforce_eager=false")
    report = check(cfg, healthy(ONE_MACHINE), expects_gpus=gpus)
    assert report.problems == ["--vllm_cudagraph_mode piecewise needs CUDA GPUs and the cluster has none (1 node "
                               "(127.0.0.2 (head): 0 GPUs 2 CPUs)): drop it (--set vllm_cudagraph_mode=auto) or run "
                               "on GPU nodes"]
    assert check(cfg, healthy(TWO_BY_EIGHT), expects_gpus=True).ok
    assert check(job("tiny-rloo")[0], healthy(ONE_MACHINE), expects_gpus=gpus).ok  # auto: nothing to refuse


def test_a_cpu_preset_on_a_gpu_cluster_is_placed_on_gpus_as_the_trainer_does():
    cfg, gpus = job("tiny-rloo")
    report = check(cfg, healthy((NodeView("10.0.0.5", 4, 2, True),)), expects_gpus=gpus)
    assert report.problems == ["not enough GPUs: actor 1 x 1 = 1 + reference 1 x 1 = 1 + vLLM 1 engines x TP 1 = 1 "
                               "= 3 GPUs needed, the cluster has 2 (1 node (10.0.0.5 (head): 2 GPUs 4 CPUs))"]


def test_an_unhealthy_reward_service_is_refused():
    cfg, gpus = job("tiny-rloo")
    view = ClusterView(ONE_MACHINE, {REWARD: "unreachable (URLError: [Errno 111] Connection refused)"},
                       "the head 127.0.0.2", {})
    report = check(cfg, view, expects_gpus=gpus)
    assert report.problems == [f"reward service {REWARD}: unreachable (URLError: [Errno 111] Connection refused) "
                               "(asked from the head 127.0.0.2); the trainer checks it at start and would stop "
                               "there (`rlrun status` shows the inventory's reward services)"]


def test_a_model_missing_on_one_node_is_refused_naming_the_node():
    cfg, gpus = job("32b-rloo")
    view = healthy(TWO_BY_EIGHT, missing={cfg.pretrain: ("10.0.0.4",)})
    report = check(cfg, view, expects_gpus=gpus)
    assert report.problems == [f"--pretrain {cfg.pretrain} does not exist on 10.0.0.4 (it must be on every node; "
                               "copy it there or --set pretrain=PATH_ON_THE_NODES)"]
    assert f"--prompt_data {cfg.prompt_data}: present on the head (the driver reads it)" in report.lines


def test_paths_are_only_noted_when_the_nodes_were_not_looked_at():
    cfg, gpus = job("32b-rloo")
    report = check(cfg, ClusterView(TWO_BY_EIGHT, {REWARD: "ok"}, "this machine", None), expects_gpus=gpus)
    assert report.ok
    assert f"--pretrain {cfg.pretrain}: not looked for on the nodes" in report.notes


def test_a_relative_model_must_be_uploaded_with_the_working_dir(tmp_path):
    (tmp_path / "build" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m").mkdir(parents=True)
    excluded, _ = job("tiny-rloo", "pretrain=build/m", workdir=tmp_path)
    report = check(excluded, healthy(ONE_MACHINE), workdir=tmp_path, excludes=DEFAULT_EXCLUDES)
    assert report.problems == ["--pretrain build/m: in the working dir, but the upload leaves it out (excluded "
                               "pattern); keep it on the nodes and give an absolute path"]
    uploaded, _ = job("tiny-rloo", "pretrain=models/m", workdir=tmp_path)
    report = check(uploaded, healthy(ONE_MACHINE), workdir=tmp_path, excludes=DEFAULT_EXCLUDES)
    assert report.ok and "--pretrain models/m: uploaded with the working dir" in report.lines
    gone, _ = job("tiny-rloo", "pretrain=./nope", workdir=tmp_path)
    report = check(gone, healthy(ONE_MACHINE), workdir=tmp_path, excludes=DEFAULT_EXCLUDES)
    assert report.problems == [f"--pretrain ./nope: not in the working dir {tmp_path}"]


def test_hub_ids_are_noted_not_refused_and_probed_in_the_cache():
    cfg, gpus = job("7b-ppo")
    assert classify("Qwen/Qwen2.5-7B", None) == "hub" and classify("/data/x", None) == "absolute"
    assert probe_request(cfg, None) == {"paths": [], "head_paths": ["/data/nq_search/train.parquet"],
                                        "hub_ids": ["Qwen/Qwen2.5-7B"], "reward_urls": [REWARD]}
    report = check(cfg, healthy(TWO_BY_EIGHT, missing={"Qwen/Qwen2.5-7B": ("10.0.0.4",)}), expects_gpus=gpus)
    assert report.ok
    assert ("--pretrain Qwen/Qwen2.5-7B: a hub id, fetched by the job; not in the Hugging Face cache of 10.0.0.4 "
            "(needs the hub from the nodes)") in report.notes


def test_no_alive_node_is_a_problem():
    cfg, gpus = job("tiny-rloo")
    assert check(cfg, ClusterView(()), expects_gpus=gpus).problems == ["the cluster has no alive node"]


# --- DeepSpeed ops: --adam_offload loads cpu_adam (DeepSpeedCPUAdam), a JIT op the stack installs unbuilt ---
BUILT = {"cpu_adam": {"op": "cpu_adam", "state": "cached", "path": "/state/.cache/torch_extensions/cpu_adam.so"}}
BUILDABLE = {"cpu_adam": {"op": "cpu_adam", "state": "missing", "buildable": True}}
NO_COMPILER = {"cpu_adam": {"op": "cpu_adam", "state": "missing", "buildable": False,
                            "why": "no C++ compiler 'c++' on PATH; no ninja on PATH"}}
WITH_REWARD_NODE = (*TWO_BY_EIGHT, NodeView("10.0.0.6", 8, 0))  # a CPU node (reward service): trains nothing


def with_ops(nodes, ops) -> ClusterView:
    return ClusterView(nodes, {REWARD: "ok"}, "the head 10.0.0.5", {}, {}, ops)


def test_only_adam_offload_jobs_ask_the_probe_for_cpu_adam():
    offload, _ = job("32b-rloo")
    assert offload.adam_offload and job_ops(offload) == ["cpu_adam"]
    assert probe_request(offload, None)["ops"] == ["cpu_adam"]
    plain, _ = job("32b-rloo", "adam_offload=false")
    assert job_ops(plain) == [] and "ops" not in probe_request(plain, None)
    # the job's own values of what decides where the op is built go with the request; nothing else of its env
    env = {"TORCH_EXTENSIONS_DIR": "/scratch/ext", "CXX": "g++-13", "WANDB_API_KEY": "secret", "PATH": "/x"}
    assert probe_request(offload, None, env)["ops_env"] == {"TORCH_EXTENSIONS_DIR": "/scratch/ext", "CXX": "g++-13"}
    assert "ops_env" not in probe_request(offload, None, {"WANDB_API_KEY": "secret"})
    assert "ops_env" not in probe_request(plain, None, env)


def test_cpu_adam_built_on_every_gpu_node_is_a_line_and_the_cpu_node_is_not_asked():
    cfg, gpus = job("32b-rloo")
    report = check(cfg, with_ops(WITH_REWARD_NODE, {"10.0.0.5": BUILT, "10.0.0.4": BUILT, "10.0.0.6": NO_COMPILER}),
                   expects_gpus=gpus)
    assert report.ok, report.problems
    assert "DeepSpeed op cpu_adam (--adam_offload): built on 2 nodes (10.0.0.5, 10.0.0.4)" in report.lines
    assert not any("cpu_adam" in n for n in report.notes)


def test_cpu_adam_the_job_would_compile_is_a_note_naming_the_node_and_the_role_variable():
    cfg, gpus = job("32b-rloo")
    report = check(cfg, with_ops(TWO_BY_EIGHT, {"10.0.0.5": BUILT, "10.0.0.4": BUILDABLE}), expects_gpus=gpus)
    assert report.ok, report.problems
    assert ("DeepSpeed op cpu_adam (--adam_offload) is not built on 10.0.0.4: the job compiles it there as it "
            "starts (a minute or more per node); ray_node__deepspeed_ops: [cpu_adam] in the inventory builds it "
            "on each node when the node is provisioned") in report.notes
    assert not any("cpu_adam" in line for line in report.lines)


def test_cpu_adam_that_cannot_be_built_on_a_gpu_node_refuses_the_job_with_the_reason():
    cfg, gpus = job("32b-rloo")
    report = check(cfg, with_ops(TWO_BY_EIGHT, {"10.0.0.5": BUILDABLE, "10.0.0.4": NO_COMPILER}), expects_gpus=gpus)
    assert report.problems == [
        "DeepSpeed op cpu_adam (--adam_offload) is not built on 10.0.0.4 and cannot be built there (no C++ compiler "
        "'c++' on PATH; no ninja on PATH): the job would fail as it sets up its optimizer; install what is missing "
        "and set ray_node__deepspeed_ops: [cpu_adam] in the inventory (it builds the op when the node is "
        "provisioned), or leave out --adam_offload"]
    assert any("not built on 10.0.0.5: the job compiles it" in n for n in report.notes)


def test_nodes_that_cannot_build_it_for_one_reason_are_one_problem_naming_them_all():
    cfg, gpus = job("32b-rloo")
    nodes = (*TWO_BY_EIGHT, NodeView("10.0.0.7", 64, 8))
    report = check(cfg, with_ops(nodes, {"10.0.0.5": NO_COMPILER, "10.0.0.4": NO_COMPILER, "10.0.0.7": BUILT}),
                   expects_gpus=gpus)
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith("DeepSpeed op cpu_adam (--adam_offload) is not built on 2 nodes (10.0.0.5, "
                                         "10.0.0.4) and cannot be built there (no C++ compiler 'c++' on PATH; ")


def test_on_a_cpu_cluster_every_node_trains_so_every_node_is_asked():
    cfg, gpus = job("tiny-rloo", "adam_offload=true")
    assert not gpus
    report = check(cfg, with_ops(ONE_MACHINE, {"127.0.0.2": NO_COMPILER}), expects_gpus=gpus)
    assert len(report.problems) == 1 and "not built on 127.0.0.2 and cannot be built there" in report.problems[0]


@pytest.mark.parametrize("ops, note", [
    (None, "DeepSpeed op cpu_adam (--adam_offload): not looked at on the nodes"),
    ({"10.0.0.5": BUILT}, "DeepSpeed op cpu_adam (--adam_offload) on 10.0.0.4: not known (the probe did not report "
                          "it)"),
    ({"10.0.0.5": BUILT, "10.0.0.4": {"cpu_adam": {"op": "cpu_adam", "state": "unknown", "why": "exited 2: old"}}},
     "DeepSpeed op cpu_adam (--adam_offload) on 10.0.0.4: not known (exited 2: old)"),
])
def test_ops_not_looked_at_or_not_reported_are_noted_not_refused(ops, note):
    cfg, gpus = job("32b-rloo")
    report = check(cfg, with_ops(TWO_BY_EIGHT, ops), expects_gpus=gpus)
    assert report.ok, report.problems
    assert note in report.notes
