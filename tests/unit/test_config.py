"""Unit tests of the trainer configuration (trainer.config*, trainer.train_ppo_ray)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

from trainer import train_ppo_ray
from trainer.config import ConfigError, TrainerConfig
from trainer.config.cli import build_parser, parse_args
from trainer.config.fields import flag_specs

REPO = Path(__file__).resolve().parents[2]

SEED = shlex.split(
    '--ref_num_nodes 2 --ref_num_gpus_per_node 4 --remote_rm_url "http://127.0.0.1:5001/get_reward" '
    "--actor_num_nodes 2 --actor_num_gpus_per_node 4 --vllm_num_engines 2 --vllm_tensor_parallel_size 4 "
    "--colocate_all_models --vllm_enable_sleep --vllm_gpu_memory_utilization 0.85 --vllm_sync_backend gloo "
    "--enable_prefix_caching --pretrain /x --save_path ./ckpts/m --micro_train_batch_size 2 "
    "--train_batch_size 128 --micro_rollout_batch_size 4 --rollout_batch_size 256 --temperature 1 "
    "--n_samples_per_prompt 8 --max_epochs 1 --num_episodes 30 --prompt_max_len 4096 --max_samples 100000 "
    "--generate_max_len 4096 --advantage_estimator rloo --zero_stage 3 --adam_offload --bf16 "
    "--actor_learning_rate 5e-7 --init_kl_coef 0.02 --prompt_data /y --input_key message --normalize_reward "
    "--flash_attn --gradient_checkpointing --save_steps 10 --ckpt_path ./ckpts/m/ckpt --save_hf_ckpt"
)


def with_flags(*changes: str, drop: tuple[str, ...] = ()) -> list[str]:
    """The seed command with ``changes`` ('--flag value' strings) applied and the ``drop`` flags removed."""
    argv = list(SEED)
    for name in drop:
        i = argv.index(name)
        del argv[i : i + (1 if i + 1 == len(argv) or argv[i + 1].startswith("--") else 2)]
    for change in changes:
        name, *value = shlex.split(change)
        if name in argv:
            i = argv.index(name)
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                argv[i + 1 : i + 2] = value
                continue
        argv += [name, *value]
    return argv


def run_entry(argv: list[str], first_on_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the entry point as ``python -m trainer.train_ppo_ray`` in a fresh interpreter."""
    path = [str(first_on_path)] if first_on_path else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(REPO)])}
    command = [sys.executable, "-m", "trainer.train_ppo_ray", *argv]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)


