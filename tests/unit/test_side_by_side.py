"""bench/gpu/side_by_side.py's parts that need no GPU: each system's environment (the one change made to how
OpenRLHF runs reaches OpenRLHF's processes only), and verl's command, log parser, data and reward."""

from __future__ import annotations

import importlib.util
import json
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import PROJECT

GPU_BENCH = PROJECT / "bench" / "gpu"
sys.path.insert(0, str(GPU_BENCH))  # side_by_side imports its neighbour isolated.py
try:
    spec = importlib.util.spec_from_file_location("side_by_side", GPU_BENCH / "side_by_side.py")
    sbs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sbs)
finally:
    sys.path.remove(str(GPU_BENCH))

BASE = {"PATH": "/usr/bin", "PYTHONPATH": "/tmp/site", "RAY_ADDRESS": "10.0.0.1:6379",
        "NCCL_NVLS_ENABLE": "0"}


def test_only_openrlhf_runs_with_the_shim_and_no_system_inherits_a_store_port():
    orl = sbs.system_env("openrlhf", BASE, ray_tmp="/tmp/r", shim="/shim")
    assert orl["PYTHONPATH"] == f"{PROJECT}:/shim:/tmp/site"  # the project first: the shim's sitecustomize imports it
    # a store port the shell set (or the bench's own process got) must not reach any system's engines
    shell = {**BASE, "VLLM_DP_MASTER_PORT": "29000", "RLRUN_STORE_PORT_PID": "1"}
    rl = sbs.system_env("rlrun", shell, ray_tmp="/tmp/r", shim="/shim")
    assert rl["PYTHONPATH"] == f"{PROJECT}:/tmp/site"
    for env in (orl, rl, sbs.system_env("openrlhf", shell, ray_tmp="/tmp/r", shim="/shim")):
        assert "RAY_ADDRESS" not in env and env["RAY_TMPDIR"] == "/tmp/r" and env["NCCL_NVLS_ENABLE"] == "0"
        assert "VLLM_DP_MASTER_PORT" not in env and "RLRUN_STORE_PORT_PID" not in env
    assert "RAY_ADDRESS" in BASE  # the caller's dict is left as it was


def _start(env: dict, code: str) -> dict:
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


SHOW = ("import json, os, subprocess, sys; mine = {k: os.environ.get(k) for k in ('VLLM_DP_MASTER_PORT', "
        "'RLRUN_STORE_PORT_PID')}; child = subprocess.run([sys.executable, '-c', 'import os; "
        "print(os.environ.get(\"VLLM_DP_MASTER_PORT\"))'], capture_output=True, text=True).stdout.strip(); "
        "print(json.dumps({**mine, 'child': child, 'pid': os.getpid()}))")


def test_the_shim_gives_each_openrlhf_process_a_store_port_of_its_own():
    """openrlhf_shim/sitecustomize.py in real interpreters: each process (and each child, as Ray's workers and
    vLLM's engine cores are) starts vLLM 0.26's TCPStore search at a port of its own, marked as the shim's;
    a port the caller set stays."""
    import os

    env = sbs.system_env("openrlhf", {"PATH": os.environ["PATH"], "PYTHONPATH": ""}, ray_tmp="/tmp/r",
                         shim=str(GPU_BENCH / "openrlhf_shim"))
    a, b = _start(env, SHOW), _start(env, SHOW)
    ports = {a["VLLM_DP_MASTER_PORT"], b["VLLM_DP_MASTER_PORT"], a["child"], b["child"]}
    assert len(ports) == 4 and all(int(p) > 0 for p in ports), (a, b)
    assert a["RLRUN_STORE_PORT_PID"] == str(a["pid"])
    given = _start({**env, "VLLM_DP_MASTER_PORT": "29000"}, SHOW)
    assert given["VLLM_DP_MASTER_PORT"] == "29000" and given["child"] == "29000"
    assert given["RLRUN_STORE_PORT_PID"] is None
    # rlrun's processes run without the shim: no port is set for them
    plain = _start(sbs.system_env("rlrun", {"PATH": os.environ["PATH"], "PYTHONPATH": ""}, ray_tmp="/tmp/r",
                                  shim=str(GPU_BENCH / "openrlhf_shim")), SHOW)
    assert plain["VLLM_DP_MASTER_PORT"] is None and plain["child"] == "None"


