"""Every flag of OpenRLHF's ``python -m openrlhf.cli.train_ppo_ray``, and what this trainer does with it.

This is the one table: the parser (``trainer.config.cli``) reads it, so a refused flag is refused with
its reason here and a flag that works differently carries its difference into ``--help``.
``python -m trainer.config.openrlhf`` prints it as a Markdown table; the README links this file.

Which OpenRLHF: seed 004 submits ``python3 -m openrlhf.cli.train_ppo_ray`` from a checkout of
xDAN-RL-Training-GRPO, a fork of LMM-R1 whose ``version.txt`` says **0.6.2**: its ``train_ppo_ray`` is
upstream v0.6.2's (118 flags: v0.6.2's, plus ``--universal_ckpt`` from v0.6.3 and four LMM-R1 flags).
The issue that asked for this table checked the math against **v0.8.4**, and users of a current
OpenRLHF come with its flags, so the table holds both: every flag of the seed's version (``seed``) and
of v0.8.4 (``0.8.4``), 135 in all. The math follows v0.8.4 where the two differ (token-level loss
mean, defaults of ``--lambd`` / ``--value_clip`` / ``--vllm_gpu_memory_utilization``); the rows say so.

Statuses:

- ``same``: the flag does what OpenRLHF's does.
- ``differs``: supported, with the difference stated here and in ``--help``.
- ``refused``: not supported; the parser stops with the reason. A refused flag given with a value that
  means exactly what this trainer does anyway (``off``: ``--ring_attn_size 1``, ``--lora_rank 0``) is
  accepted, so existing scripts that spell out OpenRLHF's defaults still run.

One difference holds for every supported flag: set to anything but its default where the configuration
does not use it (``--critic_learning_rate`` with rloo, ``--kl_estimator`` with ``--init_kl_coef 0``,
``--save_hf_ckpt`` without ``--save_steps``), it is refused where OpenRLHF ignores it
(``trainer.config.rules``). Flags of this trainer that those versions lack are in :data:`OWN_FLAGS`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

Status = Literal["same", "differs", "refused"]
Versions = Literal["both", "seed", "0.8.4"]


@dataclass(frozen=True)
class OpenRLHFFlag:
    """One flag of OpenRLHF's train_ppo_ray and what happens to it here."""

    name: str
    status: Status
    note: str  # differs: the difference; refused: why, in one line; same: ""
    versions: Versions = "both"  # in the seed's version (0.6.2 fork), in v0.8.4, or both
    nargs: int | str = 1  # how OpenRLHF parses it (0: a switch; 2: two values; "*"/"+": a list)
    off: tuple[str, ...] = ()  # refused flags: values meaning what this trainer does (accepted)
    ours: str | None = None  # supported under another name here (both spellings are accepted)

    @property
    def flag(self) -> str:
        """This trainer's name of the flag (the field of TrainerConfig it sets)."""
        return self.ours or self.name


def _same(name: str, versions: Versions = "both") -> OpenRLHFFlag:
    return OpenRLHFFlag(name, "same", "", versions)


def _differs(name: str, note: str, versions: Versions = "both") -> OpenRLHFFlag:
    return OpenRLHFFlag(name, "differs", note, versions)


def _alias(name: str, ours: str, note: str = "", versions: Versions = "both") -> OpenRLHFFlag:
    """A flag this trainer spells ``--ours``; OpenRLHF's name is accepted as well."""
    return OpenRLHFFlag(name, "differs" if note else "same", note, versions, ours=ours)


def _refused(name: str, why: str, nargs: int | str = 1, off: tuple[str, ...] = (),
             versions: Versions = "both") -> OpenRLHFFlag:
    return OpenRLHFFlag(name, "refused", why, versions, nargs, off)


_NO_RM = "no reward model runs inside the job: rewards come from --remote_rm_url or --reward_fn"
_NO_LORA = "LoRA is not implemented: every parameter of the policy trains"
_NO_PTX = "PPO-ptx (a supervised loss on pretraining data) is not implemented"
_LMM = "an LMM-R1 (vision-language) option of the seed's fork; this trainer trains text-only models"
_FIXED_KL = "the adaptive KL controller is not implemented: the coefficient stays --init_kl_coef"
_UNIVERSAL = ("not needed to resume on another GPU count: --load_checkpoint converts a group saved by another "
              "number of ranks to DeepSpeed's universal checkpoint by itself (once, kept beside it); given, every group "
              "loads that way, also on the same count. Checkpoints are written as DeepSpeed writes them and converted "
              "on resume (OpenRLHF: the user converts with ds_to_universal)")

