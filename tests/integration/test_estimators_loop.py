"""Every advantage estimator runs two real RL steps through ``python -m trainer.train_ppo_ray`` on CPU, and
what the loop logs agrees with what ``--print-config`` says for the same command line.

Cheap by design: one tiny model (hidden 32, one layer) and the session's private Ray head (conftest's
``private_ray``; each run joins it with ``RAY_ADDRESS`` instead of starting its own Ray), one policy rank, the HF
engine, 4 samples per step, ``--max_steps 2`` (the data holds 4 rollouts). Each run also carries one
of issue 16's flags, so that the six runs cover them: the critic warm-up, the critic micro-batch and LR
warm-up, ``--eps_clip_low_high``, ``--no_advantage_std_norm``, ``--dual_clip``, ``--gamma`` with
reinforce, and the KL as a reward penalty, as a loss with k1 / k2 / k3, and off.

The KL check: with one rank, one micro-batch per step and one optimizer step per rollout, the policy a
step trains is the policy that generated it, so the worker's ``loss/kl`` (its estimate of the KL to the
reference, with the objective's estimator) equals the driver's ``kl/mean`` (the same tokens, with
``--kl_estimator``) exactly when both use the printed estimator. Before issue 16 the worker used k3
whatever was printed, and the k1 / k2 runs fail this check.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import PROJECT

pytestmark = pytest.mark.integration

COMMON = ["--input_key", "message", "--label_key", "answer", "--apply_chat_template",
          "--reward_fn", "tests.integration.loop_rewards:char_mean", "--rollout_backend", "hf",
          "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1", "--n_samples_per_prompt", "2",
          "--rollout_batch_size", "2", "--micro_rollout_batch_size", "2", "--train_batch_size", "4",
          "--micro_train_batch_size", "4", "--generate_max_len", "8", "--prompt_max_len", "64",
          "--max_samples", "8", "--num_episodes", "1", "--max_steps", "2", "--zero_stage", "3",
          "--actor_learning_rate", "3e-2", "--lr_scheduler", "constant_with_warmup", "--lr_warmup_ratio", "0"]
# Runs at a time: each mostly waits for its actors to start, one after the other. Without GPUs a run asks Ray
# for 0.25 CPU per actor (trainer.placement): at most 1.0 (gae), so three fit the shared head's 8 logical CPUs.
PARALLEL_RUNS = 3
REF = ["--ref_num_nodes", "1", "--ref_num_gpus_per_node", "1"]
RUNS = {
    "gae": ["--advantage_estimator", "gae", *REF, "--critic_num_nodes", "1", "--critic_num_gpus_per_node", "1",
            "--critic_micro_train_batch_size", "2", "--critic_learning_rate", "1e-2", "--critic_lr_warmup_ratio",
            "1.0", "--freezing_actor_steps", "1", "--gamma", "0.9", "--lambd", "0.9", "--init_kl_coef", "0.05",
            "--kl_estimator", "k2", "--eps_clip_low_high", "0.2", "0.28"],
    "reinforce": ["--advantage_estimator", "reinforce", *REF, "--gamma", "0.8", "--init_kl_coef", "0.05",
                  "--kl_estimator", "k1", "--no_advantage_std_norm"],
    "rloo": ["--advantage_estimator", "rloo", *REF, "--init_kl_coef", "0.05", "--use_kl_loss", "--kl_estimator", "k1"],
    "reinforce_baseline": ["--advantage_estimator", "reinforce_baseline", *REF, "--init_kl_coef", "0.05",
                           "--use_kl_loss", "--kl_estimator", "k2", "--dual_clip", "2"],
    "group_norm": ["--advantage_estimator", "group_norm", *REF, "--init_kl_coef", "0.05", "--use_kl_loss",
                   "--kl_estimator", "k3"],
    "dr_grpo": ["--advantage_estimator", "dr_grpo", "--init_kl_coef", "0"],
}  # fmt: skip


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from trainer.tiny import make_math_dataset, make_model

    d = tmp_path_factory.mktemp("estimators")
    make_model(d / "model", hidden_size=32, num_layers=1, num_heads=2)
    make_math_dataset(d / "data.jsonl", n=8, kind="copy")
    return d


def _argv(artifacts, name: str) -> list[str]:
    out = artifacts / name
    return ["--pretrain", str(artifacts / "model"), "--prompt_data", str(artifacts / "data.jsonl"), *COMMON,
            *RUNS[name], "--save_path", str(out), "--ckpt_path", str(out / "ckpt")]


def _printed(argv: list[str]) -> dict:
    from trainer import train_ppo_ray

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert train_ppo_ray.main([*argv, "--print-config"]) == 0
    return json.loads(text.getvalue())


@pytest.fixture(scope="module")
def runs(private_ray, artifacts):
    """Each estimator's two steps on the shared head, two runs at a time (a run mostly waits for its actors'
    start-up, one process after the other): name -> (printed, metrics rows, stdout)."""
    durations: dict[str, float] = {}
    # first, and one at a time (redirect_stdout is process-wide): a bad command line fails here, before a run
    printed = {name: _printed(_argv(artifacts, name)) for name in RUNS}

    def run(name: str) -> tuple[dict, list[dict], str]:
        argv = _argv(artifacts, name)
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "trainer.train_ppo_ray", *argv], cwd=PROJECT,
                              env={**private_ray["env"], "RAY_ADDRESS": private_ray["address"]},
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        durations[name] = time.monotonic() - start
        assert done.returncode == 0, f"{name}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        rows = [json.loads(line) for line in (artifacts / name / "metrics.jsonl").read_text().splitlines()]
        return printed[name], rows, done.stdout

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=PARALLEL_RUNS) as pool:
        results = dict(zip(RUNS, pool.map(run, RUNS), strict=True))
    print(f"estimator runs: {time.monotonic() - start:.1f} s in all; each: "
          + ", ".join(f"{k} {v:.1f}" for k, v in durations.items()))
    return results


@pytest.mark.parametrize("name", list(RUNS))
def test_two_steps_agree_with_the_printed_config(runs, name):
    printed, rows, stdout = runs[name]
    assert printed["advantage_estimator"] == name
    assert [row["step"] for row in rows] == [1, 2]  # --max_steps 2 of the 4 rollouts the data holds
    assert '@plan {"total_steps": 2' in stdout
    frozen = max(printed["freezing_actor_steps"], 0)
    for row in rows:
        assert row["reward/std"] > 0, "the reward must vary for the policy to get a gradient"
        mean, std = row["advantage/mean"], row["advantage/std"]
        if printed["advantage_norm"] == "whiten":
            assert abs(mean) < 1e-5 and abs(std - 1) < 1e-3, row
        elif printed["advantage_norm"] == "center":
            assert abs(mean) < 1e-5 and abs(std - 1) > 0.05, row
        else:
            assert printed["advantage_norm"] == "none" and abs(std - 1) > 0.05, row
        actor_trained = row["step"] > frozen
        assert ("loss/policy" in row) == actor_trained
        assert ("policy/dual_clip_frac" in row) == (actor_trained and printed["dual_clip"] is not None)
        assert ("loss/critic" in row) == printed["needs_critic"]
        assert ("kl/mean" in row) == printed["needs_ref"]
        assert ("loss/kl" in row) == (actor_trained and printed["kl_loss_coef"] > 0)
    second = rows[1]
    if printed["kl_loss_coef"] > 0:
        # the policy moved in step 1, and both sides estimate its KL with the printed estimator
        assert second["kl/mean"] != 0
        assert second["loss/kl"] == pytest.approx(second["kl/mean"], rel=1e-4, abs=1e-7), printed["kl_estimator"]
    if frozen:  # the critic warm-up kept the policy where it started: its KL to the reference is 0
        assert abs(second["kl/mean"]) < 1e-6 and "loss/policy" not in rows[0] and "lr/actor" not in rows[0]
        # the critic's own LR warm-up spans the run's 2 optimizer steps: step 1 is at half the rate
        assert rows[0]["lr/critic"] == pytest.approx(printed["critic_learning_rate"] / 2)


def test_the_runs_cover_every_estimator():
    from trainer.config.estimators import ESTIMATORS

    assert set(RUNS) == set(ESTIMATORS)