def test_verl_gets_its_own_folder_first_and_a_file_logger(tmp_path):
    env = sbs.system_env("verl", {**BASE, "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0"}, ray_tmp="/tmp/r",
                         shim="/shim", verl_path="/tmp/site/verl-only", run_out=tmp_path)
    assert env["PYTHONPATH"] == f"/tmp/site/verl-only:{PROJECT}:/tmp/site"  # its antlr4 before the site's
    assert env["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "metrics.jsonl")
    assert "/shim" not in env["PYTHONPATH"]


def _args(**kw):
    base = dict(prompts=16, n=4, steps=6, new_tokens=256, model="/m", grad_ckpt=False, micro_train=8,
                micro_rollout=16, gpu_util=0.5, tp=1, gpus=1, verl_extra=[], liger=False, data="/d.jsonl",
                engines=1, placement="colocated", rlrun_extra=[], kl_loss=False)
    return SimpleNamespace(**{**base, **kw})


def _overrides(cmd: list[str]) -> dict[str, str]:
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    return dict(arg.split("=", 1) for arg in cmd[3:])


def test_verl_command_is_the_shape_of_the_other_two(tmp_path):
    o = _overrides(sbs.verl_command(_args(), tmp_path, tmp_path / "train.parquet"))
    expect = {
        "data.train_files": str(tmp_path / "train.parquet"), "data.train_batch_size": "16",  # prompts
        "data.train_max_samples": "96", "data.max_prompt_length": "128", "data.max_response_length": "256",
        "actor_rollout_ref.rollout.n": "4", "actor_rollout_ref.actor.ppo_mini_batch_size": "16",  # one update
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "8",
        "actor_rollout_ref.actor.ppo_epochs": "1",
        "actor_rollout_ref.actor.optim.lr": "1e-6", "actor_rollout_ref.rollout.temperature": "1.0",
        "actor_rollout_ref.rollout.gpu_memory_utilization": "0.5", "actor_rollout_ref.hybrid_engine": "true",
        "actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.rollout.enable_prefix_caching": "false",
        "algorithm.adv_estimator": "rloo", "algorithm.use_kl_in_reward": "true", "algorithm.kl_penalty": "kl",
        "algorithm.kl_ctrl.type": "fixed", "algorithm.kl_ctrl.kl_coef": "0.02",
        "actor_rollout_ref.actor.use_kl_loss": "false",
        "actor_rollout_ref.model.enable_gradient_checkpointing": "false",  # verl's default is true
        "actor_rollout_ref.model.use_remove_padding": "false",
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "reward.custom_reward_function.path": str(PROJECT / "bench" / "gpu" / "verl_reward.py"),
        "reward.custom_reward_function.name": "compute_score",
        "trainer.n_gpus_per_node": "1", "trainer.total_epochs": "1", "trainer.total_training_steps": "6",
        "trainer.logger": "[console,file]", "trainer.val_before_train": "false", "trainer.save_freq": "-1",
        "hydra.run.dir": str(tmp_path / "hydra"),  # not ./outputs in the project
    }
    assert {k: o.get(k) for k in expect} == expect


def test_verl_command_follows_the_flags_and_takes_extra_overrides(tmp_path):
    cmd = sbs.verl_command(_args(gpus=4, tp=2, grad_ckpt=True, micro_train=4, micro_rollout=8, prompts=32,
                                 verl_extra=["trainer.use_v1=false"]), tmp_path, tmp_path / "t.parquet")
    o = _overrides(cmd)
    assert o["trainer.n_gpus_per_node"] == "4"
    assert o["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "2"
    assert o["actor_rollout_ref.model.enable_gradient_checkpointing"] == "true"
    assert o["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] == "8"
    assert o["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] == "8"
    assert o["data.train_batch_size"] == "32" and cmd[-1] == "trainer.use_v1=false"


def test_liger_reaches_every_system_by_its_own_flag_or_none(tmp_path):
    """--liger: the same lever in each system (rlrun's trainer checks its flag: test_config, test_jobcheck)."""
    from trainer.config.cli import parse_args

    for liger in (False, True):
        args = _args(liger=liger)
        rlrun = sbs.rlrun_command(args, tmp_path)
        assert ("--use_liger_kernel" in rlrun) is liger
        assert parse_args(rlrun[3:]).use_liger_kernel is liger  # the trainer takes the command as written
        assert ("--ds.use_liger_kernel" in sbs.openrlhf_command(args, tmp_path)) is liger
        verl = _overrides(sbs.verl_command(args, tmp_path, tmp_path / "t.parquet"))
        assert verl["actor_rollout_ref.model.use_liger"] == str(liger).lower()


def test_kl_loss_reaches_every_system_and_lets_rlrun_skip_the_old_policy_forward(tmp_path):
    """--kl-loss: k3 at 0.02 as a loss term in each system's own words, no KL in any reward. Only then does
    rlrun's trainer take --old_logprobs train (no policy forward in make_experience): with a KL in the reward
    the rewards need the policy's log-probs before training, and its rules refuse it."""
    from trainer.config.cli import parse_args
    from trainer.config.errors import ConfigError

    train = ["--old_logprobs", "train"]
    c = parse_args(sbs.rlrun_command(_args(kl_loss=True, rlrun_extra=train), tmp_path)[3:])
    assert (c.use_kl_loss, c.kl_estimator, c.init_kl_coef, c.old_logprobs) == (True, "k3", 0.02, "train")
    with pytest.raises(ConfigError, match="KL penalty in the reward"):
        parse_args(sbs.rlrun_command(_args(rlrun_extra=train), tmp_path)[3:])
    assert not parse_args(sbs.rlrun_command(_args(), tmp_path)[3:]).use_kl_loss

    openrlhf = sbs.openrlhf_command(_args(kl_loss=True), tmp_path)
    assert openrlhf[openrlhf.index("--algo.kl.estimator") + 1] == "k3" and "--algo.kl.use_loss" in openrlhf
    assert openrlhf[openrlhf.index("--algo.kl.init_coef") + 1] == "0.02"
    assert "--algo.kl.use_loss" not in sbs.openrlhf_command(_args(), tmp_path)

    verl = _overrides(sbs.verl_command(_args(kl_loss=True), tmp_path, tmp_path / "t.parquet"))
    assert {k: verl[k] for k in ("actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_coef",
                                 "actor_rollout_ref.actor.kl_loss_type", "algorithm.use_kl_in_reward")} == {
        "actor_rollout_ref.actor.use_kl_loss": "true", "actor_rollout_ref.actor.kl_loss_coef": "0.02",
        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl", "algorithm.use_kl_in_reward": "false"}


def test_the_startup_line_reads_step_1s_marks_by_process():
    row = {"startup/driver/process_s": 0.0, "startup/driver/step1_s": 130.0, "startup/policy/ready_s": 50.0,
           "startup/policy/process_s": 10.0, "startup/rollout_engine_0/ready_s": 100.0,
           "startup/rollout_engine_0/process_s": 30.0, "timing/step": 9.0}
    assert sbs.startup_line(row) == ("driver: process 0.0, step1 130.0; policy: ready 50.0, process 10.0; "
                                     "rollout_engine_0: ready 100.0, process 30.0")


CONSOLE = """\
(TaskRunner pid=4242) step:1 - actor/pg_loss:np.float64(0.01) - timing_s/gen:np.float64(12.5) - \
timing_s/reward:0.25 - timing_s/old_log_prob:np.float64(1.5) - timing_s/ref:np.float64(1.25) - \
timing_s/adv:0.01 - timing_s/update_actor:np.float64(4.0) - timing_s/update_weights:np.float64(2.0) - \
timing_s/step:np.float64(21.6) - \
timing_per_token_ms/gen:np.float64(0.7) - timing_s/agent_loop/generate_sequences/max:np.float64(9.0)
(TaskRunner pid=4242) step:2 - timing_s/gen:5.0 - timing_s/old_log_prob:1.0 - timing_s/ref:1.0 - \
timing_s/update_actor:3.0 - timing_s/update_weights:1.0 - timing_s/step:11.5
(TaskRunner pid=4242) Training Progress:  67%|######6   | 2/3
"""


def test_verl_steps_from_its_console_lines(tmp_path):
    log = tmp_path / "verl.log"
    log.write_text(CONSOLE)
    rows = sbs.verl_steps(log, tmp_path / "absent.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    first = rows[0]["phases"]
    assert first["gen"] == 12.5 and first["update_actor"] == 4.0 and first["update_weights"] == 2.0
    assert first["make_experience"] == 0.25 + 1.5 + 1.25 + 0.01  # reward + old_log_prob + ref + adv
    assert rows[0]["step_s"] == 21.6 and rows[1]["phases"]["reward"] == 0.0  # a timer that did not run: 0
    med = sbs.medians(rows)
    assert med["step"] == 11.5 and med["gen"] == 5.0 and med["steps_measured"] == 1


def test_verl_steps_prefer_its_file_logger_and_skip_a_line_being_written(tmp_path):
    log, jsonl = tmp_path / "verl.log", tmp_path / "metrics.jsonl"
    log.write_text(CONSOLE)
    jsonl.write_text(json.dumps({"step": 1, "data": {"timing_s/gen": 3.0, "timing_s/step": 7.0,
                                                     "timing_s/agent_loop/x/max": 9.0, "actor/lr": 1e-6}})
                     + '\n{"step": 2, "data": {"timing_s/ge')
    rows = sbs.verl_steps(log, jsonl)
    assert len(rows) == 1 and rows[0]["step_s"] == 7.0 and rows[0]["phases"]["gen"] == 3.0
    assert "agent_loop" not in rows[0]["phases"]
    # without a step's timing the step is the sum of the phases
    jsonl.write_text(json.dumps({"step": 1, "data": {"timing_s/gen": 3.0, "timing_s/update_actor": 2.0}})
                     + "\n")
    assert sbs.verl_steps(log, jsonl)[0]["step_s"] == 5.0


def test_the_bench_jsonl_becomes_verl_rows(tmp_path):
    rows = [{"message": [{"role": "user", "content": "copy 42="}], "answer": "42", "solution": "\\boxed{42}"},
            {"message": "copy 7=", "answer": 7}]
    recs = sbs.verl_records(rows)
    assert recs[0] == {"data_source": "side_by_side", "ability": "copy",
                       "prompt": [{"role": "user", "content": "copy 42="}],
                       "reward_model": {"style": "rule", "ground_truth": "42"},
                       "extra_info": {"split": "train", "index": 0}}
    assert recs[1]["prompt"] == [{"role": "user", "content": "copy 7="}]
    assert recs[1]["reward_model"]["ground_truth"] == "7" and recs[1]["extra_info"]["index"] == 1
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    path = sbs.write_verl_data(src, tmp_path / "verl")
    if path.suffix == ".parquet":
        pq = pytest.importorskip("pyarrow.parquet")
        assert pq.read_table(path).to_pylist() == recs
    else:
        assert [json.loads(x) for x in path.read_text().splitlines()] == recs


def test_verl_reward_is_digit_share():
    spec = importlib.util.spec_from_file_location("verl_reward", PROJECT / "bench" / "gpu" / "verl_reward.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    score = mod.compute_score(data_source="side_by_side", solution_str="ab12", ground_truth="12",
                              extra_info={"index": 0})
    assert score == 0.5 and isinstance(score, float)
    assert mod.compute_score("s", "", "1") == 0.0


def test_a_missing_verl_is_reported_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sbs, "verl_available", lambda: False)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"message": "copy 1=", "answer": "1"}) + "\n")
    argv = ["--model", "/m", "--data", str(data), "--out", str(tmp_path / "o"), "--systems", "verl"]
    assert sbs.main(argv) == 0
    got = json.loads((tmp_path / "o" / "side_by_side.json").read_text())
    assert "not installed" in got["verl"]["error"]
    assert "verl: skipped" in capsys.readouterr().out


def test_the_table_sets_verl_beside_the_others(capsys):
    med = {"generate": 1.0, "make_experience": 0.5, "train": 1.0, "sync": 0.2, "step": 3.0,
           "steps_measured": 2}
    r = {"shape": {"prompts": 16, "n": 4, "new_tokens": 256, "steps": 3}, "rlrun": {"median": med},
         "openrlhf": {"median": {"generation": 5.0, "step": 15.0, "steps_measured": 2}},
         "verl": {"median": {"gen": 4.0, "make_experience": 2.0, "update_actor": 3.0, "update_weights": 1.0,
                             "step": 12.0, "steps_measured": 2}}}
    sbs.table(r)
    out = capsys.readouterr().out
    assert "rlrun step / OpenRLHF step: 0.20x" in out and "rlrun step / verl step: 0.25x" in out
    assert "the one change made to OpenRLHF: openrlhf_shim/sitecustomize.py in its processes only" in out
    assert "train (OpenRLHF: ppo_train; verl: update_actor)" in out and "verl 2" in out
    assert "target" not in out  # no target given, none printed (issue 13's 0.8x and 6 s were printed at every size)
    r["shape"].update(target_ratio=0.5, target_step=8)
    sbs.table(r)
    out = capsys.readouterr().out
    assert "rlrun step / OpenRLHF step: 0.20x (target <= 0.5x)" in out
    assert "rlrun colocated step: 3.00 s (target <= 8 s)" in out


def test_each_system_gets_at_most_its_own_share_of_the_deadline(tmp_path, monkeypatch):
    seen = {}

    def fake_run(name, cmd, env, log, deadline, done=None):
        seen[name] = deadline - sbs.time.monotonic()
        return 0, 1.0

    monkeypatch.setattr(sbs, "run", fake_run)
    monkeypatch.setattr(sbs, "wait_gpu_free", lambda *a, **k: -1)
    monkeypatch.setattr(sbs, "verl_available", lambda: True)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"message": "copy 1=", "answer": "1"}) + "\n")
    argv = ["--model", "/m", "--data", str(data), "--out", str(tmp_path / "o"), "--systems", "rlrun,verl",
            "--deadline", "900", "--system-deadline", "300"]
    assert sbs.main(argv) == 0
    assert set(seen) == {"rlrun", "verl"} and all(250 < s <= 300 for s in seen.values())
    assert {p.name for p in (tmp_path / "o" / "verl").iterdir()} & {"train.parquet", "train.jsonl"}
    got = json.loads((tmp_path / "o" / "side_by_side.json").read_text())
    assert got["verl"]["exit"] == 0 and got["verl"]["steps"] == []  # no log: no steps, and no crash