FLAGS: dict[str, OpenRLHFFlag] = {
    f.name: f
    for f in (
        # --- placement (Ray) ------------------------------------------------------------------------
        _same("actor_num_nodes"),
        _same("actor_num_gpus_per_node"),
        _same("ref_num_nodes"),
        _same("ref_num_gpus_per_node"),
        _same("critic_num_nodes"),
        _same("critic_num_gpus_per_node"),
        _refused("reward_num_nodes", _NO_RM),
        _refused("reward_num_gpus_per_node", _NO_RM),
        _same("colocate_actor_ref"),
        _refused("colocate_critic_reward", _NO_RM, nargs=0),
        _same("colocate_all_models"),
        _differs("async_train", "weights are pushed between two rollouts (no partial rollouts); --max_staleness bounds how old "
                 "a rollout may be; refused with --colocate_all_models", versions="0.8.4"),
        # --- vLLM -----------------------------------------------------------------------------------
        _differs("vllm_num_engines", "default 1 engine (OpenRLHF's default None means no vLLM); 0 does not mean "
                 "'no vLLM': HF generate() rollouts are --rollout_backend hf"),
        _same("vllm_tensor_parallel_size"),
        _differs("vllm_sync_backend", "on a cluster without GPUs the broadcast uses gloo whatever is given; engines "
                 "colocated on a GPU get safetensors bytes through Ray (NCCL cannot pair two processes on one GPU)"),
        _refused("vllm_sync_with_ray", "weights go by a torch.distributed broadcast (--vllm_sync_backend), not "
                 "through Ray's collective API", nargs=0),
        _same("enable_prefix_caching"),
        _same("enforce_eager"),
        _differs("vllm_enable_sleep", "refused without --colocate_all_models (OpenRLHF silently turns it off)"),
        _differs("vllm_gpu_memory_utilization", "default 0.95 as v0.8.4 (the seed's version: 0.9)"),
        _refused("vllm_generate_batch_size", "each engine generates its whole share of the rollout batch at once "
                 "(OpenRLHF's default, --rollout_batch_size)", versions="0.8.4"),
        # --- checkpoints ----------------------------------------------------------------------------
        _same("eval_steps"),
        _same("save_steps"),
        _same("logging_steps"),
        _same("ckpt_path"),
        _same("save_hf_ckpt"),
        _refused("disable_ds_ckpt", "checkpoints always hold the DeepSpeed state: an exact resume needs it",
                 nargs=0),
        _same("max_ckpt_num"),
        _refused("max_ckpt_mem", "checkpoints are limited by count (--max_ckpt_num), not by size"),
        _same("load_checkpoint"),
        _differs("universal_ckpt", _UNIVERSAL, versions="seed"),  # the same switch (DOTTED)
        _differs("use_ds_universal_ckpt", _UNIVERSAL, versions="0.8.4"),
        # --- DeepSpeed ------------------------------------------------------------------------------
        _refused("local_rank", "ranks are assigned by Ray, not by a launcher", off=("-1",)),
        _same("zero_stage"),
        _same("gradient_checkpointing"),
        _refused("torch_compile", "models are not torch.compile'd", nargs=0, versions="seed"),
        _refused("deepcompile", "DeepSpeed's DeepCompile is not enabled", nargs=0, versions="0.8.4"),
        _same("bf16"),
        _refused("enable_ema", "EMA weights are not kept", nargs=0),
        _refused("ema_beta", "EMA weights are not kept", versions="0.8.4"),
        _refused("zpg", "ZeRO++ hierarchical partitioning is not set up", off=("1",)),
        _same("adam_offload"),
        _refused("adam_betas", "AdamW keeps torch's betas (0.9, 0.999), not OpenRLHF's (0.9, 0.95): not "
                 "configurable yet", nargs=2),
        _refused("actor_init_on_gpu", "models load through from_pretrained under HfDeepSpeedConfig (ZeRO-3 "
                 "partitions at load); where weights are first materialised is not selectable", nargs=0),
        _differs("flash_attn", "needs CUDA and the flash-attn package on the nodes, else the job stops at "
                 "start-up; without it attention is PyTorch SDPA"),
        _differs("use_liger_kernel", "Liger's RMSNorm, rotary and SwiGLU kernels in the policy, reference and "
                 "critic, not its fused linear cross-entropy (OpenRLHF loads the model with "
                 "AutoLigerKernelForCausalLM); needs CUDA and liger-kernel on the nodes, else the job stops at "
                 "start-up"),
        _refused("grad_accum_dtype", "gradients accumulate in the training dtype"),
        _refused("overlap_comm", "DeepSpeed's overlap_comm is left at its default", nargs=0),
        _refused("gradient_checkpointing_use_reentrant", "gradient checkpointing is always non-reentrant",
                 nargs=0),
        _refused("disable_fast_tokenizer", "the tokenizer is AutoTokenizer's default (fast where one exists)",
                 nargs=0),
        _refused("deepspeed_enable_sleep", "DeepSpeed states are not offloaded between phases (vLLM's are, with "
                 "--vllm_enable_sleep)", nargs=0),
        _refused("ds_tensor_parallel_size", "DeepSpeed tensor parallelism is not implemented", off=("1",),
                 versions="0.8.4"),
        _differs("packing_samples", "works without --flash_attn (SDPA with a block-diagonal mask) and with "
                 "--rollout_backend hf; OpenRLHF turns --flash_attn on and requires vLLM"),
        # --- LoRA -----------------------------------------------------------------------------------
        _refused("load_in_4bit", "quantised (QLoRA) training is not implemented", nargs=0),
        _refused("lora_rank", _NO_LORA, off=("0",)),
        _refused("lora_alpha", _NO_LORA),
        _refused("target_modules", _NO_LORA, nargs="*"),
        _refused("exclude_modules", _NO_LORA, nargs="*", versions="seed"),
        _refused("lora_dropout", _NO_LORA),
        # --- PPO ------------------------------------------------------------------------------------
        _same("save_path"),
        _same("num_episodes"),
        _same("rollout_batch_size"),
        _same("micro_rollout_batch_size"),
        _same("max_epochs"),
        _differs("prompt_max_len", "a longer prompt is dropped (and counted in the job's data line), not "
                 "truncated"),
        _same("generate_max_len"),
        _refused("max_len", "deprecated in OpenRLHF: use --prompt_max_len and --generate_max_len"),
        _same("max_samples"),
        _same("max_norm"),
        _same("l2"),
        _refused("ptx_coef", _NO_PTX),
        _same("eps_clip"),
        _same("eps_clip_low_high", versions="0.8.4"),
        _differs("value_clip", "default 0.5 as v0.8.4 (the seed's version: 0.2); 'none' turns value clipping off"),
        _differs("lambd", "default 1.0 as v0.8.4 (the seed's version: 0.95)"),
        _differs("gamma", "refused (not silently reset to 1) with rloo / reinforce_baseline / group_norm / "
                 "dr_grpo"),
        _same("micro_train_batch_size"),
        _same("train_batch_size"),
        _differs("normalize_reward", "OpenRLHF normalises a reward *model's* output with the mean/std stored with "
                 "that model, so with --remote_rm_url it does nothing; here it normalises every reward source "
                 "(remote service or function) with the running mean/std of all scores seen so far"),
        _same("top_p"),
        _same("temperature"),
        _same("seed"),
        _refused("full_determinism", "--seed seeds every process but deterministic kernels are not forced",
                 nargs=0),
        _same("freezing_actor_steps"),
        _same("n_samples_per_prompt"),
        _differs("save_value_network", "the critic is saved (to <save_path>_critic) whether it is given or not; "
                 "refused with an estimator that has no critic"),
        _same("actor_learning_rate"),
        _same("critic_learning_rate"),
        _same("lr_warmup_ratio"),
        _refused("kl_target", _FIXED_KL),
        _refused("kl_horizon", _FIXED_KL, versions="0.8.4"),
        _same("init_kl_coef"),
        _differs("kl_estimator", "k3 is clamped to [-10, 10] against overflow (as later OpenRLHF); v0.8.4 and the "
                 "seed's version do not clamp"),
        _refused("aux_loss_coef", "the MoE load-balancing loss is not added", off=("0",)),
        _refused("entropy_loss_coef", "no entropy loss (or entropy metric)", versions="0.8.4"),
        _same("reward_clip_range"),
        _refused("freeze_prefix", _LMM, nargs="+", versions="seed"),
        _refused("drop_maxlen", _LMM, nargs=0, versions="seed"),
        _refused("processor_kwargs", _LMM, versions="seed"),
        _differs("advantage_estimator", "the same six estimators (v0.8.4's; the seed's version lacks dr_grpo); "
                 "rloo's batch whitening is --rloo_whiten (on: OpenRLHF <= 0.8.4, off: >= 0.8.5); dr_grpo needs "
                 "--n_samples_per_prompt > 1 (with 1 its advantages are all 0); the policy loss is the token mean "
                 "over each micro-batch as v0.8.4 (the seed's v0.6.2 averaged each sequence first)"),
        _differs("use_kl_loss", "refused with --init_kl_coef 0 (there would be no reference model to take the KL "
                 "to); the loss uses --kl_estimator as printed (this trainer used k3 whatever was given before "
                 "issue 16)"),
        _same("no_advantage_std_norm", versions="0.8.4"),
        # --- context parallel -----------------------------------------------------------------------
        _refused("ring_attn_size", "ring attention (context parallelism) is not implemented", off=("1",)),
        _refused("ring_head_stride", "ring attention (context parallelism) is not implemented", off=("1",)),
        # --- models ---------------------------------------------------------------------------------
        _same("pretrain"),
        _refused("reward_pretrain", _NO_RM),
        _differs("remote_rm_url", "one URL or a comma-separated list (requests spread over them); the cluster "
                 "token is sent as a bearer token; --remote_rm_timeout / --remote_rm_retries; a local .py "
                 "reward script is --reward_fn package.module:function"),
        _same("critic_pretrain"),
        _refused("value_head_prefix", "the critic is the policy's backbone with a new value head, zero-initialised "
                 "(saved as value_head.safetensors); a reward model's head is not loaded"),
        _refused("ref_reward_offload", "the reference model stays on its devices (no reward model runs here)",
                 nargs=0),
        _refused("agent_func_path", "agent (multi-turn) rollouts are not implemented", versions="0.8.4"),
        # --- data -----------------------------------------------------------------------------------
        _differs("prompt_data", "one local .jsonl / .json / .parquet file (no hub names, no comma-separated "
                 "mixtures): there is no model or dataset hub on the nodes"),
        _refused("prompt_data_probs", "one prompt dataset (no mixtures)", off=("1.0", "1")),
        _refused("prompt_split", "prompt data is one local file: its records are the train split", off=("train",)),
        _refused("pretrain_data", _NO_PTX, versions="seed"),
        _refused("pretrain_data_probs", _NO_PTX, versions="seed"),
        _refused("pretrain_split", _NO_PTX, versions="seed"),
        _alias("eval_dataset", "eval_data", "one local .jsonl / .json / .parquet file, as --prompt_data; with "
               "--remote_rm_url or --reward_fn alike (OpenRLHF needs a remote reward)", versions="0.8.4"),
        _refused("eval_split", "evaluation data is one local file: all its records are evaluated", off=("train",),
                 versions="0.8.4"),
        _differs("eval_temperature", "default 0.6 as OpenRLHF 0.11 (a greedy pass at temperature 0 is logged "
                 "beside the sampled one, eval/greedy)", versions="0.8.4"),
        _alias("eval_n_samples_per_prompt", "eval_n_samples", versions="0.8.4"),
        _same("input_key"),
        _same("label_key"),
        _differs("input_template", "refused (not ignored with a warning) when it has no '{}' or is combined with "
                 "--apply_chat_template"),
        _same("apply_chat_template"),
        # --- logging --------------------------------------------------------------------------------
        _differs("use_wandb", "a bare --use_wandb takes the key from WANDB_API_KEY; the key is redacted in "
                 "--print-config"),
        _refused("wandb_org", "W&B runs go to the key's default entity"),
        _refused("wandb_group", "W&B runs are not grouped"),
        _same("wandb_project"),
        _same("wandb_run_name"),
        _differs("dynamic_filtering", "also drops prompts whose samples all score alike; draws at most "
                 "--dynamic_filtering_max_rounds rollouts per batch", versions="0.8.4"),
        _same("dynamic_filtering_reward_range", versions="0.8.4"),
        _differs("use_tensorboard", "a bare --use_tensorboard logs to <save_path>/tensorboard"),
        _refused("perf", "no separate performance report: every step logs timing/* and token counts", nargs=0),
        _refused("use_ms", "no model hub here (ModelScope included): give local paths", nargs=0),
    )
}