def problems_of(argv: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    return info.value.problems


# --- the seed job ---------------------------------------------------------------------------------------
def test_seed_command_parses_with_derived_sizes():
    cfg = parse_args(SEED)
    assert (cfg.vllm_num_engines, cfg.vllm_tensor_parallel_size, cfg.vllm_total_gpus) == (2, 4, 8)
    assert (cfg.actor_num_nodes, cfg.actor_num_gpus_per_node, cfg.actor_world_size) == (2, 4, 8)
    assert (cfg.ref_num_nodes, cfg.ref_num_gpus_per_node, cfg.ref_world_size) == (2, 4, 8)
    assert cfg.remote_rm_url == ("http://127.0.0.1:5001/get_reward",)
    assert cfg.advantage_estimator == "rloo" and not cfg.needs_critic and cfg.critic_pretrain is None
    assert cfg.rollout_samples == 2048  # 256 * 8
    assert cfg.grad_accum_steps == 8  # 128 / (2 * 8)
    assert cfg.train_steps_per_rollout == 16  # 2048 / 128 * 1
    assert cfg.micro_rollout_batches == 512  # 2048 / 4
    assert cfg.max_rollouts_per_episode == 390  # 100000 // 256
    assert cfg.max_train_steps == 30 * 390 * 16
    assert cfg.gpus_required == 8  # colocated
    assert cfg.temperature == 1.0 and isinstance(cfg.temperature, float)
    assert cfg.total_train_steps(num_prompts=1000) == 30 * 3 * 16  # 1000 // 256 = 3 rollouts per episode


def test_print_config_subprocess_without_ray(tmp_path):
    # poison ray / deepspeed / torch: importing any of them fails the command
    for name in ("ray", "deepspeed", "torch"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} must not be imported')\n")
    result = run_entry([*SEED, "--print-config"], first_on_path=tmp_path)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert (shown["vllm_num_engines"], shown["vllm_tensor_parallel_size"]) == (2, 4)
    assert (shown["actor_num_nodes"], shown["actor_num_gpus_per_node"]) == (2, 4)
    assert (shown["ref_num_nodes"], shown["ref_num_gpus_per_node"]) == (2, 4)
    assert shown["advantage_estimator"] == "rloo"
    assert (
        shown["rollout_samples"] == 2048 and shown["grad_accum_steps"] == 8 and shown["actor_world_size"] == 8
    )


def test_print_config_imports_no_heavy_modules():
    code = (
        "import sys\nfrom trainer import train_ppo_ray\n"
        f"rc = train_ppo_ray.main({[*SEED, '--print-config']!r})\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'deepspeed', 'torch', 'vllm'))\n"
        "print('RESULT', rc, heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "RESULT 0 []"


def test_print_config_redacts_wandb_key(capsys):
    assert train_ppo_ray.main([*SEED, "--use_wandb", "sekrit-key", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "sekrit-key" not in out and json.loads(out)["use_wandb"] == "<redacted>"


def test_every_seed_flag_is_a_config_field():
    names = {spec.cli for spec in flag_specs(TrainerConfig)}
    assert {arg for arg in SEED if arg.startswith("--")} <= names


# --- validation ---------------------------------------------------------------------------------------
# case -> (flags changed or added, flags dropped, fragments the error must contain)
BAD_CONFIGS: dict[str, tuple[list[str], tuple[str, ...], list[str]]] = {
    "rollout not divisible by train batch": (
        ["--train_batch_size 96"], (),
        ["--rollout_batch_size 256 * --n_samples_per_prompt 8 = 2048", "--train_batch_size 96", "2048 % 96 = 32"],
    ),
    "train batch not divisible by micro*world": (
        ["--micro_train_batch_size 3"], (),
        ["--train_batch_size 128", "--micro_train_batch_size 3", "--actor_num_nodes 2", "= 24", "128 % 24 = 8"],
    ),
    "rollout not divisible by micro rollout": (
        ["--micro_rollout_batch_size 3"], (),
        ["--rollout_batch_size 256 must be divisible by --micro_rollout_batch_size 3", "256 % 3 = 1"],
    ),
    "fewer micro rollout batches than actor ranks": (
        ["--rollout_batch_size 16", "--n_samples_per_prompt 4", "--micro_rollout_batch_size 16",
         "--train_batch_size 16", "--micro_train_batch_size 1"], (),
        ["// --micro_rollout_batch_size 16 = 4 micro rollout batches", "actor world size 8"],
    ),
    "gae critic placement under colocation": (
        ["--advantage_estimator gae"], (),
        ["--colocate_all_models", "critic placement", "--critic_num_nodes 1 x --critic_num_gpus_per_node 8",
         "--actor_num_nodes 2 x --actor_num_gpus_per_node 4"],
    ),
    "rloo with one sample": (
        ["--n_samples_per_prompt 1", "--rollout_batch_size 512"], (),
        ["--advantage_estimator rloo requires --n_samples_per_prompt > 1 (got 1)"],
    ),
    "group_norm with one sample": (
        ["--advantage_estimator group_norm", "--n_samples_per_prompt 1", "--rollout_batch_size 512"], (),
        ["--advantage_estimator group_norm requires --n_samples_per_prompt > 1"],
    ),
    "colocated vLLM GPUs != actor GPUs": (
        ["--vllm_num_engines 1"], (),
        ["--vllm_num_engines 1 * --vllm_tensor_parallel_size 4 = 4 vLLM GPUs", "actor world size 8"],
    ),
    "colocated ref placement != actor": (
        ["--ref_num_nodes 1"], (),
        ["ref placement", "--ref_num_nodes 1 x --ref_num_gpus_per_node 4 != --actor_num_nodes 2"],
    ),
    "both reward sources": (["--reward_fn math_verify"], (), ["--remote_rm_url", "--reward_fn math_verify", "both"]),
    "no reward source": ([], ("--remote_rm_url",), ["exactly one of --remote_rm_url", "--reward_fn"]),
    "temperature zero": (["--temperature 0"], (), ["--temperature 0: must be > 0"]),
    "vLLM memory above 1": (["--vllm_gpu_memory_utilization 1.5"], (), ["--vllm_gpu_memory_utilization 1.5", "<= 1"]),
    "vLLM memory zero": (["--vllm_gpu_memory_utilization 0"], (), ["--vllm_gpu_memory_utilization 0", "> 0"]),
    "zero stage 4": (["--zero_stage 4"], (), ["--zero_stage 4", "one of 0, 1, 2, 3"]),
    "bad sync backend": (["--vllm_sync_backend tcp"], (), ["--vllm_sync_backend 'tcp'", "one of nccl, gloo"]),
    "non-positive nodes": (["--actor_num_nodes 0"], (), ["--actor_num_nodes 0: must be >= 1"]),
    "gamma with rloo": (["--gamma 0.99"], (), ["--gamma 0.99 with --advantage_estimator rloo"]),
    "sleep without colocation": ([], ("--colocate_all_models",), ["--vllm_enable_sleep only applies with"]),
    "max_samples below one rollout": (["--max_samples 100"], (), ["--max_samples 100 < --rollout_batch_size 256"]),
    "save_steps zero": (["--save_steps 0"], (), ["--save_steps 0", "-1", ">= 1"]),
    "template without {}": (["--input_template 'Q: %s'"], (), ["--input_template 'Q: %s'", "'{}'"]),
    "non-http reward url": (["--remote_rm_url ftp://rm"], (), ["--remote_rm_url ftp://rm", "http://"]),
    "kl loss without coefficient": (
        ["--use_kl_loss", "--init_kl_coef 0"], (), ["--use_kl_loss with --init_kl_coef 0"],
    ),
    "critic for rloo": (
        ["--critic_pretrain /c"], (), ["--critic_pretrain /c is only used by --advantage_estimator gae"],
    ),
    "vllm engines with hf backend": (
        ["--rollout_backend hf"], (),
        ["--vllm_num_engines 2 with --rollout_backend hf", "--vllm_enable_sleep with --rollout_backend hf"],
    ),
    "bad kl estimator": (["--kl_estimator k4"], (), ["--kl_estimator 'k4'", "one of k1, k2, k3"]),
    # issue 16: clip and normalisation flags, and flags the configuration would not use
    "clip pair LOW at 1": (["--eps_clip_low_high 1.0 0.3"], (), ["--eps_clip_low_high 1 0.3: LOW must be < 1"]),
    "clip pair not positive": (["--eps_clip_low_high 0 0.3"], (), ["--eps_clip_low_high 0 0.3: each number must be > 0"]),
    "clip and clip pair": (["--eps_clip 0.3", "--eps_clip_low_high 0.2 0.28"], (),
                           ["--eps_clip 0.3 and --eps_clip_low_high 0.2 0.28 both given"]),
    "eps_clip at 1": (["--eps_clip 1"], (), ["--eps_clip 1: must be > 0 and < 1"]),
    "dual clip at 1": (["--dual_clip 1"], (), ["--dual_clip 1: must be > 1"]),
    "reward clip reversed": (["--reward_clip_range 5 -5"], (), ["--reward_clip_range 5 -5: expected LOW < HIGH"]),
    "std norm that normalises nothing": (["--advantage_estimator group_norm", "--no_advantage_std_norm"], (),
                                         ["--no_advantage_std_norm has no effect", "group_norm does not whiten"]),
    "std norm with rloo unwhitened": (["--rloo_whiten off", "--no_advantage_std_norm"], (),
                                      ["--no_advantage_std_norm has no effect", "(--rloo_whiten off)"]),
    "rloo switch with another estimator": (["--advantage_estimator reinforce", "--rloo_whiten off"], (),
                                           ["--rloo_whiten off only applies to --advantage_estimator rloo"]),
    "bad rloo switch": (["--rloo_whiten no"], (), ["--rloo_whiten 'no'", "one of on, off"]),
    "critic flags with rloo": (["--critic_learning_rate 1e-5", "--lambd 0.95", "--save_value_network"], (),
                               ["--critic_learning_rate 1e-05 is only used with --advantage_estimator gae (a critic); "
                                "rloo has no critic (drop the flag)", "--lambd 0.95 is only used",
                                "--save_value_network is only used"]),
    "critic warm-up without a critic": (["--freezing_actor_steps 5"], (),
                                        ["--freezing_actor_steps 5 warms up a critic", "rloo has none"]),
    "critic micro-batch without a critic": (["--critic_micro_train_batch_size 2"], (),
                                            ["--critic_micro_train_batch_size 2 is only used with"]),
    "reference flags without a reference": (["--init_kl_coef 0", "--kl_estimator k3"], (),
                                            ["--kl_estimator k3 is only used with a reference model (--init_kl_coef > 0)",
                                             "--ref_num_nodes 2 is only used", "--init_kl_coef 0 creates none"]),
    "hf checkpoint without checkpoints": ([], ("--save_steps",), ["--save_hf_ckpt is only used with --save_steps > 0"]),
    "max_steps zero": (["--max_steps 0"], (), ["--max_steps 0: must be >= 1"]),
    "profile trace without a profiled step": (["--profile_trace"], (),
                                              ["--profile_trace is only used with --profile_step N; no step is profiled"]),
    "profiled step after the last": (["--max_steps 3", "--profile_step 4"], (),
                                     ["--profile_step 4 is beyond the run's last step 3", "pick 1..3"]),
    "negative profiled step": (["--profile_step -1"], (), ["--profile_step -1: must be >= 0"]),
    "reference ZeRO stage without a reference": (["--init_kl_coef 0", "--ref_zero_stage 0"], ("--ref_num_nodes",
                                                   "--ref_num_gpus_per_node"),
                                                  ["--ref_zero_stage 0 is only used with a reference model"]),
    "in-process engines without vLLM": (["--rollout_backend hf", "--vllm_in_process"], (),
                                        ["--vllm_in_process is only used with --rollout_backend vllm"]),
    "reference ZeRO stage 4": (["--ref_zero_stage 4"], (), ["--ref_zero_stage 4: must be >= 0 and <= 3"]),
    "CUDA graph mode without vLLM": (["--rollout_backend hf", "--vllm_cudagraph_mode piecewise"], (),
                                     ["--vllm_cudagraph_mode piecewise is only used with --rollout_backend vllm"]),
    "CUDA graph mode with eager engines": (["--enforce_eager", "--vllm_cudagraph_mode piecewise"], (),
                                           ["--vllm_cudagraph_mode piecewise with --enforce_eager: eager means no "
                                            "CUDA graphs (drop one of them)"]),
    "whole CUDA graphs for prefills": (["--vllm_cudagraph_mode full"], (),
                                       ["--vllm_cudagraph_mode full: whole CUDA graphs for the steps that hold a "
                                        "prefill make the engine compute wrong log-probs", "expected auto, full_and_piecewise, "
                                        "full_decode_only, piecewise or none"]),
    "unknown CUDA graph mode": (["--vllm_cudagraph_mode fast"], (),
                                ["--vllm_cudagraph_mode 'fast': expected one of auto, full_and_piecewise, full"]),
    "compile mode without vLLM": (["--rollout_backend hf", "--vllm_compile dynamo"], (),
                                  ["--vllm_compile dynamo is only used with --rollout_backend vllm"]),
    "compile mode with eager engines": (["--enforce_eager", "--vllm_compile none"], (),
                                        ["--vllm_compile none with --enforce_eager: eager engines compile nothing"]),
    "no compilation with piecewise graphs": (["--vllm_compile none", "--vllm_cudagraph_mode piecewise"], (),
                                             ["--vllm_compile none with --vllm_cudagraph_mode piecewise: piecewise "
                                              "CUDA graphs are cut from torch.compile's graph", "expected auto, "
                                              "full_decode_only or none"]),
    "kernel prewarm without vLLM": (["--rollout_backend hf", "--vllm_prewarm_kernels"], (),
                                    ["--vllm_prewarm_kernels is only used with --rollout_backend vllm"]),
    "worker preload without TP workers": (["--vllm_tensor_parallel_size 1", "--vllm_preload_workers"], (),
                                          ["--vllm_preload_workers is only used with --vllm_tensor_parallel_size > 1 "
                                           "and --vllm_in_process (engines whose own process starts their TP "
                                           "workers); engines of TP 1 have no workers of their own"]),
    # the stage xnode2 (2026-11-29): the 32b-rloo preset's engines spawn their cores; the hosts started, idle
    "worker preload with a spawned engine core": (["--vllm_tensor_parallel_size 2", "--vllm_preload_workers"], (),
                                                  ["--vllm_preload_workers is only used with "
                                                   "--vllm_tensor_parallel_size > 1 and --vllm_in_process", "without it "
                                                   "each engine's core runs in a process vLLM spawns"]),
    "worker preload without vLLM": (["--rollout_backend hf", "--vllm_preload_workers"], (),
                                    ["--vllm_preload_workers is only used with --rollout_backend vllm"]),
    "unknown compile mode": (["--vllm_compile fast"], (),
                             ["--vllm_compile 'fast': expected one of inductor, dynamo, none"]),
    "W&B name without W&B": (["--wandb_run_name x"], (), ["--wandb_run_name x is only used with --use_wandb"]),
    "warm-up data without a warm-up": (["--sft_data w.jsonl"], (),
                                       ["--sft_data w.jsonl is only used with --sft_warmup_steps > 0"]),
}  # fmt: skip


def test_issue16_flags_and_their_derived_values():
    cfg = parse_args(with_flags("--eps_clip_low_high 0.2 0.28", "--dual_clip 3", "--use_kl_loss",
                                "--kl_estimator k2", "--rloo_whiten off", "--reward_clip_range -3 3"))
    assert (cfg.eps_clip_low, cfg.eps_clip_high, cfg.dual_clip) == (0.2, 0.28, 3.0)
    assert (cfg.kl_loss_coef, cfg.kl_penalty_coef, cfg.advantage_norm) == (0.02, 0.0, "none")
    assert cfg.reward_clip_range == (-3.0, 3.0)
    seed = parse_args(SEED)
    assert (seed.eps_clip_low, seed.eps_clip_high) == (0.2, 0.2)
    assert (seed.kl_loss_coef, seed.kl_penalty_coef, seed.advantage_norm) == (0.0, 0.02, "whiten")
    assert seed.reward_clip_range == (-10.0, 10.0) and seed.rloo_whiten == "on"  # the seed's RLOO: whitened
    assert parse_args(with_flags("--no_advantage_std_norm")).advantage_norm == "center"
    assert parse_args(with_flags("--init_kl_coef 0", drop=("--ref_num_nodes", "--ref_num_gpus_per_node"))
                      ).kl_penalty_coef == 0.0


def test_max_steps_caps_the_run_and_its_schedules():
    cfg = parse_args(with_flags("--max_steps 5"))
    assert cfg.max_train_steps == 5 * 16  # 5 rollouts of 16 optimizer steps
    assert cfg.total_rollouts(num_prompts=1000) == 5 and cfg.total_train_steps(num_prompts=1000) == 80
    assert cfg.total_rollouts(num_prompts=300) == 5  # 30 episodes of 1 rollout each, capped at 5
    assert parse_args(with_flags("--max_steps 500")).total_rollouts(num_prompts=300) == 30  # the data ends first


def test_critic_sizes_default_to_the_actors_and_set_the_critics_accumulation():
    base = with_flags("--advantage_estimator gae", drop=("--colocate_all_models", "--vllm_enable_sleep"))
    cfg = parse_args(base)
    assert (cfg.critic_micro_train_batch_size, cfg.critic_lr_warmup_ratio) == (2, 0.03)
    assert cfg.critic_grad_accum_steps == 128 // (2 * 8)
    cfg = parse_args([*base, "--critic_micro_train_batch_size", "1", "--critic_lr_warmup_ratio", "0.015",
                      "--freezing_actor_steps", "3"])
    assert (cfg.critic_grad_accum_steps, cfg.critic_lr_warmup_ratio, cfg.freezing_actor_steps) == (16, 0.015, 3)
    problems = problems_of([*base, "--critic_micro_train_batch_size", "3", "--max_steps", "2",
                            "--freezing_actor_steps", "2"])
    assert any("--critic_micro_train_batch_size 3 * critic world size 8" in p for p in problems)
    assert any("--freezing_actor_steps 2 >= --max_steps 2: the policy would never be trained" in p for p in problems)


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_configuration_names_flag_and_arithmetic(case):
    changes, drop, expected = BAD_CONFIGS[case]
    message = "\n".join(problems_of(with_flags(*changes, drop=drop)))
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in:\n{message}"


def test_all_problems_are_reported_at_once():
    problems = problems_of(
        with_flags("--temperature 0", "--zero_stage 5", "--train_batch_size 96", drop=("--pretrain",))
    )
    assert len(problems) == 4, problems
    text = str(ConfigError(problems))
    assert text.startswith("invalid trainer configuration (4 problems):")
    assert all(
        f in text for f in ("--temperature", "--zero_stage", "--train_batch_size", "--pretrain is required")
    )


def test_validation_error_exits_2_with_message():
    result = run_entry(with_flags("--train_batch_size 96"))
    assert result.returncode == 2
    assert "2048 % 96 = 32" in result.stderr and result.stdout == ""


def test_gae_resolves_critic_to_pretrain():
    cfg = parse_args(
        with_flags("--advantage_estimator gae", drop=("--colocate_all_models", "--vllm_enable_sleep"))
    )
    assert cfg.critic_pretrain == "/x" and cfg.needs_critic
    assert cfg.critic_world_size == 8 and cfg.critic_grad_accum_steps == 8  # 128 / (2 * 1 * 8)
    assert cfg.gpus_required == 8 + 8 + 8 + 8  # actor + ref + critic + vLLM, not colocated


# --- command line -----------------------------------------------------------------------------------------
def test_unknown_flag_exits_2_with_suggestion():
    result = run_entry([*SEED, "--rollout_batch_sz", "4", "--print-config"])
    assert result.returncode == 2
    assert "--rollout_batch_sz" in result.stderr and "did you mean --rollout_batch_size?" in result.stderr


def test_unsupported_openrlhf_flag_is_an_error_not_ignored(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args([*SEED, "--lora_rank", "8"])
    assert info.value.code == 2
    assert "--lora_rank: OpenRLHF flag not supported here: LoRA is not implemented" in capsys.readouterr().err


def test_async_colocation_and_staleness_0_and_correction_without_logprobs_are_refused_naming_the_flags():
    with pytest.raises(ConfigError) as err:
        parse_args([*SEED, "--async_train"])  # the seed job colocates everything
    assert "--async_train with --colocate_all_models: the engines share the policy's GPUs" in str(err.value)
    split = [a for a in SEED if a not in ("--colocate_all_models", "--vllm_enable_sleep")]
    with pytest.raises(ConfigError) as err:
        parse_args([*split, "--async_train", "--max_staleness", "0"])
    assert "--async_train with --max_staleness 0" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_args([*split, "--is_correction", "tis", "--skip_rollout_logprobs"])
    assert "--is_correction tis with --skip_rollout_logprobs" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_args([*split, "--max_staleness", "3"])
    assert "--max_staleness 3 is only used with --async_train" in str(err.value)


def test_openrlhfs_dotted_names_of_the_overlap_flags_are_accepted():
    split = [a for a in SEED if a not in ("--colocate_all_models", "--vllm_enable_sleep")]
    cfg = parse_args([*split, "--train.async_enable", "--algo.advantage.is_correction_type", "icepop",
                      "--algo.advantage.is_correction_threshold", "0.8", "1.25", "--algo.dynamic_filtering_enable",
                      "--algo.dynamic_filtering_range", "0.1", "0.9"])
    assert (cfg.async_train, cfg.is_correction, cfg.is_correction_threshold) == (True, "icepop", (0.8, 1.25))
    assert (cfg.dynamic_filtering, cfg.dynamic_filtering_reward_range) == (True, (0.1, 0.9))


def test_flag_abbreviations_are_not_accepted(capsys):
    with pytest.raises(SystemExit):
        parse_args([*SEED, "--pretra", "/z"])
    assert "did you mean --pretrain?" in capsys.readouterr().err


def test_comma_separated_reward_urls_and_optional_values():
    cfg = parse_args(
        with_flags("--remote_rm_url http://a:1/r,http://b:2/r", "--dual_clip none", "--use_tensorboard")
    )
    assert cfg.remote_rm_url == ("http://a:1/r", "http://b:2/r")
    assert cfg.dual_clip is None
    assert cfg.use_tensorboard == os.path.join("./ckpts/m", "tensorboard")


def test_help_lists_flags():
    text = build_parser().format_help()
    assert "--vllm_sync_backend {nccl,gloo}" in text and "--remote_rm_timeout" in text


def test_without_print_config_runs_the_loop(monkeypatch):
    seen = []
    monkeypatch.setitem(sys.modules, "trainer.loop", types.SimpleNamespace(run=seen.append))
    assert train_ppo_ray.main(SEED) == 0
    assert len(seen) == 1 and seen[0].actor_world_size == 8


def test_missing_loop_exits_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trainer.loop", None)  # makes `import trainer.loop` fail
    assert train_ppo_ray.main(SEED) == 2
    assert "training loop not available yet" in capsys.readouterr().err


# --- immutability and serialisation -------------------------------------------------------------------
def test_config_is_immutable():
    cfg = parse_args(SEED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train_batch_size = 64  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.actor_world_size = 1  # type: ignore[misc]
    with pytest.raises(ConfigError, match="2048 % 96 = 32"):
        cfg.replace(train_batch_size=96)
    assert cfg.replace(train_batch_size=256).grad_accum_steps == 16


def test_to_dict_round_trip_and_unknown_keys():
    cfg = parse_args(SEED)
    data = json.loads(cfg.to_json())
    assert data["rollout_samples"] == 2048 and data["needs_critic"] is False
    assert TrainerConfig.from_dict(data) == cfg
    with pytest.raises(
        ConfigError, match=r"unknown field train_batchsize \(did you mean train_batch_size\?\)"
    ):
        TrainerConfig.from_dict({**data, "train_batchsize": 1})


def test_direct_construction_is_type_checked():
    with pytest.raises(ConfigError) as info:
        TrainerConfig(pretrain="/x", prompt_data="/y", reward_fn="f", train_batch_size="128", bf16=1)
    text = str(info.value)
    assert "--train_batch_size '128': expected an integer" in text and "--bf16 1: expected a boolean" in text


def test_multi_turn_search_flags():
    url = "http://{node_ip}:8000/retrieve"
    cfg = parse_args(with_flags(f"--retriever_url {url}", "--max_turns 4", "--retriever_topk 3", "--state_masking"))
    assert (cfg.retriever_url, cfg.max_turns, cfg.retriever_topk, cfg.state_masking, cfg.multi_turn) == (
        url, 4, 3, True, True)
    assert parse_args(SEED).multi_turn is False
    problems = problems_of(with_flags("--max_turns 4", "--state_masking", "--retriever_topk 5"))
    assert problems == [
        "--max_turns 4 is only used with --tools or --retriever_url (multi-turn tool rollouts); rollouts are "
        "single-turn without tools (drop the flag)",
        "--state_masking is only used with --tools or --retriever_url (multi-turn tool rollouts); rollouts are "
        "single-turn without tools (drop the flag)",
        "--retriever_topk 5 is only used with the search tool (--retriever_url); no rollout searches (drop the flag)"]
    assert problems_of(with_flags("--retriever_url localhost:8000")) == [
        "--retriever_url 'localhost:8000': expected an http:// or https:// URL of the retrieval service, e.g. "
        "http://{node_ip}:8000/retrieve"]
    assert problems_of(with_flags("--retriever_url http://{head}:8000/retrieve")) == [
        "--retriever_url 'http://{head}:8000/retrieve': unknown placeholder {head}; only {node_ip} (the address "
        "of the engine's node) is replaced"]
    assert any("--max_turns must be >= 1" in p or "max_turns" in p and "0" in p
               for p in problems_of(with_flags(f"--retriever_url {url}", "--max_turns 0")))


# --- issue 31: evaluation, engine faults, service outages -----------------------------------------------------
def test_evaluation_flags_under_their_openrlhf_and_dotted_names():
    ours = parse_args([*SEED, "--eval_data", "/e.jsonl", "--eval_steps", "5", "--eval_n_samples", "8",
                       "--eval_temperature", "0.7", "--save_best", "eval/pass@8"])
    flat = parse_args([*SEED, "--eval_dataset", "/e.jsonl", "--eval_steps", "5", "--eval_n_samples_per_prompt", "8",
                       "--eval_temperature", "0.7", "--save_best", "eval/pass@8"])
    dotted = parse_args([*SEED, "--eval.dataset", "/e.jsonl", "--eval.steps", "5", "--eval.n_samples_per_prompt",
                         "8", "--eval.temperature", "0.7", "--save_best", "eval/pass@8"])
    assert ours == flat == dotted
    assert (ours.eval_data, ours.eval_steps, ours.eval_n_samples, ours.eval_temperature) == ("/e.jsonl", 5, 8, 0.7)
    assert parse_args([*SEED, "--eval_steps", "-1"]) == parse_args(SEED)  # OpenRLHF's default: no evaluation
    assert parse_args([*SEED, "--eval_split", "train"]) == parse_args(SEED)  # its one-file meaning


@pytest.mark.parametrize("extra,message", [
    (["--eval_steps", "10"], "--eval_steps 10 is only used with --eval_data; there is nothing to evaluate on"),
    (["--eval_data", "/e.jsonl"], "--eval_data /e.jsonl without --eval_steps N or --eval_at_start: it would never "
                                  "be evaluated on"),
    (["--eval_data", "/e.jsonl", "--eval_steps", "0"], "--eval_steps 0: expected -1 (no evaluation during "
                                                       "training) or N >= 1"),
    (["--eval_data", "/e.jsonl", "--eval_steps", "2", "--save_best", "eval/pass@8"],
     "--save_best eval/pass@8: the evaluation samples --eval_n_samples 4 answers per prompt, so its metric is "
     "eval/pass@4"),
    (["--eval_data", "/e.jsonl", "--eval_steps", "2", "--save_best", "reward/mean"],
     "--save_best 'reward/mean': expected an eval metric: eval/greedy, eval/pass@4, eval/mean@4"),
    (["--eval_data", "/e.jsonl", "--eval_at_start", "--save_best", "eval/greedy"],
     "--save_best eval/greedy with --eval_at_start only: one evaluation has nothing to compare"),
    (["--reward_fn", "math_verify", "--reward_outage_timeout", "60"],
     "--reward_outage_timeout 60 is only used with --remote_rm_url; the reward is a local function"),
    (["--retriever_outage_timeout", "60"], "--retriever_outage_timeout 60 is only used with the search tool (--retriever_url)"),
    (["--adam_offload_ratio", "0.5", "--zero_stage", "2"],
     "--adam_offload_ratio 0.5 is only used with --adam_offload with --zero_stage 3 (DeepSpeed's partial offload); "
     "ZeRO stage 2 offloads all"),
    (["--adam_offload_ratio", "0"], "adam_offload_ratio"),
    (["--adam_offload_ratio", "1.5"], "adam_offload_ratio"),
    (["--generate_timeout", "0"], "generate_timeout"),
    (["--max_engine_restarts", "-1"], "max_engine_restarts"),
])
def test_evaluation_and_fault_flags_are_refused_where_they_would_do_nothing(extra, message):
    argv = [*SEED, *extra]
    if "--reward_fn" in extra:
        argv = [*with_flags(drop=("--remote_rm_url",)), *extra]
    assert any(message in p for p in problems_of(argv)), problems_of(argv)


def test_partial_adam_offload_needs_the_offload():
    assert parse_args([*SEED, "--adam_offload_ratio", "0.5"]).adam_offload_ratio == 0.5
    assert problems_of([*with_flags(drop=("--adam_offload",)), "--adam_offload_ratio", "0.5"]) == [
        "--adam_offload_ratio 0.5 is only used with --adam_offload with --zero_stage 3 (DeepSpeed's partial offload); "
        "the Adam states are not offloaded (drop the flag)"]


def test_fault_deadlines_default_generous_and_reach_the_config():
    cfg = parse_args(SEED)
    assert (cfg.generate_timeout, cfg.max_engine_restarts, cfg.reward_outage_timeout,
            cfg.retriever_outage_timeout) == (1800.0, 3, 300.0, 300.0)
    cfg = parse_args([*SEED, "--generate_timeout", "600", "--max_engine_restarts", "0", "--reward_outage_timeout",
                      "30"])
    assert (cfg.generate_timeout, cfg.max_engine_restarts, cfg.reward_outage_timeout) == (600.0, 0, 30.0)


def test_old_logprobs_train_only_where_the_train_forward_gives_the_old_ones():
    """--old_logprobs train is exact only while the policy has not moved: one optimizer step per rollout (the
    seed's 256 x 8 samples over batches of 128 are 16) and no KL penalty that needs them before training."""
    with pytest.raises(ConfigError) as err:
        parse_args([*SEED, "--old_logprobs", "train", "--use_kl_loss"])
    assert "--old_logprobs train with 16 optimizer steps per rollout" in str(err.value)
    assert "--train_batch_size 2048 --max_epochs 1" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_args(with_flags("--train_batch_size 2048", "--old_logprobs train"))
    assert "--old_logprobs train with a KL penalty in the reward (--init_kl_coef 0.02)" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_args(with_flags("--train_batch_size 2048", "--max_epochs 2", "--old_logprobs train", "--use_kl_loss"))
    assert "with 2 optimizer steps per rollout" in str(err.value)
    for ok in (with_flags("--train_batch_size 2048", "--old_logprobs train", "--use_kl_loss"),
               with_flags("--train_batch_size 2048", "--old_logprobs train", "--init_kl_coef 0",
                          drop=("--ref_num_nodes", "--ref_num_gpus_per_node"))):
        cfg = parse_args(ok)
        assert cfg.old_logprobs == "train" and cfg.train_steps_per_rollout == 1


def test_old_logprobs_rollout_needs_the_engines_logprobs_and_no_correction():
    cfg = parse_args([*SEED, "--old_logprobs", "rollout"])  # a KL penalty and 16 steps: the engines' stand in
    assert cfg.old_logprobs == "rollout"
    with pytest.raises(ConfigError) as err:
        parse_args([*SEED, "--old_logprobs", "rollout", "--skip_rollout_logprobs"])
    assert "--old_logprobs rollout with --skip_rollout_logprobs" in str(err.value)
    split = [a for a in SEED if a not in ("--colocate_all_models", "--vllm_enable_sleep")]
    with pytest.raises(ConfigError) as err:
        parse_args([*split, "--async_train", "--is_correction", "tis", "--old_logprobs", "rollout"])
    assert "--old_logprobs rollout with --is_correction tis" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_args([*SEED, "--old_logprobs", "engine"])
    assert "--old_logprobs 'engine': expected one of policy, train, rollout" in str(err.value)