def test_rlrun_medians_leave_out_the_profiled_step(tmp_path):
    """--profile_step: the step under torch.profiler is slower; the medians are of the other later steps."""
    rows = [{"step": i, "time": 100.0 + 10 * i, "timing/generate": 1.0, "timing/train": t, "timing/step": t + 1}
            for i, t in ((1, 50.0), (2, 4.0), (3, 6.0), (4, 30.0))]
    rows[3]["profile/policy_wall_s"] = 29.0
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    parsed = sbs.rlrun_steps(tmp_path)
    assert [r["profiled"] for r in parsed] == [False, False, False, True]
    med = sbs.medians(parsed)
    assert med["train"] == 5.0 and med["step"] == 6.0 and med["steps_measured"] == 2
    # nothing but the first step and a profiled one: the first step stands in
    assert sbs.medians(parsed[:1] + parsed[3:])["train"] == 50.0


def test_the_table_shows_the_weight_push_by_part(capsys):
    """rlrun's colocated push, timed by part on policy rank 0 (sync/*_s), as medians of the later steps."""
    med = {"generate": 1.0, "make_experience": 0.5, "train": 1.0, "sync": 1.7, "step": 4.2, "steps_measured": 2}
    parts = {"sync/gather_s": 0.2, "sync/handles_s": 0.1, "sync/load_s": 1.2, "sync/release_s": 0.1,
             "sync/finish_s": 0.05, "sync/buckets": 57, "sync/gib": 14.19}
    rows = [{"step": 1, **parts, "sync/load_s": 9.0},
            {"step": 2, **parts, "timing/forward/ref": 0.4, "timing/forward_wait/ref": 0.01,
             "timing/make_experience/build": 0.02, "timing/make_experience/return": 0.3,
             "timing/make_experience/post": 0.01, "timing/sync/ready": 0.0, "timing/sync/wake": 0.05},
            {"step": 3, **parts, "sync/load_s": 1.4, "timing/forward/ref": 0.6, "timing/forward_wait/ref": 0.03,
             "timing/make_experience/build": 0.04, "timing/make_experience/return": 0.1,
             "timing/make_experience/post": 0.03, "timing/sync/ready": 0.002, "timing/sync/wake": 0.07},
            # the profiled step (slower under torch.profiler) is left out, as from the phases' medians
            {"step": 4, **parts, "sync/load_s": 50.0, "timing/forward/ref": 9.0, "timing/forward_wait/ref": 5.0,
             "profiled": True}]
    r = {"shape": {"prompts": 16, "n": 4, "new_tokens": 256, "steps": 3}, "rlrun": {"median": med, "steps": rows}}
    sbs.table(r)
    out = capsys.readouterr().out
    assert ("rlrun weight push by part (57 buckets): gather 0.200 s, handles 0.100 s, load 1.300 s, "
            "release 0.100 s, finish 0.050 s") in out, out
    assert "rlrun make_experience's forwards (slowest rank, at once): ref 0.500 s" in out, out
    assert "rlrun make_experience's forwards started after (last rank): ref 0.020 s" in out, out
    assert "rlrun make_experience around its forwards: build 0.030 s, return 0.200 s, post 0.020 s" in out, out
    assert "rlrun sync before its push: ready 0.001 s, wake 0.060 s" in out, out


def test_run_all_sums_the_phases_not_the_step_or_the_parts_inside_a_phase(tmp_path):
    """timing/forward/<model> (each model's forward inside make_experience) and timing/step (the step's own
    clock) are not phases: adding them to the step would count that time twice."""
    spec = importlib.util.spec_from_file_location("run_all", GPU_BENCH / "run_all.py")
    run_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_all)
    row = {"timing/generate": 2.0, "timing/make_experience": 1.5, "timing/train": 3.0, "timing/sync": 0.5,
           "timing/forward/policy": 0.6, "timing/forward/ref": 0.5, "timing/forward_wait/ref": 0.2,
           "timing/step": 7.1}
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(dict(row, step=i)) for i in (1, 2, 3)))
    figures = run_all.loop_figures(path, actor_world=1, n_params=1)
    assert figures["step_s"] == pytest.approx(7.0)
    assert figures["timing/forward/policy"] == pytest.approx(0.6)