# Flags of this trainer that neither of those OpenRLHF versions has.
OWN_FLAGS: dict[str, str] = {
    "rollout_backend": "vllm engines or HF generate() (OpenRLHF: --vllm_num_engines 0)",
    "sync_bucket_bytes": "bucket size of the policy -> engines weight broadcast",
    "vllm_cudagraph_mode": "which engine steps run as CUDA graphs (vLLM's cudagraph_mode)",
    "vllm_compile": "how GPU engines compile the model: Inductor, Dynamo's graph alone, or not at all",
    "adam_offload_ratio": "with --adam_offload: the share of the Adam states on the host (DeepSpeed partial offload)",
    "reward_fn": "a local reward function (OpenRLHF >= 0.8: a .py path in --remote_rm_url)",
    "remote_rm_timeout": "seconds before a remote reward request times out",
    "remote_rm_retries": "retries of a failed remote reward request",
    "sft_output_key": "the targets of the supervised warm-up",
    "sft_data": "the supervised warm-up's own data (default: the prompt data)",
    "sft_warmup_steps": "supervised steps before RL",
    "sft_learning_rate": "learning rate of the supervised warm-up",
    "lr_scheduler": "cosine_with_min_lr or constant_with_warmup (OpenRLHF >= 0.8.5 has it)",
    "max_steps": "stop after N rollout steps (verl's trainer.total_training_steps)",
    "critic_micro_train_batch_size": "the critic's micro-batch (verl's critic.ppo_micro_batch_size / GPUs)",
    "critic_lr_warmup_ratio": "the critic's LR warm-up (verl's critic.optim.lr_warmup_steps_ratio)",
    "dual_clip": "dual-clip PPO (OpenRLHF >= 0.8.9)",
    "rloo_whiten": "whiten rloo advantages over the batch (OpenRLHF <= 0.8.4) or not (>= 0.8.5)",
    "metrics_path": "metrics as JSON lines in this file (default <save_path>/metrics.jsonl), one row per step",
    "retriever_url": "multi-turn search rollouts against this retrieval service (Search-R1's retriever.url)",
    "max_turns": "most tool calls per sample (Search-R1's max_turns)",
    "retriever_topk": "passages per search (Search-R1's retriever.topk)",
    "retriever_timeout": "seconds before a retrieval request times out",
    "retriever_retries": "retries of a failed retrieval request",
    "state_masking": "no loss, KL or value target on tool-inserted tokens (Search-R1's actor.state_masking)",
    "tools": "the tools rollouts may call: search, python (sandboxed), http, plug-ins (trainer.tools)",
    "tool_format": "how calls are written: tags (<python>...</python>) or json (<tool_call>, the chat template's)",
    "tool_max_calls": "most calls of one tool per sample",
    "tool_max_result_tokens": "most tokens of one tool result",
    "tool_max_sample_tokens": "most tool-inserted tokens per sample",
    "tool_rejoin_steps": "engine steps a sample back from a tool may wait to rejoin the batch with the next request's",
    "python_timeout": "wall seconds of one sandboxed python call",
    "python_cpu_s": "CPU seconds per process of a python call",
    "python_memory_mb": "address space per process of a python call",
    "python_max_procs": "processes of a python call",
    "python_max_output": "bytes of a python call's output read",
    "python_disk_mb": "size of a python call's writable tmpfs",
    "python_parallel": "python calls at once per engine",
    "python_executable": "interpreter of the python calls",
    "python_site_packages": "python calls may import site-packages",
    "http_tool_url": "endpoint of the http tool",
    "http_tool_name": "the http tool's tag and function name",
    "http_tool_template": "JSON body template of an http tool call",
    "http_tool_result_key": "the answer's field the model reads",
    "http_tool_token_file": "bearer token file of the http tool",
    "http_tool_timeout": "seconds before an http tool request times out",
    "http_tool_retries": "retries of a failed http tool request",
    "http_tool_outage_timeout": "how long an http tool outage is waited out",
    "placement_timeout": "deadline for placement groups and actors to be placed (OpenRLHF waits for ever)",
    "engine_start_timeout": "deadline for the rollout engines to start",
    "dist_timeout": "deadline for an NCCL/gloo group (model groups, weight sync) to form",
    "max_staleness": "how many policy versions old an --async_train rollout may be (OpenRLHF: its queue size)",
    "is_correction": "rollout/train mismatch correction (OpenRLHF 0.11: --algo.advantage.is_correction_*)",
    "is_correction_threshold": "the band of --is_correction",
    "skip_rollout_logprobs": "do not ask the engines for the sampled tokens' log-probs",
    "dynamic_filtering_max_rounds": "most rollouts drawn to fill one --dynamic_filtering batch",
    "vllm_start_with_models": "colocated engines start while the models load (KV cache sized up front)",
    "prime_models": "each model's forward and backward once on dummy tokens while the engines start",
    "vllm_prewarm_kernels": "compile the GPU engines' Triton kernels beside their start, in a one-layer copy",
    "vllm_preload_workers": "TP > 1 engines' worker processes start and import vLLM beside the engine's own start",
    "generate_timeout": "deadline of every engine call of a step; a dead or hung engine is replaced",
    "max_engine_restarts": "replacements of one engine before the job ends (slime's --use-fault-tolerance)",
    "reward_outage_timeout": "how long the job waits for an unreachable reward service",
    "retriever_outage_timeout": "how long the job waits for an unreachable retrieval service",
    "eval_input_key": "the evaluation prompts' key (default --input_key)",
    "eval_label_key": "the evaluation labels' key (default --label_key)",
    "eval_at_start": "evaluate before the first step too (verl's trainer.val_before_train)",
    "save_best": "keep the best checkpoint by an eval metric (OpenRLHF 0.11: --ckpt.best_metric_key)",
    "ref_zero_stage": "the reference's own ZeRO stage (0: whole weights on each GPU, no gathers in its forwards)",
    "vllm_in_process": "each engine's core in its actor's process (no spawned EngineCore; faster start)",
    "profile_step": "torch.profiler over one step's forwards and train phase (verl: global_profiler.steps)",
    "profile_trace": "with --profile_step: each group's Chrome trace too",
    "old_logprobs": "where the ratio's old log-probs come from: a policy forward, the train step's own, or the "
                    "engines' (verl's rollout-correction bypass mode)",
}

