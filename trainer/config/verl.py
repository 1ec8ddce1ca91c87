"""verl's ``key=value`` overrides (seed 000's Search-R1 job) and where each one went here.

A verl job is configured by Hydra overrides (``data.train_batch_size=512``); this trainer takes
OpenRLHF-style ``--flags``. The parser does not guess a value conversion (verl's batch sizes are global
where ours are per GPU, its sizes count prompts where ours count samples): it answers an override with
the flag or preset that carries its meaning, or why nothing does. Preset ``7b-ppo``
(``rlrun/presets/7b-ppo.yaml``) is seed 000's job translated, with the arithmetic in its header.

:data:`VERL_KEYS` covers every override of seed 000 (60 keys; it sets ``trainer.default_hdfs_dir``
twice); other verl keys get a general hint.
"""

from __future__ import annotations

import re

_PER_GPU = "per GPU here: divide verl's global value by the group's GPUs"
_FSDP = "DeepSpeed ZeRO-3 here; parameter and gradient offload are not implemented (optimizer: --adam_offload)"

VERL_KEYS: dict[str, str] = {
    "data.train_files": "--prompt_data (one local .parquet / .jsonl / .json file)",
    "data.val_files": "--eval_data (one local .parquet / .jsonl / .json file)",
    "data.train_data_num": "--max_samples (null: all)",
    "data.val_data_num": "no cap on the evaluation prompts: --eval_data is evaluated whole",
    "data.train_batch_size": "--rollout_batch_size (prompts per rollout step)",
    "data.val_batch_size": "the evaluation prompts are spread over the engines at once (no batch size)",
    "data.max_prompt_length": "--prompt_max_len",
    "data.max_response_length": "--generate_max_len",
    "data.max_start_length": "--prompt_max_len (the first prompt; with --retriever_url the later turns' text is "
    "response: --generate_max_len covers generated and inserted tokens)",
    "data.max_obs_length": "no separate cap: an <information> block is cut to what is left of --generate_max_len",
    "data.shuffle_train_dataloader": "always on: each episode visits the prompts in a seeded shuffled order (--seed)",
    "algorithm.adv_estimator": "--advantage_estimator (gae; verl's grpo is group_norm, reinforce_plus_plus is "
    "reinforce, rloo is rloo)",
    "algorithm.kl_ctrl.kl_coef": "--init_kl_coef",
    "algorithm.no_think_rl": "a Search-R1 option; not implemented",
    "actor_rollout_ref.model.path": "--pretrain",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "--gradient_checkpointing (one switch for every model)",
    "actor_rollout_ref.model.use_remove_padding": "--packing_samples (one switch for every model)",
    "actor_rollout_ref.actor.optim.lr": "--actor_learning_rate",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "--lr_warmup_ratio (verl's rate is constant after "
    "the warm-up: --lr_scheduler constant_with_warmup)",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "--train_batch_size (samples per optimizer step)",
    "actor_rollout_ref.actor.ppo_micro_batch_size": f"--micro_train_batch_size ({_PER_GPU})",
    "actor_rollout_ref.actor.fsdp_config.param_offload": _FSDP,
    "actor_rollout_ref.actor.fsdp_config.grad_offload": _FSDP,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "--adam_offload",
    "actor_rollout_ref.actor.state_masking": "--state_masking (preset search-r1-ppo)",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": f"--micro_rollout_batch_size ({_PER_GPU})",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "--vllm_tensor_parallel_size",
    "actor_rollout_ref.rollout.name": "--rollout_backend vllm (sglang is not supported)",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "--vllm_gpu_memory_utilization",
    "actor_rollout_ref.rollout.n_agent": "--n_samples_per_prompt",
    "actor_rollout_ref.rollout.temperature": "--temperature",
    "actor_rollout_ref.rollout.top_p": "--top_p",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": f"--micro_rollout_batch_size (one size for the policy and "
    f"the reference; {_PER_GPU})",
    "actor_rollout_ref.ref.fsdp_config.param_offload": _FSDP,
    "critic.optim.lr": "--critic_learning_rate",
    "critic.optim.lr_warmup_steps_ratio": "--critic_lr_warmup_ratio",
    "critic.model.path": "--critic_pretrain",
    "critic.model.enable_gradient_checkpointing": "--gradient_checkpointing (one switch for every model)",
    "critic.model.use_remove_padding": "--packing_samples (one switch for every model)",
    "critic.ppo_micro_batch_size": f"--critic_micro_train_batch_size ({_PER_GPU})",
    "critic.model.fsdp_config.param_offload": _FSDP,
    "critic.model.fsdp_config.grad_offload": _FSDP,
    "critic.model.fsdp_config.optimizer_offload": "--adam_offload",
    "trainer.critic_warmup": "--freezing_actor_steps (0: none)",
    "trainer.logger": "--use_wandb for ['wandb']; the console and the @metrics lines are always on",
    "trainer.val_only": "no evaluation-only run (--eval_at_start evaluates before the first step, then trains)",
    "trainer.val_before_train": "--eval_at_start",
    "trainer.test_freq": "--eval_steps",
    "trainer.default_hdfs_dir": "no HDFS copy: checkpoints stay under --ckpt_path on the nodes' file system",
    "trainer.default_local_dir": "--ckpt_path (checkpoints) and --save_path (the final model)",
    "trainer.n_gpus_per_node": "--actor_num_gpus_per_node (and --ref_/--critic_num_gpus_per_node)",
    "trainer.nnodes": "--actor_num_nodes (and --ref_/--critic_num_nodes)",
    "trainer.save_freq": "--save_steps",
    "trainer.project_name": "--wandb_project",
    "trainer.experiment_name": "--wandb_run_name",
    "trainer.total_epochs": "--num_episodes",
    "trainer.total_training_steps": "--max_steps",
    "max_turns": "--max_turns (preset search-r1-ppo)",
    "retriever.url": "--retriever_url; {node_ip} names the node-local service (preset search-r1-ppo)",
    "retriever.topk": "--retriever_topk (preset search-r1-ppo)",
}

_OVERRIDE_RE = re.compile(r"^[+~]{0,2}([A-Za-z_][\w]*(?:\.[\w]+)*)=")


def override_hint(arg: str) -> str | None:
    """The message for ``arg`` if it is a verl / Hydra ``key=value`` override, else None."""
    match = _OVERRIDE_RE.match(arg)
    if not match:
        return None
    key = match.group(1)
    where = VERL_KEYS.get(key)
    if where is None:
        return (f"{arg!r} looks like a verl (Hydra) override: this trainer takes OpenRLHF-style --flags (see "
                "--help); preset 7b-ppo translates seed 000's verl job")
    return f"{arg!r} is a verl override: here {where} (preset 7b-ppo translates seed 000's verl job)"
