"""The trainer's one typed configuration: every flag of ``python -m trainer.train_ppo_ray``.

Flags keep the spelling and meaning of OpenRLHF's ``openrlhf.cli.train_ppo_ray`` (defaults too, unless
noted). Each field below *is* a flag: ``trainer.config.cli`` builds the argparse parser from these fields.

Constructing a :class:`TrainerConfig` validates it: per-field checks (types, choices, bounds), then the
cross-field rules of ``trainer.config.rules``; every problem found is reported at once in one
:class:`ConfigError`. A constructed config is frozen, with "auto" values resolved (``critic_pretrain``,
``vllm_num_engines``, ``use_tensorboard``) and the derived sizes filled in (``rollout_samples``,
``actor_world_size``, ``grad_accum_steps``, ...; see the ``derived`` fields at the end).

Nothing here checks that paths exist: a config may describe a job for a remote cluster.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from trainer.config import rules
from trainer.config.errors import ConfigError, unknown_name_problem
from trainer.config.estimators import ESTIMATORS
from trainer.config.fields import check_field, derived, derived_names, flag, flag_specs
from trainer.config.rules import TENSORBOARD_AUTO

# The choices of --advantage_estimator are the names of the estimator table (one list, not two).
AdvantageEstimator = Literal[tuple(ESTIMATORS)]  # type: ignore[valid-type]
KlEstimator = Literal["k1", "k2", "k3"]

# Placeholder value of a bare ``--use_wandb`` (see its help) and what a redacted W&B key shows.
WANDB_FROM_ENV = "env"
REDACTED = "<redacted>"
#: Flags that need CUDA GPUs on the nodes when set away from their defaults: the ranks refuse them at start-up
#: without one (trainer.learn.model_worker.require_cuda), the engines theirs (VllmEngine's cudagraph_mode), and
#: rlrun's pre-submit check on a cluster without GPUs. --vllm_prewarm_kernels runs on the CPU build too (its
#: one-layer copy starts, compiling nothing of use there) and --vllm_preload_workers does nothing there (CPU
#: engines of TP > 1 run vLLM's multiprocessing executor, not its Ray one): rlrun's check is what refuses them.
CUDA_ONLY_FLAGS = ("flash_attn", "use_liger_kernel", "vllm_cudagraph_mode", "vllm_compile", "vllm_prewarm_kernels",
                   "vllm_preload_workers")
#: --tool_rejoin_steps's default (trainer.rollout.multiturn.run_tool_rollout_streaming)
DEFAULT_REJOIN_STEPS = 0
#: vLLM's CompilationConfig.cudagraph_mode values as --vllm_cudagraph_mode spells them ("auto": vLLM's own).
CUDAGRAPH_MODES = ("full_and_piecewise", "full", "piecewise", "full_decode_only", "none")
CudagraphMode = Literal[("auto", *CUDAGRAPH_MODES)]  # type: ignore[valid-type]
#: How a GPU engine compiles its model at start-up (--vllm_compile; VllmEngine's compile_mode).
VLLM_COMPILE_MODES = ("inductor", "dynamo", "none")
VllmCompile = Literal[VLLM_COMPILE_MODES]  # type: ignore[valid-type]


# --help section names; one-letter aliases keep the flag table below at about one line per flag.
P, V, M, D, T, A, S, C, L, R, X, E = (
    "placement", "rollout engine (vLLM)", "models and reward", "data", "rollout and training batches",
    "PPO algorithm", "DeepSpeed", "checkpoints", "logging", "multi-turn tool rollouts",
    "overlap, off-policy correction and dynamic sampling", "evaluation during training",
)  # fmt: skip


@dataclass(frozen=True)
class TrainerConfig:
    """Validated, immutable trainer configuration (see the module docstring)."""

    # --- placement -------------------------------------------------------------------------------------
    actor_num_nodes: int = flag(1, "Number of nodes for the actor (policy) model.", group=P, ge=1)
    actor_num_gpus_per_node: int = flag(8, "GPUs per node for the actor model.", group=P, ge=1)
    ref_num_nodes: int = flag(1, "Number of nodes for the reference model.", group=P, ge=1)
    ref_num_gpus_per_node: int = flag(8, "GPUs per node for the reference model.", group=P, ge=1)
    critic_num_nodes: int = flag(1, "Number of nodes for the critic (gae only).", group=P, ge=1)
    critic_num_gpus_per_node: int = flag(8, "GPUs per node for the critic (gae only).", group=P, ge=1)
    colocate_all_models: bool = flag(
        False, "Share the actor's GPUs between actor, reference, critic and the vLLM engines.", group=P
    )
    colocate_actor_ref: bool = flag(
        False, "Share the actor's GPUs with the reference model only (each takes half of a GPU); the engines keep "
        "GPUs of their own.", group=P,
    )  # fmt: skip
    placement_timeout: float = flag(
        300.0, "Seconds a placement group or an actor may wait for Ray to place it before the job ends with one "
        "line naming what is pending, what it asked for and what its node has free.", group=P, gt=0,
    )  # fmt: skip
    engine_start_timeout: float = flag(
        900.0, "Seconds the rollout engines may take to start (vLLM: weights, KV cache, compilation, CUDA "
        "graphs) before the job ends with one line naming what is pending.", group=P, gt=0,
    )  # fmt: skip
    dist_timeout: float = flag(
        300.0, "Seconds an NCCL/gloo group (a model group, the weight-sync group) may take to form before the "
        "job ends with one line naming the members that did not join.", group=P, gt=0,
    )  # fmt: skip
    generate_timeout: float = flag(
        1800.0, "Seconds every engine call of a step may take (generate, sleep, wake, the weight push; a call "
        "that generates more sequences than one engine's share of a rollout batch, an evaluation, gets this "
        "per share's worth). An engine that dies or misses it is replaced: killed, started afresh on its "
        "bundle, given the current weights, and its share generated again with the same seeds.", group=P, gt=0,
    )  # fmt: skip
    max_engine_restarts: int = flag(
        3, "Replacements of one engine (a dead or hung one, see --generate_timeout) before the job ends with one "
        "line naming the engine, its node and the last error. engines/restarts logs the job's total.",
        group=P, ge=0,
    )  # fmt: skip
    # --- rollout engine ----------------------------------------------------------------------------------
    rollout_backend: Literal["vllm", "hf"] = flag(
        "vllm", "Generate rollouts with vLLM engines, or with HF generate() on the actor ('hf').", group=V
    )
    vllm_num_engines: int | None = flag(
        None,
        "Number of vLLM engines. Default: 1 with --rollout_backend vllm, 0 with hf "
        "(OpenRLHF's 0/None meaning 'no vLLM' is spelt --rollout_backend hf here).",
        group=V,
        ge=0,
    )
    vllm_tensor_parallel_size: int = flag(
        1, "Tensor-parallel size (GPUs) of each vLLM engine.", group=V, ge=1
    )
    vllm_sync_backend: Literal["nccl", "gloo"] = flag(
        "nccl", "Backend of the DeepSpeed -> vLLM weight broadcast.", group=V
    )
    sync_bucket_bytes: int = flag(
        256 << 20, "Bytes per bucket of the policy -> engines weight broadcast (gathered parameters are packed "
        "into buckets of this size: one collective per bucket, not per tensor).", group=V, ge=1 << 16,
    )  # fmt: skip
    vllm_gpu_memory_utilization: float = flag(
        0.95, "Fraction of each GPU's memory vLLM may use (gpu_memory_utilization).", group=V, gt=0, le=1
    )
    vllm_enable_sleep: bool = flag(
        False,
        "Put vLLM to sleep (free its GPU memory) during training; needs --colocate_all_models.",
        group=V,
    )
    vllm_in_process: bool = flag(
        False, "Run each engine's core in its engine actor's process, not in a process vLLM spawns: one process "
        "start and vLLM import less per engine before step 1 (at 7B on H200s an engine took ~95 s to start, "
        "~57 s of it starting processes). The CPU build always runs in-process.", group=V,
    )  # fmt: skip
    enable_prefix_caching: bool = flag(False, "Enable vLLM automatic prefix caching.", group=V)
    enforce_eager: bool = flag(False, "Disable CUDA graphs in vLLM.", group=V)
    vllm_cudagraph_mode: CudagraphMode = flag(
        "auto", "Which engine steps run as CUDA graphs (GPU engines; vLLM's cudagraph_mode). auto: vLLM's own, "
        "full_and_piecewise: whole-model graphs for decode-only steps; a step with a prefill in it (where samples "
        "back from a tool rejoin) runs its attention outside the graphs. full_decode_only: no graphs for those "
        "steps. piecewise, none. full (whole graphs for steps with a prefill too) is refused: on vLLM 0.26 it "
        "changed the engine's samples (docs/benchmarks.md, 2026-11-28).", group=V,
    )  # fmt: skip
    vllm_compile: VllmCompile = flag(
        "inductor", "How GPU engines compile the model at start-up. inductor: vLLM's own (torch.compile with "
        "Inductor's kernels; at 7B on H200s 28 s of a cold start, and Inductor's set-up ~17 s more of its warm-up). "
        "dynamo: Dynamo's graph cut into piecewise CUDA graphs as with inductor, run with vLLM's own CUDA kernels "
        "for the norms and activations instead of Inductor's code (vLLM's compile backend eager). none: no "
        "torch.compile; the decode steps still run as whole CUDA graphs (--vllm_cudagraph_mode auto becomes "
        "full_decode_only: without compilation vLLM would make it full).", group=V,
    )  # fmt: skip
    vllm_start_with_models: bool = flag(
        False, "Colocated engines on GPUs start while the models load (their KV cache sized up front from "
        "--vllm_gpu_memory_utilization and the checkpoint's size, instead of vLLM profiling the free memory "
        "after the models are up): a shorter first step.", group=V,
    )  # fmt: skip
    vllm_prewarm_kernels: bool = flag(
        False, "GPU engines: a one-layer copy of the engine with dummy weights, in a process of its own, compiles "
        "its Triton kernels (its model runner's and sampler's, the same for every depth of the model) into the "
        "node's Triton cache, so the engine finds them there at the end of its start instead of compiling them one "
        "by one (vLLM 0.26 on an H200: ~17 s of a 7B engine's start on a cold cache). The driver starts one on its "
        "node before anything else of the job, each engine one beside its start; one per node compiles, and a node "
        "whose cache holds the kernels runs nothing. Each copy holds ~2-4 GB of its GPU (its embedding and output "
        "layer, a small KV cache) until the engines are ready.",
        group=V,
    )  # fmt: skip
    vllm_preload_workers: bool = flag(
        False, "GPU engines of TP > 1 with --vllm_in_process: each engine's process starts its TP workers' Ray "
        "actors first thing, and "
        "they import vLLM while it imports its own; vLLM's Ray executor then takes them as its workers instead "
        "of starting new processes that import vLLM after the engine has built its configuration (a 7B-shaped "
        "engine of TP 2 on H200s: ready in 33 s against 55 s). Only an exact match is taken (bundle, GPU ask, "
        "runtime environment, the worker's methods); anything else falls back to vLLM's own workers, with a "
        "warning.",
        group=V,
    )  # fmt: skip
    # --- models and reward -------------------------------------------------------------------------------
    pretrain: str | None = flag(
        None, "HF model name or path of the policy; required.", group=M, metavar="MODEL"
    )
    critic_pretrain: str | None = flag(
        None,
        "HF model name or path of the critic (gae only); defaults to --pretrain.",
        group=M,
        metavar="MODEL",
    )
    prime_models: bool = flag(
        False, "Run the policy's and reference's forward, and the policy's backward, once on a few dummy tokens "
        "while the engines start, so that step 1 does not pay what a process does the first time (Triton's kernel "
        "compiles, ZeRO-3's record of the module order). Nothing is learnt (the backward reaches no weight) and no "
        "random number is drawn. Off by default: at 7B on 4 H200s it took step 1's make_experience from 5.6 to "
        "2.9 s but not its train phase (7.3 s against 6.8), and the engines beside it were ready 9 s later, so step "
        "1 was 63.8 s against 60.7 without it (docs/benchmarks.md, thirteenth loan). With --colocate_all_models "
        "and vLLM it needs --vllm_start_with_models: engines that measure the free memory as they start would count "
        "the priming's against their KV cache.", group=M,
    )  # fmt: skip
    remote_rm_url: tuple[str, ...] = flag(
        (),
        "Remote reward-model HTTP endpoint(s), comma-separated; requests are spread over them. "
        "Exactly one of --remote_rm_url / --reward_fn.",
        group=M,
        metavar="URL[,URL...]",
    )
    reward_fn: str | None = flag(
        None,
        "Local reward function, by registered name ('math_verify') or 'package.module:function'. "
        "Exactly one of --remote_rm_url / --reward_fn.",
        group=M,
        metavar="NAME",
    )
    remote_rm_timeout: float = flag(30.0, "Seconds before a remote reward request times out.", group=M, gt=0)
    remote_rm_retries: int = flag(3, "Retries of a failed remote reward request.", group=M, ge=0)
    reward_outage_timeout: float = flag(
        300.0, "Seconds a reward service may stay unreachable (connection errors, timeouts, 5xx answers): its "
        "requests are retried with exponential backoff until then, and the job waits; after that it ends "
        "with one line naming the URL and the last error. A sample is never scored 0 because the service "
        "was down.", group=M, gt=0,
    )  # fmt: skip
    # --- multi-turn tool rollouts ----------------------------------------------------------------------
    retriever_url: str | None = flag(
        None, "Retrieval endpoint (trainer.retrieval's POST /retrieve) for multi-turn search rollouts: the policy "
        "writes <search>q</search>, the engine's process asks this service and appends "
        "<information>...</information>, generation resumes. A literal {node_ip} is replaced by the address "
        "of the node the engine runs on (a node-local service). Unset: single-turn rollouts.", group=R,
        metavar="URL",
    )  # fmt: skip
    max_turns: int = flag(
        1, "Most tool calls per sample, all tools together (Search-R1's max_turns); a sample that used them all "
        "gets one last turn to answer. Needs --tools or --retriever_url.", group=R, ge=1,
    )  # fmt: skip
    retriever_topk: int = flag(3, "Passages per search (the request's topk).", group=R, ge=1, le=50)
    retriever_timeout: float = flag(10.0, "Seconds before a retrieval request times out.", group=R, gt=0)
    retriever_retries: int = flag(3, "Retries of a failed retrieval request (connection errors, 5xx).",
                                  group=R, ge=0)
    retriever_outage_timeout: float = flag(
        300.0, "Seconds the retrieval service may stay unreachable: its requests are retried with exponential "
        "backoff until then (the rollout waits), after that the job ends with one line naming the URL and "
        "the last error.", group=R, gt=0,
    )  # fmt: skip
    state_masking: bool = flag(
        False, "Mask the tool-inserted tokens (<information> blocks) out of the policy loss, the KL and the "
        "critic's targets (Search-R1's actor.state_masking); without it they count as actions.", group=R,
    )  # fmt: skip
    tools: tuple[str, ...] = flag(
        (), "Tools the policy may call (trainer.tools), comma-separated: search (the retrieval service at "
        "--retriever_url), python (a sandboxed interpreter, --python_*), http (a service of yours, --http_tool_*), "
        "or package.module:factory (a plug-in returning a trainer.tools.base.Tool). Default: search when "
        "--retriever_url is given, else none (single-turn rollouts).", group=R, metavar="TOOL[,TOOL...]",
    )  # fmt: skip
    tool_format: Literal["tags", "json"] = flag(
        "tags", "How the policy writes a call: tags (<python>code</python>, <search>q</search>; results in the "
        "tool's own tags) or json (<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>, Hermes / Qwen; "
        "results as the model's chat template renders a tool message; the prompts get the tools' schemas).",
        group=R,
    )  # fmt: skip
    tool_max_calls: tuple[str, ...] = flag(
        (), "NAME=N,...: most calls of one tool per sample (all tools together: --max_turns).", group=R,
        metavar="NAME=N[,...]",
    )  # fmt: skip
    tool_max_result_tokens: int | None = flag(
        None, "Most tokens of one call's result text (cut, marked '...[truncated]'); default: what is left of "
        "--generate_max_len.", group=R, ge=1,
    )  # fmt: skip
    tool_max_sample_tokens: int | None = flag(
        None, "Most tool-inserted tokens per sample: a result is cut to what is left of it, and a sample that "
        "used it all makes no more calls (as after --max_turns); default: --generate_max_len only.", group=R, ge=1,
    )  # fmt: skip
    tool_rejoin_steps: int = flag(
        DEFAULT_REJOIN_STEPS, "Engine steps (vLLM) a sample back from a tool may wait for the samples of the next "
        "tool request, so that both rejoin the batch in one step: a step where samples rejoin holds their prefill "
        "and costs 2-3 decode steps whatever its size. 0: each rejoins as soon as its result is in.", group=R, ge=0,
    )  # fmt: skip
    python_timeout: float = flag(5.0, "Wall seconds of one python call; then its processes are killed.", group=R,
                                 gt=0)
    python_cpu_s: int = flag(5, "CPU seconds per process of a python call (RLIMIT_CPU).", group=R, ge=1)
    python_memory_mb: int = flag(512, "Address space per process of a python call, MiB (RLIMIT_AS).", group=R,
                                 ge=32)
    python_max_procs: int = flag(
        8, "Processes and threads of a python call (RLIMIT_NPROC, counted in its own user namespace).", group=R,
        ge=1,
    )  # fmt: skip
    python_max_output: int = flag(
        8192, "Bytes of a python call's output (stdout and stderr) read; more is cut and the call killed.", group=R,
        ge=1,
    )  # fmt: skip
    python_disk_mb: int = flag(
        16, "Size of a python call's work directory (a tmpfs, its only writable place), MiB.", group=R, ge=1
    )
    python_parallel: int = flag(4, "Python calls run at once per engine.", group=R, ge=1)
    python_executable: str | None = flag(
        None, "Interpreter of the python calls. Default: the job's, if the sandbox's user can read it (as root the "
        "sandbox runs as nobody), else /usr/bin/python3.", group=R, metavar="PATH",
    )  # fmt: skip
    python_site_packages: bool = flag(
        False, "Let python calls import the interpreter's site-packages (numpy, sympy); default: the standard "
        "library only (a faster start).", group=R,
    )  # fmt: skip
    http_tool_url: str | None = flag(
        None, "Endpoint of the http tool (one POST per call; {node_ip}: the engine's node).", group=R, metavar="URL"
    )
    http_tool_name: str = flag("http", "The http tool's name: its tag (<NAME>...</NAME>) and function name.",
                               group=R)
    http_tool_template: str = flag(
        '{"input": "{input}"}', "JSON body of an http tool call; {NAME} in its strings is the call's argument "
        "NAME (the tag format's body is 'input').", group=R, metavar="JSON",
    )  # fmt: skip
    http_tool_result_key: str | None = flag(
        None, "Dotted path of the answer's field the model reads (default: the whole answer).", group=R,
        metavar="KEY",
    )  # fmt: skip
    http_tool_token_file: str | None = flag(
        None, "File (mode 0600) holding the http tool's bearer token, read in the engines' processes.", group=R,
        metavar="PATH",
    )  # fmt: skip
    http_tool_timeout: float = flag(10.0, "Seconds before an http tool request times out.", group=R, gt=0)
    http_tool_retries: int = flag(2, "Retries of a failed http tool request (connection errors, timeouts, 5xx).",
                                  group=R, ge=0)
    http_tool_outage_timeout: float = flag(
        0.0, "Seconds an http tool outage is waited out after the retries; then the call's result is the error.",
        group=R, ge=0,
    )  # fmt: skip
    # --- data --------------------------------------------------------------------------------------------
    prompt_data: str | None = flag(
        None, "HF dataset name or path of the prompts; required.", group=D, metavar="DATA"
    )
    input_key: str = flag("input", "Dataset key holding the prompt.", group=D)
    label_key: str | None = flag(None, "Dataset key holding the label handed to the reward.", group=D)
    input_template: str | None = flag(
        None, "Prompt template with one '{}' for the prompt (not with --apply_chat_template).", group=D
    )
    sft_output_key: str = flag("output", "Dataset key of the target response (--sft_warmup_steps only).", group=D)
    sft_data: str | None = flag(
        None, "Data of the supervised warm-up (same format and --input_key as --prompt_data, targets in "
        "--sft_output_key; --sft_warmup_steps only). Default: --prompt_data itself.", group=D, metavar="DATA",
    )  # fmt: skip
    apply_chat_template: bool = flag(False, "Format prompts with the tokenizer's chat template.", group=D)
    max_samples: int = flag(100_000_000, "Use at most this many prompts of the dataset.", group=D, ge=1)
    prompt_max_len: int = flag(1024, "Max tokens of a prompt; longer prompts are dropped and counted.", group=D, ge=1)
    generate_max_len: int = flag(
        1024, "Max new tokens generated per sample (multi-turn: the whole response, generated and "
        "tool-inserted tokens together).", group=D, ge=1,
    )  # fmt: skip
    # --- rollout and training batches ----------------------------------------------------------------
    rollout_batch_size: int = flag(1024, "Prompts per rollout (experience-making) batch.", group=T, ge=1)
    micro_rollout_batch_size: int = flag(
        8, "Samples per forward pass when making experience (per GPU).", group=T, ge=1
    )
    n_samples_per_prompt: int = flag(1, "Responses sampled per prompt.", group=T, ge=1)
    temperature: float = flag(1.0, "Sampling temperature.", group=T, gt=0)
    top_p: float = flag(1.0, "Nucleus-sampling top_p.", group=T, gt=0, le=1)
    train_batch_size: int = flag(128, "Global samples per optimizer step.", group=T, ge=1)
    micro_train_batch_size: int = flag(4, "Samples per forward/backward pass per GPU.", group=T, ge=1)
    max_epochs: int = flag(1, "Passes over each rollout batch.", group=T, ge=1)
    num_episodes: int = flag(1, "Passes over the prompt dataset.", group=T, ge=1)
    actor_learning_rate: float = flag(1e-6, "Actor learning rate.", group=T, gt=0)
    max_steps: int | None = flag(
        None, "Stop after this many rollout steps (verl's trainer.total_training_steps); the LR schedules span "
        "the steps the run takes. Default: every rollout of --num_episodes passes over the data.", group=T, ge=1,
    )  # fmt: skip
    critic_learning_rate: float = flag(9e-6, "Critic learning rate (gae only).", group=T, gt=0)
    critic_micro_train_batch_size: int | None = flag(
        None, "Critic samples per forward/backward pass per GPU (gae only; default: --micro_train_batch_size). "
        "verl's critic.ppo_micro_batch_size is global: divide it by the critic's GPUs.", group=T, ge=1,
    )  # fmt: skip
    lr_warmup_ratio: float = flag(0.03, "Fraction of all steps spent in LR warm-up.", group=T, ge=0, le=1)
    critic_lr_warmup_ratio: float | None = flag(
        None, "Fraction of all steps spent in the critic's LR warm-up (gae only; default: --lr_warmup_ratio; "
        "verl's critic.optim.lr_warmup_steps_ratio).", group=T, ge=0, le=1,
    )  # fmt: skip
    freezing_actor_steps: int = flag(
        -1, "Critic warm-up: the first N rollout steps train only the critic, the policy and the engines' "
        "weights stay as they are (gae only; verl's trainer.critic_warmup). -1 or 0: none.", group=T, ge=-1,
    )  # fmt: skip
    lr_scheduler: Literal["cosine_with_min_lr", "constant_with_warmup"] = flag(
        "cosine_with_min_lr", "LR schedule after the warm-up: cosine down to 10 % of the rate, or constant "
        "(trainer.schedule).", group=T,
    )  # fmt: skip
    max_norm: float = flag(1.0, "Gradient clipping max norm.", group=T, gt=0)
    l2: float = flag(0.0, "Weight decay.", group=T, ge=0)
    seed: int = flag(42, "Random seed.", group=T, ge=0)
    sft_warmup_steps: int = flag(
        0, "Supervised optimizer steps on --sft_output_key before RL starts (teaches a tiny model the answer "
        "format); the reference and the engines then start from the warmed-up policy. 0: none.", group=T, ge=0,
    )  # fmt: skip
    sft_learning_rate: float | None = flag(
        None, "Learning rate of the supervised warm-up (default: --actor_learning_rate).", group=T, gt=0
    )
    # --- overlap and sampling ------------------------------------------------------------------------
    async_train: bool = flag(
        False, "Overlap generation with training (one-step-off and beyond): engines on GPUs of their own generate "
        "the next rollout while the policy trains on this one; weights go to the engines after each step, "
        "between two rollouts (no partial rollouts). Refused with --colocate_all_models. OpenRLHF's "
        "--train.async_enable.", group=X,
    )  # fmt: skip
    max_staleness: int = flag(
        1, "With --async_train: how many policy versions older than the one that trains on it a rollout may "
        "be generated with (1: one-step-off). Logged as async/staleness.", group=X, ge=0,
    )  # fmt: skip
    is_correction: Literal["none", "tis", "icepop", "seq-mask-tis"] = flag(
        "none", "Correct the rollout/train mismatch with the engines' own log-probs of the sampled tokens, on "
        "r = pi_train / pi_rollout: tis clamps r to the band (truncated IS), icepop drops tokens outside it, "
        "seq-mask-tis drops sequences whose mean ratio is outside it (OpenRLHF 0.11's formula; its "
        "--algo.advantage.is_correction_type).", group=X,
    )  # fmt: skip
    is_correction_threshold: tuple[float, float] = flag(
        (0.5, 5.0), "The band [LOW, HIGH] of --is_correction (OpenRLHF's --algo.advantage.is_correction_threshold).",
        group=X, ge=0, metavar=("LOW", "HIGH"),
    )  # fmt: skip
    skip_rollout_logprobs: bool = flag(
        False, "Do not ask the engines for the sampled tokens' log-probs (no rollout/logprob_mismatch metric; "
        "refused with --is_correction).", group=X,
    )  # fmt: skip
    old_logprobs: Literal["policy", "train", "rollout"] = flag(
        "policy", "Where the PPO ratio's old log-probs come from. policy: a forward of the policy in "
        "make_experience (OpenRLHF). train: no forward; the train step's own log-probs, detached, so the ratio "
        "is 1 and the gradient is the plain policy gradient, exactly what policy gives while the policy has not "
        "moved (NeMo-RL's force_on_policy_ratio); refused unless there is one optimizer step per rollout and no "
        "KL penalty in the reward. rollout: the engines' log-probs of the sampled tokens stand in (verl's "
        "algorithm.rollout_correction.bypass_mode): no forward, but the ratio and the KL penalty carry the "
        "engines' numerics (rollout/logprob_mismatch); refused with --skip_rollout_logprobs and --is_correction "
        "(its weights would all be 1).", group=X,
    )  # fmt: skip
    dynamic_filtering: bool = flag(
        False, "DAPO's dynamic sampling: drop prompts whose samples all score alike or whose mean reward is "
        "outside --dynamic_filtering_reward_range, and draw more prompts until the rollout batch is full "
        "(at most --dynamic_filtering_max_rounds rollouts). OpenRLHF's --algo.dynamic_filtering_enable.", group=X,
    )  # fmt: skip
    dynamic_filtering_reward_range: tuple[float, float] = flag(
        (0.0, 1.0), "Keep a prompt when LOW < its samples' mean reward < HIGH (OpenRLHF's range).", group=X,
        metavar=("LOW", "HIGH"),
    )  # fmt: skip
    dynamic_filtering_max_rounds: int = flag(
        4, "Most rollouts drawn to fill one batch with informative prompts; a batch still short trains on what "
        "it has (logged as dynamic_filtering/short).", group=X, ge=1,
    )  # fmt: skip
    # --- evaluation during training ----------------------------------------------------------------------
    eval_data: str | None = flag(
        None, "Evaluation prompts (same formats as --prompt_data; OpenRLHF's --eval_dataset): every --eval_steps "
        "steps the engines answer each prompt greedily once and --eval_n_samples times sampled, the job's "
        "reward scores them, and eval/greedy, eval/pass@K, eval/mean@K are logged (trainer.rollout.evaluate).",
        group=E, metavar="DATA",
    )  # fmt: skip
    eval_input_key: str | None = flag(
        None, "Key of the evaluation prompt (default: --input_key).", group=E
    )
    eval_label_key: str | None = flag(
        None, "Key of the evaluation label handed to the reward (default: --label_key).", group=E
    )
    eval_steps: int = flag(
        -1, "Evaluate every N steps (after the step's weight sync: the engines hold the step's weights); -1: "
        "never.", group=E, ge=-1,
    )  # fmt: skip
    eval_at_start: bool = flag(False, "Also evaluate before the first step (logged as step 0).", group=E)
    eval_n_samples: int = flag(
        4, "Sampled answers per evaluation prompt, K of eval/pass@K and eval/mean@K (OpenRLHF's "
        "--eval_n_samples_per_prompt).", group=E, ge=1,
    )  # fmt: skip
    eval_temperature: float = flag(
        0.6, "Sampling temperature of the K sampled answers (the greedy pass uses 0).", group=E, gt=0
    )
    save_best: str | None = flag(
        None, "Keep the checkpoint of the step with the highest value of this eval metric (eval/greedy, "
        "eval/pass@K, eval/mean@K or eval/<a reward log>) in <ckpt_path>/best, a link swapped to the new best "
        "checkpoint once it is complete.", group=E, metavar="METRIC",
    )  # fmt: skip
    # --- PPO algorithm -----------------------------------------------------------------------------------
    advantage_estimator: AdvantageEstimator = flag(
        "gae",
        "gae (PPO with a critic), reinforce (REINFORCE++), rloo, reinforce_baseline (REINFORCE++ with the "
        "prompt's mean as baseline), group_norm (GRPO) or dr_grpo (GRPO without the std division); see "
        "trainer.config.estimators and trainer.learn.algorithms.",
        group=A,
    )
    eps_clip: float = flag(0.2, "PPO policy ratio clip range: [1 - eps_clip, 1 + eps_clip].", group=A, gt=0, lt=1)
    eps_clip_low_high: tuple[float, float] | None = flag(
        None, "Asymmetric ratio clip [1 - LOW, 1 + HIGH] instead of --eps_clip (DAPO's clip-higher, e.g. "
        "0.2 0.28).", group=A, gt=0, metavar=("LOW", "HIGH"),
    )  # fmt: skip
    dual_clip: float | None = flag(
        None, "Dual-clip PPO constant c > 1: where the advantage is negative the loss is at most -c * A, "
        "however far the ratio exceeds 1 + eps (Ye et al. 2019; OpenRLHF >= 0.8.9).", group=A, gt=1,
    )  # fmt: skip
    value_clip: float | None = flag(
        0.5, "PPO value clip range ('none': unclipped value loss).", group=A, gt=0
    )
    gamma: float = flag(1.0, "Discount factor (must stay 1 except with gae).", group=A, gt=0, le=1)
    lambd: float = flag(1.0, "GAE lambda.", group=A, ge=0, le=1)
    init_kl_coef: float = flag(
        0.01, "KL coefficient (reward penalty, or KL-loss weight with --use_kl_loss); 0: no reference.",
        group=A, ge=0,
    )  # fmt: skip
    kl_estimator: KlEstimator = flag(
        "k1", "KL estimator: k1 = log r, k2 = (log r)^2 / 2, k3 = exp(-log r) - 1 + log r.", group=A
    )
    use_kl_loss: bool = flag(False, "Add the KL as a loss term (GRPO) instead of a reward penalty.", group=A)
    reward_clip_range: tuple[float, float] = flag(
        (-10.0, 10.0), "Clamp the sequence scores (after the estimator's baseline) to [LOW, HIGH] before the "
        "KL penalty is added, as OpenRLHF does.", group=A, metavar=("LOW", "HIGH"),
    )  # fmt: skip
    normalize_reward: bool = flag(
        False, "Normalise the reward scores with the running mean/std of all scores seen so far "
        "(trainer.learn.algorithms.normalize_reward).", group=A,
    )  # fmt: skip
    no_advantage_std_norm: bool = flag(
        False, "Normalise the token advantages over the batch by their mean only, without dividing by the std "
        "(for the estimators that whiten: gae, reinforce, rloo, reinforce_baseline).", group=A,
    )  # fmt: skip
    rloo_whiten: Literal["on", "off"] = flag(
        "on", "rloo only: whiten the leave-one-out advantages over the batch ('on', as OpenRLHF up to v0.8.4 and "
        "the seed's v0.6.2) or use them as they are ('off', as OpenRLHF from v0.8.5).", group=A,
    )  # fmt: skip
    # --- DeepSpeed ---------------------------------------------------------------------------------------
    zero_stage: Literal[0, 1, 2, 3] = flag(2, "DeepSpeed ZeRO stage.", group=S)
    ref_zero_stage: int | None = flag(
        None, "The reference model's ZeRO stage (it only runs forwards; default --zero_stage). 0 keeps its whole "
        "weights on each of its GPUs, so its forwards gather nothing: at 7B on 4 H200s a ZeRO-3 reference's "
        "forwards spent a third of their device time in all-gathers; it costs the weights' size on every GPU "
        "(bf16 7B: 15 GB).", group=S, ge=0, le=3,
    )  # fmt: skip
    bf16: bool = flag(False, "Train in bfloat16 (else float32).", group=S)
    adam_offload: bool = flag(False, "Offload Adam optimizer states to CPU.", group=S)
    adam_offload_ratio: float = flag(
        1.0, "With --adam_offload and ZeRO-3: the share of the Adam states (fp32 weights, moments and gradients, "
        "16 bytes a parameter) kept on the host; the rest stays on the GPUs (DeepSpeed's partial offload). Below 1 "
        "where the host cannot hold them all: a 32B model on one node of 4 GPUs needs 524 GB of host memory at 1 "
        "(preset 32b-rloo-1node).", group=S, gt=0, le=1,
    )  # fmt: skip
    flash_attn: bool = flag(False, "Use FlashAttention-2 in the trained models.", group=S)
    use_liger_kernel: bool = flag(
        False, "Liger's fused Triton kernels (RMSNorm, rotary embedding, SwiGLU) in the policy, reference and "
        "critic: the element-wise part of every forward and backward. GPU nodes with liger-kernel (the stack's "
        "extra gpu); the log-probs and losses are computed as without it.", group=S
    )
    gradient_checkpointing: bool = flag(False, "Enable gradient (activation) checkpointing.", group=S)
    packing_samples: bool = flag(
        False, "Pack each micro-batch's sequences into fewer rows without padding (block-diagonal attention, "
        "positions restarting per sequence) for the policy, reference and critic forwards.", group=S
    )
    # --- checkpoints -------------------------------------------------------------------------------------
    save_path: str = flag("./ckpt", "Where the final model is saved.", group=C, metavar="PATH")
    ckpt_path: str = flag(
        "./ckpt/checkpoints_ppo_ray", "Where training checkpoints are saved.", group=C, metavar="PATH"
    )
    save_steps: int = flag(-1, "Checkpoint every N global steps; -1: never during training.", group=C)
    save_hf_ckpt: bool = flag(False, "Also save an HF-format model with each checkpoint.", group=C)
    save_value_network: bool = flag(
        False, "OpenRLHF's switch to save the critic (gae): here the critic is always saved next to the final "
        "model, at <save_path>_critic, so the flag changes nothing; accepted for OpenRLHF command lines.", group=C
    )
    max_ckpt_num: int = flag(3, "Keep at most this many checkpoints.", group=C, ge=1)
    load_checkpoint: bool = flag(
        False, "Resume from the newest complete checkpoint in --ckpt_path (torn ones are skipped, named); none "
        "there: start fresh. On another GPU count a group loads DeepSpeed's universal checkpoint, converted once.",
        group=C,
    )
    use_ds_universal_ckpt: bool = flag(
        False, "With --load_checkpoint: load every group through DeepSpeed's universal checkpoint (converted once "
        "and kept beside the checkpoint), also on the same GPU count; without it, only a group whose GPU count "
        "changed does. --universal_ckpt is the same switch.", group=C,
    )
    # --- logging -----------------------------------------------------------------------------------------
    logging_steps: int = flag(1, "Log metrics every N global steps.", group=L, ge=1)
    use_tensorboard: str | None = flag(
        None, "TensorBoard log dir; a bare --use_tensorboard logs to <save_path>/tensorboard.",
        group=L, const=TENSORBOARD_AUTO, metavar="LOGDIR",
    )  # fmt: skip
    use_wandb: str | None = flag(
        None, "Log to Weights & Biases; bare: key from WANDB_API_KEY, or a key (OpenRLHF style).",
        group=L, const=WANDB_FROM_ENV, metavar="KEY",
    )  # fmt: skip
    profile_step: int = flag(
        0, "Profile global step N (0: no step) with torch.profiler on rank 0 of each model group: its "
        "make_experience forwards and its train phase. The wall time, the device's time by kind (GEMM, attention, "
        "NCCL, copies, optimizer, other) and the top kernels go to the job's log and to <save_path>/profile/. "
        "The step itself runs slower for it; its metrics carry profile/*.", group=L, ge=0,
    )
    profile_trace: bool = flag(
        False, "With --profile_step: also write each group's Chrome trace (<save_path>/profile/*.trace.json.gz; "
        "tens of MB for a 7B step).", group=L,
    )
    wandb_project: str = flag("openrlhf_train_ppo", "W&B project.", group=L)
    wandb_run_name: str | None = flag(None, "W&B run name (default: ppo_<timestamp>).", group=L)
    metrics_path: str | None = flag(
        None, "Write metrics as JSON lines to this file (default <save_path>/metrics.jsonl): a resumed run "
        "moves the rows of the steps it runs again to <file>.replaced; a fresh run renames an earlier run's "
        "file <file>.<n>.", group=L, metavar="PATH"
    )

    # --- derived (computed by validation; not flags) -----------------------------------------------------
    rollout_samples: int = derived(0, "rollout_batch_size * n_samples_per_prompt")
    actor_world_size: int = derived(0, "actor_num_nodes * actor_num_gpus_per_node")
    ref_world_size: int = derived(0, "ref_num_nodes * ref_num_gpus_per_node; 0 without a reference model")
    critic_world_size: int = derived(0, "critic_num_nodes * critic_num_gpus_per_node; 0 without a critic")
    vllm_total_gpus: int = derived(
        0, "vllm_num_engines * vllm_tensor_parallel_size; 0 for rollout_backend hf"
    )
    gpus_required: int = derived(0, "GPUs the job occupies (actor_world_size when colocated, else the sum)")
    grad_accum_steps: int = derived(0, "train_batch_size / (micro_train_batch_size * actor_world_size)")
    critic_grad_accum_steps: int = derived(0, "as grad_accum_steps with critic_world_size; 0 without critic")
    micro_rollout_batches: int = derived(0, "rollout_samples / micro_rollout_batch_size")
    train_steps_per_rollout: int = derived(
        0, "rollout_samples / train_batch_size * max_epochs (optimizer steps)"
    )
    max_rollouts_per_episode: int = derived(
        0, "max_samples // rollout_batch_size (fewer if the data is smaller)"
    )
    max_train_steps_per_episode: int = derived(0, "max_rollouts_per_episode * train_steps_per_rollout")
    max_train_steps: int = derived(0, "num_episodes * max_train_steps_per_episode")
    max_sequence_len: int = derived(0, "prompt_max_len + generate_max_len")
    multi_turn: bool = derived(False, "rollouts call tools: --tools, or --retriever_url (search)")
    tool_names: tuple = derived((), "the tools the policy may call: --tools, else search with --retriever_url")
    needs_critic: bool = derived(False, "the estimator learns a value function (gae): the critic is created")
    needs_ref: bool = derived(False, "init_kl_coef > 0 (the reference model is created)")
    eps_clip_low: float = derived(0.0, "the ratio clip below 1: eps_clip_low_high[0], else eps_clip")
    eps_clip_high: float = derived(0.0, "the ratio clip above 1: eps_clip_low_high[1], else eps_clip")
    kl_penalty_coef: float = derived(0.0, "the KL's weight in the rewards: init_kl_coef, 0 with use_kl_loss")
    kl_loss_coef: float = derived(0.0, "the KL loss term's weight: init_kl_coef with use_kl_loss, else 0")
    advantage_norm: str = derived(
        "", "how the token advantages are normalised over the batch: whiten (mean 0, std 1), center "
        "(mean 0: no_advantage_std_norm) or none (group_norm, dr_grpo, rloo with rloo_whiten off)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        """Validate (field checks, auto values, cross-field rules), then fill in the derived sizes."""
        problems: list[str] = []
        bad: set[str] = set()
        for spec in flag_specs(type(self)):
            value, problem = check_field(spec, getattr(self, spec.name))
            object.__setattr__(self, spec.name, value)
            if problem:
                problems.append(problem)
                bad.add(spec.name)
        for name, value in rules.resolve_auto_values(self, bad).items():
            object.__setattr__(self, name, value)
        problems += rules.cross_field_problems(self, bad)
        if problems:
            raise ConfigError(problems)
        for name, value in rules.derive(self).items():
            object.__setattr__(self, name, value)

    # --- dataset-dependent step counts -------------------------------------------------------------------
    def rollouts_per_episode(self, num_prompts: int) -> int:
        """Rollout batches per episode for a dataset of ``num_prompts`` prompts (last partial one dropped)."""
        return min(num_prompts, self.max_samples) // self.rollout_batch_size

    def total_rollouts(self, num_prompts: int) -> int:
        """Rollout steps of the whole run for a dataset of ``num_prompts`` prompts: every rollout of
        ``num_episodes`` passes, or ``max_steps`` if that is fewer (verl's ``total_training_steps``)."""
        rollouts = self.num_episodes * self.rollouts_per_episode(num_prompts)
        return rollouts if self.max_steps is None else min(self.max_steps, rollouts)

    def total_train_steps(self, num_prompts: int) -> int:
        """Optimizer steps of the whole run (LR schedule length) for a dataset of ``num_prompts`` prompts."""
        return self.total_rollouts(num_prompts) * self.train_steps_per_rollout

    # --- serialisation -----------------------------------------------------------------------------------
    def to_dict(self, *, redact: bool = False) -> dict[str, Any]:
        """All flags (resolved) then all derived sizes, JSON-ready; ``redact`` hides a W&B key."""
        out: dict[str, Any] = {}
        for spec in flag_specs(type(self)):
            value = getattr(self, spec.name)
            out[spec.name] = list(value) if isinstance(value, tuple) else value
        if redact and self.use_wandb not in (None, WANDB_FROM_ENV):
            out["use_wandb"] = REDACTED
        for name in derived_names(type(self)):
            out[name] = getattr(self, name)
        return out

    def to_json(self, *, redact: bool = False, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON."""
        return json.dumps(self.to_dict(redact=redact), indent=indent)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainerConfig:
        """Rebuild (and re-validate) a config from :meth:`to_dict` output or any flag-name mapping.

        Derived keys are ignored (they are recomputed); unknown keys are a :class:`ConfigError`.
        """
        flags = {spec.name for spec in flag_specs(cls)}
        derived_keys = set(derived_names(cls))
        unknown = [k for k in values if k not in flags and k not in derived_keys]
        if unknown:
            raise ConfigError([unknown_name_problem(k, sorted(flags)) for k in unknown])
        if values.get("use_wandb") == REDACTED:
            raise ConfigError(["use_wandb: the W&B key was redacted in this dict; pass the real key"])
        return cls(**{k: v for k, v in values.items() if k in flags})

    def replace(self, **changes: Any) -> TrainerConfig:
        """A re-validated copy with some flags changed.

        Auto values resolved in ``self`` (``critic_pretrain``, ``vllm_num_engines``, ``use_tensorboard``)
        carry over as given values: change them too when changing what they were derived from.
        """
        return dataclasses.replace(self, **changes)