#: OpenRLHF's other names of this trainer's flags, accepted as they are: the seed's ``--universal_ckpt`` (v0.6.3's
#: name of v0.8.4's ``--use_ds_universal_ckpt``), and OpenRLHF >= 0.10's dotted names (its CLI regrouped every flag).
DOTTED: dict[str, str] = {
    "universal_ckpt": "use_ds_universal_ckpt",
    "train.async_enable": "async_train",
    "algo.advantage.is_correction_type": "is_correction",
    "algo.advantage.is_correction_threshold": "is_correction_threshold",
    "algo.dynamic_filtering_enable": "dynamic_filtering",
    "algo.dynamic_filtering_range": "dynamic_filtering_reward_range",
    "eval.dataset": "eval_data",
    "eval.steps": "eval_steps",
    "eval.temperature": "eval_temperature",
    "eval.n_samples_per_prompt": "eval_n_samples",
}


def refusal(name: str, value: str | None = None) -> str | None:
    """Why ``--name [value]`` is refused; None when it is accepted (not refused, or refused with an ``off``
    value that means what this trainer does)."""
    flag = FLAGS.get(name)
    if flag is None or flag.status != "refused":
        return None
    if value is not None and flag.off and _same_value(value, flag.off):
        return None
    return f"--{name}: OpenRLHF flag not supported here: {flag.note}"


