"""The OpenRLHF flag table (trainer/config/openrlhf.py) is complete for the seed's version and v0.8.4, the
parser follows it (a refused flag stops with its reason, an 'off' value passes, a difference is in --help),
and seed 000's verl overrides are answered with the flag that carries their meaning."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config import TrainerConfig
from trainer.config.cli import build_parser, parse_args
from trainer.config.fields import flag_specs
from trainer.config.openrlhf import DOTTED, FLAGS, OWN_FLAGS, markdown, refusal
from trainer.config.verl import VERL_KEYS

REPO = Path(__file__).resolve().parents[2]

def _words(text: str) -> list[str]:
    return text.split()


# The flag names of openrlhf/cli/train_ppo_ray.py (the `--name` strings of its add_argument calls):
# the seed's xDAN-RL-Training-GRPO checkout (version.txt 0.6.2) and upstream OpenRLHF v0.8.4.
SEED_FLAGS = _words("""
actor_init_on_gpu actor_learning_rate actor_num_gpus_per_node actor_num_nodes adam_betas adam_offload
advantage_estimator apply_chat_template aux_loss_coef bf16 ckpt_path colocate_actor_ref colocate_all_models
colocate_critic_reward critic_learning_rate critic_num_gpus_per_node critic_num_nodes critic_pretrain
deepspeed_enable_sleep disable_ds_ckpt disable_fast_tokenizer drop_maxlen enable_ema enable_prefix_caching
enforce_eager eps_clip eval_steps exclude_modules flash_attn freeze_prefix freezing_actor_steps
full_determinism gamma generate_max_len grad_accum_dtype gradient_checkpointing
gradient_checkpointing_use_reentrant init_kl_coef input_key input_template kl_estimator kl_target l2
label_key lambd load_checkpoint load_in_4bit local_rank logging_steps lora_alpha lora_dropout lora_rank
lr_warmup_ratio max_ckpt_mem max_ckpt_num max_epochs max_len max_norm max_samples micro_rollout_batch_size
micro_train_batch_size n_samples_per_prompt normalize_reward num_episodes overlap_comm packing_samples perf
pretrain pretrain_data pretrain_data_probs pretrain_split processor_kwargs prompt_data prompt_data_probs
prompt_max_len prompt_split ptx_coef ref_num_gpus_per_node ref_num_nodes ref_reward_offload remote_rm_url
reward_clip_range reward_num_gpus_per_node reward_num_nodes reward_pretrain ring_attn_size ring_head_stride
rollout_batch_size save_hf_ckpt save_path save_steps save_value_network seed target_modules temperature
top_p torch_compile train_batch_size universal_ckpt use_kl_loss use_liger_kernel use_ms use_tensorboard
use_wandb value_clip value_head_prefix vllm_enable_sleep vllm_gpu_memory_utilization vllm_num_engines
vllm_sync_backend vllm_sync_with_ray vllm_tensor_parallel_size wandb_group wandb_org wandb_project
wandb_run_name zero_stage zpg
""")
V084_FLAGS = _words("""
actor_init_on_gpu actor_learning_rate actor_num_gpus_per_node actor_num_nodes adam_betas adam_offload
advantage_estimator agent_func_path apply_chat_template async_train aux_loss_coef bf16 ckpt_path
colocate_actor_ref colocate_all_models colocate_critic_reward critic_learning_rate critic_num_gpus_per_node
critic_num_nodes critic_pretrain deepcompile deepspeed_enable_sleep disable_ds_ckpt disable_fast_tokenizer
ds_tensor_parallel_size dynamic_filtering dynamic_filtering_reward_range ema_beta enable_ema
enable_prefix_caching enforce_eager entropy_loss_coef eps_clip eps_clip_low_high eval_dataset
eval_n_samples_per_prompt eval_split eval_steps eval_temperature flash_attn freezing_actor_steps
full_determinism gamma generate_max_len grad_accum_dtype gradient_checkpointing
gradient_checkpointing_use_reentrant init_kl_coef input_key input_template kl_estimator kl_horizon kl_target
l2 label_key lambd load_checkpoint load_in_4bit local_rank logging_steps lora_alpha lora_dropout lora_rank
lr_warmup_ratio max_ckpt_mem max_ckpt_num max_epochs max_len max_norm max_samples micro_rollout_batch_size
micro_train_batch_size n_samples_per_prompt no_advantage_std_norm normalize_reward num_episodes overlap_comm
packing_samples perf pretrain prompt_data prompt_data_probs prompt_max_len prompt_split ptx_coef
ref_num_gpus_per_node ref_num_nodes ref_reward_offload remote_rm_url reward_clip_range
reward_num_gpus_per_node reward_num_nodes reward_pretrain ring_attn_size ring_head_stride rollout_batch_size
save_hf_ckpt save_path save_steps save_value_network seed target_modules temperature top_p train_batch_size
use_ds_universal_ckpt use_kl_loss use_liger_kernel use_ms use_tensorboard use_wandb value_clip
value_head_prefix vllm_enable_sleep vllm_generate_batch_size vllm_gpu_memory_utilization vllm_num_engines
vllm_sync_backend vllm_sync_with_ray vllm_tensor_parallel_size wandb_group wandb_org wandb_project
wandb_run_name zero_stage zpg
""")

MINIMAL = ["--pretrain", "/m", "--prompt_data", "/d.jsonl", "--reward_fn", "pkg.mod:fn", "--actor_num_nodes", "1",
           "--actor_num_gpus_per_node", "1", "--rollout_batch_size", "8", "--train_batch_size", "8",
           "--advantage_estimator", "reinforce"]
OURS = {spec.name for spec in flag_specs(TrainerConfig)}


# --- the table ---------------------------------------------------------------------------------------------
def test_every_flag_of_both_versions_is_in_the_table_with_its_version():
    assert (len(SEED_FLAGS), len(V084_FLAGS)) == (118, 126)
    assert set(FLAGS) == set(SEED_FLAGS) | set(V084_FLAGS)
    for name, row in FLAGS.items():
        expected = "both" if name in SEED_FLAGS and name in V084_FLAGS else "seed" if name in SEED_FLAGS else "0.8.4"
        assert row.versions == expected, name


def test_the_table_and_the_trainers_flags_agree():
    for name, row in FLAGS.items():
        if row.status == "refused":
            assert name not in OURS, f"--{name} is a trainer flag but the table refuses it"
            assert row.note, name
        else:
            assert DOTTED.get(name, row.flag) in OURS, f"--{name} is '{row.status}' in the table but the trainer has no such flag"
            assert bool(row.note) == (row.status == "differs"), name
            assert not row.off, name
    assert {DOTTED.get(n, r.flag) for n, r in FLAGS.items() if r.status != "refused"} | set(OWN_FLAGS) == OURS
    assert not set(OWN_FLAGS) & set(FLAGS)


def test_markdown_has_one_row_per_flag():
    text = subprocess.run([sys.executable, "-m", "trainer.config.openrlhf"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout
    rows = [line for line in text.splitlines() if line.startswith("| `--")]
    assert len(rows) == len(FLAGS) == 135
    assert "| `--normalize_reward` | both | differs | OpenRLHF normalises a reward *model's* output" in text
    assert text == markdown() + "\n"


# --- the parser follows it -------------------------------------------------------------------------------------
def _values(nargs) -> list[str]:
    return {0: [], 1: ["7"], 2: ["1", "2"], "*": ["a", "b"], "+": ["a"]}[nargs]


@pytest.mark.parametrize("name", sorted(n for n, r in FLAGS.items() if r.status == "refused"))
def test_a_refused_flag_stops_the_parse_with_its_reason(name, capsys):
    row = FLAGS[name]
    with pytest.raises(SystemExit) as info:
        parse_args([*MINIMAL, f"--{name}", *_values(row.nargs)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"--{name}: OpenRLHF flag not supported here: {row.note}" in err
    assert "unexpected argument" not in err  # its values were taken as its own


@pytest.mark.parametrize("name", sorted(n for n, r in FLAGS.items() if r.off))
def test_a_refused_flags_off_value_is_accepted(name):
    row = FLAGS[name]
    assert parse_args([*MINIMAL, f"--{name}", row.off[0]]) == parse_args(MINIMAL)
    assert parse_args([*MINIMAL, f"--{name}={row.off[0]}"]) == parse_args(MINIMAL)
    assert refusal(name, "99") is not None


def test_every_difference_is_in_the_flags_help():
    text = " ".join(build_parser().format_help().split())
    for name, row in FLAGS.items():
        if row.status == "differs":
            assert " ".join(f"OpenRLHF difference: {row.note}.".split()) in text, name
    assert "with --remote_rm_url it does nothing; here it normalises every reward source" in text


def test_the_seed_command_still_parses_and_refusals_are_reported_together(capsys):
    from tests.unit.test_config import SEED as seed

    assert parse_args(seed).advantage_estimator == "rloo"
    with pytest.raises(SystemExit):
        parse_args([*seed, "--lora_rank", "16", "--kl_target", "0.1", "--rollout_batch_sz", "3"])
    err = capsys.readouterr().err
    assert "--lora_rank: OpenRLHF flag not supported here: LoRA" in err
    assert "--kl_target: OpenRLHF flag not supported here: the adaptive KL controller" in err
    assert "unknown flag --rollout_batch_sz (did you mean --rollout_batch_size?)" in err


# --- seed 000's verl job --------------------------------------------------------------------------------------
SEED_000 = shlex.split("""
data.train_files=$DATA_DIR/train.parquet data.val_files=$DATA_DIR/test.parquet data.train_data_num=null
data.val_data_num=null data.train_batch_size=512 data.val_batch_size=256 data.max_prompt_length=4096
data.max_response_length=500 data.max_start_length=2048 data.max_obs_length=500
data.shuffle_train_dataloader=True algorithm.adv_estimator=gae actor_rollout_ref.model.path=$BASE_MODEL
actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.model.enable_gradient_checkpointing=true
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.285
actor_rollout_ref.actor.ppo_mini_batch_size=256 actor_rollout_ref.actor.ppo_micro_batch_size=64
actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.grad_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.log_prob_micro_batch_size=128
actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.ref.log_prob_micro_batch_size=128
actor_rollout_ref.ref.fsdp_config.param_offload=False actor_rollout_ref.rollout.n_agent=1
actor_rollout_ref.rollout.temperature=1 actor_rollout_ref.rollout.top_p=1.0
actor_rollout_ref.actor.state_masking=true critic.optim.lr=1e-5 critic.model.use_remove_padding=True
critic.optim.lr_warmup_steps_ratio=0.015 critic.model.path=$BASE_MODEL
critic.model.enable_gradient_checkpointing=true critic.ppo_micro_batch_size=16
critic.model.fsdp_config.param_offload=False critic.model.fsdp_config.grad_offload=False
critic.model.fsdp_config.optimizer_offload=False algorithm.kl_ctrl.kl_coef=0.001
algorithm.no_think_rl=false trainer.critic_warmup=0 trainer.logger=['wandb'] +trainer.val_only=false
+trainer.val_before_train=false trainer.default_hdfs_dir=null trainer.n_gpus_per_node=8
trainer.nnodes=$N_NODES trainer.save_freq=100 trainer.test_freq=100 trainer.project_name=$WAND_PROJECT
trainer.experiment_name=$EXPERIMENT_NAME trainer.total_epochs=15 trainer.total_training_steps=1005
trainer.default_hdfs_dir=null trainer.default_local_dir=verl_checkpoints/$EXPERIMENT_NAME max_turns=4
retriever.url="http://127.0.0.1:8000/retrieve" retriever.topk=3
""")


def test_seed_000_overrides_are_all_in_the_verl_table():
    keys = [arg.split("=", 1)[0].lstrip("+") for arg in SEED_000]
    assert len(keys) == 61 and len(set(keys)) == 60
    assert set(keys) == set(VERL_KEYS)
    seed_file = sorted((REPO.parent / "shared" / "seeds").glob("000_*.txt"))
    if seed_file:  # beside a checkout on the project's machine: the runbook says the same
        text = seed_file[0].read_text()
        assert all(f"{k}=" in text for k in keys)


def test_seed_000_overrides_get_the_equivalent_flag_not_a_bare_unexpected_argument(capsys):
    with pytest.raises(SystemExit):
        parse_args([*MINIMAL, *SEED_000])
    err = capsys.readouterr().err
    assert "unexpected argument" not in err
    lines = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(lines) == 61
    for key, where in (("trainer.total_training_steps", "--max_steps"), ("critic.ppo_micro_batch_size",
                       "--critic_micro_train_batch_size"), ("trainer.critic_warmup", "--freezing_actor_steps"),
                       ("critic.optim.lr_warmup_steps_ratio", "--critic_lr_warmup_ratio"),
                       ("data.train_batch_size", "--rollout_batch_size"), ("retriever.url", "--retriever_url")):
        assert any(key in line and where in line and "preset 7b-ppo" in line for line in lines), key


def test_other_verl_keys_get_the_general_hint(capsys):
    with pytest.raises(SystemExit):
        parse_args([*MINIMAL, "actor_rollout_ref.actor.entropy_coeff=0.01", "stray"])
    err = capsys.readouterr().err
    assert "looks like a verl (Hydra) override: this trainer takes OpenRLHF-style --flags" in err
    assert "unexpected argument 'stray'" in err