def _same_value(value: str, choices: tuple[str, ...]) -> bool:
    for choice in choices:
        if value == choice:
            return True
        try:
            if float(value) == float(choice):
                return True
        except ValueError:
            continue
    return False


def markdown() -> str:
    """The table as Markdown: one row per flag."""
    counts = {s: sum(f.status == s for f in FLAGS.values()) for s in ("same", "differs", "refused")}
    lines = [
        f"OpenRLHF `train_ppo_ray` flags ({len(FLAGS)}: {counts['same']} same, {counts['differs']} differ, "
        f"{counts['refused']} refused); version: seed = the seed's 0.6.2 fork, 0.8.4 = upstream v0.8.4.",
        "A supported flag set to a non-default value where the configuration does not use it is refused "
        "(OpenRLHF ignores it).",
        "",
        "| flag | in | status | note |",
        "|---|---|---|---|",
    ]
    for f in sorted(FLAGS.values(), key=lambda f: f.name):
        note = f.note + (f" (accepted: {', '.join(f.off)})" if f.off else "")
        if f.ours:
            note = f"spelt --{f.ours} here (both accepted)" + (f"; {note}" if note else "")
        lines.append(f"| `--{f.name}` | {f.versions} | {f.status} | {note} |")
    lines += ["", "Flags of this trainer that those versions lack:", ""]
    lines += [f"- `--{name}`: {what}" for name, what in OWN_FLAGS.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown() + "\n")
