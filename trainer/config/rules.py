"""Cross-field rules of :class:`trainer.config.TrainerConfig`: auto values, validation, derived sizes.

Called from ``TrainerConfig.__post_init__`` after the per-field checks. Each rule declares the fields
it reads and is skipped when one of them already failed its own check (so a rule never does
arithmetic on a bad value and one mistake is reported once). Every message names the flags, their
values and the arithmetic that failed.

Which models a config creates is decided once, by :func:`has_critic` (the estimator table of
``trainer.config.estimators``) and :func:`has_ref`; the auto values, the rules and the derived sizes all
ask them. This module reads a config only through its attributes, so it does not import the
``TrainerConfig`` class (which imports this module).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import Any

from trainer.config.estimators import ESTIMATORS, estimator
from trainer.config.fields import flag_specs

# A TrainerConfig under validation: the rules read its flag attributes only.
Config = Any
Rule = Callable[[Config], Iterator[str]]
_RULES: list[tuple[frozenset[str], Rule]] = []

# Placeholder value of a bare ``--use_tensorboard``: <save_path>/tensorboard (resolved below).
TENSORBOARD_AUTO = "auto"
_REWARD_FN_RE = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$")


def _rule(*fields: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        _RULES.append((frozenset(fields), fn))
        return fn

    return register


def compile_conflict(mode: str, cudagraph_mode: str, enforce_eager: bool) -> tuple[str, str] | None:
    """Why GPU engines cannot compile by ``mode`` (--vllm_compile, VllmEngine's compile_mode) beside the other
    engine settings: (``enforce_eager`` or ``cudagraph_mode``, why and what was expected), or None. The one rule
    for both: the config's check words it in flags, the engine in its own arguments."""
    if mode == "inductor":
        return None
    if enforce_eager:
        return "enforce_eager", "eager engines compile nothing (drop one of them)"
    if mode == "none" and cudagraph_mode in ("piecewise", "full_and_piecewise"):
        return "cudagraph_mode", ("piecewise CUDA graphs are cut from torch.compile's graph, and without it vLLM "
                                  "makes them none or full (whole graphs for prefills: wrong log-probs on vLLM "
                                  "0.26); expected auto, full_decode_only or none")
    return None


def has_critic(c: Config) -> bool:
    """The config trains a critic: its estimator learns a value function (gae)."""
    return estimator(c.advantage_estimator).critic


def has_ref(c: Config) -> bool:
    """The config creates the reference model: a KL term with a positive coefficient."""
    return c.init_kl_coef > 0


def tool_names(c: Config) -> tuple[str, ...]:
    """The tools the policy may call: --tools, else the search tool when --retriever_url is given (Search-R1's
    flags alone), else none."""
    return tuple(c.tools) if c.tools else ("search",) if c.retriever_url is not None else ()


def advantage_norm(c: Config) -> str:
    """How the token advantages are normalised over the batch: the estimator's choice (the table), rloo's
    switch (--rloo_whiten) and --no_advantage_std_norm, decided here only."""
    e = estimator(c.advantage_estimator)
    whitened = c.rloo_whiten == "on" if e.whiten_switch else e.batch_whiten
    if not whitened:
        return "none"
    return "center" if c.no_advantage_std_norm else "whiten"


def _names(predicate: Callable[[Any], bool]) -> str:
    """The estimators the table marks with ``predicate``, for messages ("gae / reinforce")."""
    return " / ".join(name for name, e in ESTIMATORS.items() if predicate(e))


def _critic_estimators() -> str:
    return _names(lambda e: e.critic)


def resolve_auto_values(c: Config, bad: set[str]) -> dict[str, Any]:
    """Values of flags whose default depends on other flags (``None``/placeholder -> concrete)."""
    out: dict[str, Any] = {}
    if c.vllm_num_engines is None and "rollout_backend" not in bad:
        out["vllm_num_engines"] = 1 if c.rollout_backend == "vllm" else 0
    critic = "advantage_estimator" not in bad and has_critic(c)
    if c.critic_pretrain is None and critic and c.pretrain:
        out["critic_pretrain"] = c.pretrain
    if c.critic_micro_train_batch_size is None and critic:
        out["critic_micro_train_batch_size"] = c.micro_train_batch_size
    if c.critic_lr_warmup_ratio is None and critic:
        out["critic_lr_warmup_ratio"] = c.lr_warmup_ratio
    if c.ref_zero_stage is None and "init_kl_coef" not in bad and has_ref(c):
        out["ref_zero_stage"] = c.zero_stage
    if c.use_tensorboard == TENSORBOARD_AUTO:
        out["use_tensorboard"] = os.path.join(c.save_path, "tensorboard")
    return out


def cross_field_problems(c: Config, bad: set[str]) -> list[str]:
    """Every cross-field problem of ``c``, skipping rules that read a field listed in ``bad``."""
    problems: list[str] = []
    for fields, rule in _RULES:
        if not fields & bad:
            problems.extend(rule(c))
    return problems


def _world(c: Config, role: str) -> int:
    return getattr(c, f"{role}_num_nodes") * getattr(c, f"{role}_num_gpus_per_node")


def _world_text(c: Config, role: str) -> str:
    nodes, gpus = getattr(c, f"{role}_num_nodes"), getattr(c, f"{role}_num_gpus_per_node")
    return (
        f"{role} world size {nodes * gpus} (--{role}_num_nodes {nodes} * --{role}_num_gpus_per_node {gpus})"
    )


def _steps_per_rollout(c: Config) -> int:
    """Optimizer steps on one rollout's samples (train_steps_per_rollout); 0 where the batch sizes are not
    positive (their own rules say so)."""
    if c.train_batch_size <= 0:
        return 0
    return c.rollout_batch_size * c.n_samples_per_prompt // c.train_batch_size * c.max_epochs


def derive(c: Config) -> dict[str, Any]:
    """The derived sizes of a valid config (see the ``derived`` fields of ``TrainerConfig``)."""
    needs_critic = has_critic(c)
    needs_ref = has_ref(c)
    actor = _world(c, "actor")
    ref = _world(c, "ref") if needs_ref else 0
    critic = _world(c, "critic") if needs_critic else 0
    vllm = (c.vllm_num_engines or 0) * c.vllm_tensor_parallel_size if c.rollout_backend == "vllm" else 0
    samples = c.rollout_batch_size * c.n_samples_per_prompt
    steps_per_rollout = _steps_per_rollout(c)
    rollouts = c.rollouts_per_episode(c.max_samples)
    run_rollouts = c.total_rollouts(c.max_samples)
    low, high = c.eps_clip_low_high or (c.eps_clip, c.eps_clip)
    return {
        "rollout_samples": samples,
        "actor_world_size": actor,
        "ref_world_size": ref,
        "critic_world_size": critic,
        "vllm_total_gpus": vllm,
        "gpus_required": (actor if c.colocate_all_models else
                          actor + critic + vllm if c.colocate_actor_ref else actor + ref + critic + vllm),
        "grad_accum_steps": c.train_batch_size // (c.micro_train_batch_size * actor),
        "critic_grad_accum_steps": (
            c.train_batch_size // (c.critic_micro_train_batch_size * critic) if critic else 0
        ),
        "micro_rollout_batches": samples // c.micro_rollout_batch_size,
        "train_steps_per_rollout": steps_per_rollout,
        "max_rollouts_per_episode": rollouts,
        "max_train_steps_per_episode": rollouts * steps_per_rollout,
        "max_train_steps": run_rollouts * steps_per_rollout,
        "max_sequence_len": c.prompt_max_len + c.generate_max_len,
        "multi_turn": bool(tool_names(c)),
        "tool_names": tool_names(c),
        "needs_critic": needs_critic,
        "needs_ref": needs_ref,
        "eps_clip_low": low,
        "eps_clip_high": high,
        "kl_penalty_coef": c.init_kl_coef if needs_ref and not c.use_kl_loss else 0.0,
        "kl_loss_coef": c.init_kl_coef if needs_ref and c.use_kl_loss else 0.0,
        "advantage_norm": advantage_norm(c),
    }


# --- required inputs and reward source ------------------------------------------------------------------
@_rule("pretrain", "prompt_data")
def _required(c: Config) -> Iterator[str]:
    if not c.pretrain:
        yield "--pretrain is required: the HF model name or path of the policy model"
    if not c.prompt_data:
        yield "--prompt_data is required: the HF dataset name or path of the prompts"


@_rule("remote_rm_url", "reward_fn")
def _reward_source(c: Config) -> Iterator[str]:
    if not c.remote_rm_url and not c.reward_fn:
        yield "no reward: give exactly one of --remote_rm_url URL[,URL...] or --reward_fn NAME"
    elif c.remote_rm_url and c.reward_fn:
        yield (f"--remote_rm_url {','.join(c.remote_rm_url)} and --reward_fn {c.reward_fn} both given: "
               "exactly one reward source is allowed")  # fmt: skip
    for url in c.remote_rm_url:
        if url.endswith(".py"):
            yield f"--remote_rm_url {url}: a local reward script is given with --reward_fn 'module:function'"
        elif not url.startswith(("http://", "https://")):
            yield f"--remote_rm_url {url}: expected an http:// or https:// URL"
    if c.reward_fn and not _REWARD_FN_RE.match(c.reward_fn):
        yield f"--reward_fn {c.reward_fn!r}: expected a registered name or 'package.module:function'"


_URL_PLACEHOLDER = re.compile(r"\{[^}]*\}")


@_rule("retriever_url")
def _retriever_url(c: Config) -> Iterator[str]:
    url = c.retriever_url
    if url is None:
        return
    if not url.startswith(("http://", "https://")):
        yield (f"--retriever_url {url!r}: expected an http:// or https:// URL of the retrieval service, e.g. "
               "http://{node_ip}:8000/retrieve")
    others = sorted(set(_URL_PLACEHOLDER.findall(url)) - {"{node_ip}"})
    if others:
        yield (f"--retriever_url {url!r}: unknown placeholder {', '.join(others)}; only {{node_ip}} (the "
               "address of the engine's node) is replaced")


_BUILTIN_TOOLS = ("search", "python", "http")
_PLUGIN_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_TOOL_NAME_RE = re.compile(r"^[A-Za-z_]\w*$")


@_rule("tools", "retriever_url", "http_tool_url", "http_tool_name", "http_tool_template", "tool_max_calls",
       "max_turns", "tool_format", "apply_chat_template")
def _tools(c: Config) -> Iterator[str]:
    names = list(c.tools)
    for name in names:
        if name not in _BUILTIN_TOOLS and not _PLUGIN_RE.match(name):
            yield (f"--tools {','.join(names)}: unknown tool {name!r}; expected {', '.join(_BUILTIN_TOOLS)} or a "
                   "plug-in 'package.module:factory'")
    if len(set(names)) != len(names):
        yield f"--tools {','.join(names)}: a tool is named twice"
    if names and "search" in names and c.retriever_url is None:
        yield "--tools search needs --retriever_url URL (the retrieval service, e.g. http://{node_ip}:8000/retrieve)"
    if names and "search" not in names and c.retriever_url is not None:
        yield (f"--retriever_url is only used by the search tool; --tools {','.join(names)} has none (add search "
               "or drop the flag)")
    if "http" in names:
        url = c.http_tool_url
        if url is None:
            yield "--tools http needs --http_tool_url URL (the service each call is POSTed to)"
        elif not url.startswith(("http://", "https://")):
            yield f"--http_tool_url {url!r}: expected an http:// or https:// URL"
        elif sorted(set(_URL_PLACEHOLDER.findall(url)) - {"{node_ip}"}):
            yield f"--http_tool_url {url!r}: only the {{node_ip}} placeholder is replaced"
        if not _TOOL_NAME_RE.match(c.http_tool_name) or c.http_tool_name in ("search", "python"):
            yield (f"--http_tool_name {c.http_tool_name!r}: expected letters, digits and '_' (it is the tag "
                   "<NAME>...</NAME>), not another tool's name")
        from trainer.tools.http import template_fields

        try:
            template_fields(c.http_tool_template)
        except ValueError as e:
            yield f"{e}; expected a JSON body whose strings may hold {{NAME}}, e.g. '{{\"input\": \"{{input}}\"}}'"
    known = [n for n in tool_names(c) if n != "http"] + (["http", c.http_tool_name] if "http" in names else [])
    for item in c.tool_max_calls:
        name, eq, n = item.partition("=")
        if not eq or not n.strip().isdigit() or int(n) < 1:
            yield f"--tool_max_calls {item!r}: expected NAME=N with N >= 1 (e.g. python=4)"
        elif name.strip() not in known and not any(_PLUGIN_RE.match(t) for t in names):
            yield f"--tool_max_calls {item!r}: {name.strip()!r} is not one of the tools ({', '.join(tool_names(c)) or 'none'})"
        elif int(n) > c.max_turns:
            yield (f"--tool_max_calls {item}: more than --max_turns {c.max_turns}, the most calls of all tools "
                   "together")
    if c.tool_format == "json" and tool_names(c) and not c.apply_chat_template:
        yield ("--tool_format json needs --apply_chat_template: the calls and their results are the chat "
               "template's tool messages")


# --- batch arithmetic ---------------------------------------------------------------------------------
@_rule("rollout_batch_size", "n_samples_per_prompt", "train_batch_size")
def _rollout_fills_train_batches(c: Config) -> Iterator[str]:
    samples = c.rollout_batch_size * c.n_samples_per_prompt
    if samples % c.train_batch_size:
        yield (f"--rollout_batch_size {c.rollout_batch_size} * --n_samples_per_prompt {c.n_samples_per_prompt}"
               f" = {samples} samples per rollout must be divisible by --train_batch_size {c.train_batch_size}"
               f" ({samples} % {c.train_batch_size} = {samples % c.train_batch_size})")  # fmt: skip


def _grad_accum_problem(c: Config, role: str) -> Iterator[str]:
    micro_flag = "micro_train_batch_size" if role == "actor" else f"{role}_micro_train_batch_size"
    micro = getattr(c, micro_flag)
    per_step = micro * _world(c, role)
    if c.train_batch_size % per_step:
        yield (f"--train_batch_size {c.train_batch_size} must be divisible by --{micro_flag} "
               f"{micro} * {_world_text(c, role)} = {per_step} "
               f"({c.train_batch_size} % {per_step} = {c.train_batch_size % per_step})")  # fmt: skip


@_rule("train_batch_size", "micro_train_batch_size", "actor_num_nodes", "actor_num_gpus_per_node")
def _actor_grad_accum(c: Config) -> Iterator[str]:
    yield from _grad_accum_problem(c, "actor")


@_rule("train_batch_size", "critic_micro_train_batch_size", "critic_num_nodes", "critic_num_gpus_per_node",
       "advantage_estimator", "micro_train_batch_size")  # fmt: skip
def _critic_grad_accum(c: Config) -> Iterator[str]:
    if has_critic(c):
        yield from _grad_accum_problem(c, "critic")


@_rule("rollout_batch_size", "micro_rollout_batch_size", "n_samples_per_prompt", "actor_num_nodes",
       "actor_num_gpus_per_node")  # fmt: skip
def _micro_rollout(c: Config) -> Iterator[str]:
    if c.rollout_batch_size % c.micro_rollout_batch_size:
        yield (f"--rollout_batch_size {c.rollout_batch_size} must be divisible by --micro_rollout_batch_size "
               f"{c.micro_rollout_batch_size} ({c.rollout_batch_size} % {c.micro_rollout_batch_size} = "
               f"{c.rollout_batch_size % c.micro_rollout_batch_size})")  # fmt: skip
    batches = c.rollout_batch_size * c.n_samples_per_prompt // c.micro_rollout_batch_size
    if batches < _world(c, "actor"):
        yield (f"--rollout_batch_size {c.rollout_batch_size} * --n_samples_per_prompt {c.n_samples_per_prompt}"
               f" // --micro_rollout_batch_size {c.micro_rollout_batch_size} = {batches} micro rollout batches"
               f" is fewer than the {_world_text(c, 'actor')}: every actor rank needs at least one")  # fmt: skip


@_rule("max_samples", "rollout_batch_size")
def _enough_samples(c: Config) -> Iterator[str]:
    if c.max_samples < c.rollout_batch_size:
        yield (f"--max_samples {c.max_samples} < --rollout_batch_size {c.rollout_batch_size}: an episode would "
               "hold no complete rollout batch (the last partial batch is dropped)")  # fmt: skip


# --- algorithm ------------------------------------------------------------------------------------------
@_rule("advantage_estimator", "n_samples_per_prompt")
def _groups_need_samples(c: Config) -> Iterator[str]:
    if estimator(c.advantage_estimator).group_baseline and c.n_samples_per_prompt < 2:
        yield (
            f"--advantage_estimator {c.advantage_estimator} requires --n_samples_per_prompt > 1 (got "
            f"{c.n_samples_per_prompt}): its baseline comes from the other samples of the same prompt"
        )


@_rule("advantage_estimator", "critic_pretrain", "pretrain")
def _critic(c: Config) -> Iterator[str]:
    if has_critic(c) and not c.critic_pretrain:
        yield (
            f"--advantage_estimator {c.advantage_estimator} requires a critic: give --critic_pretrain (it "
            "defaults to --pretrain, which is missing)"
        )
    elif not has_critic(c) and c.critic_pretrain:
        yield (
            f"--critic_pretrain {c.critic_pretrain} is only used by --advantage_estimator {_critic_estimators()}; "
            f"{c.advantage_estimator} has no critic (drop the flag)"
        )


@_rule("advantage_estimator", "gamma")
def _gamma(c: Config) -> Iterator[str]:
    if not estimator(c.advantage_estimator).any_gamma and c.gamma != 1.0:
        yield (
            f"--gamma {c.gamma:g} with --advantage_estimator {c.advantage_estimator}: sequence-level "
            f"estimators use gamma = 1 (OpenRLHF silently resets it); drop --gamma or use "
            f"{_names(lambda e: e.any_gamma)}"
        )


@_rule("eps_clip", "eps_clip_low_high")
def _clip(c: Config) -> Iterator[str]:
    if c.eps_clip_low_high is None:
        return
    low, high = c.eps_clip_low_high
    if low >= 1:
        yield f"--eps_clip_low_high {low:g} {high:g}: LOW must be < 1 (the ratio is clipped below at 1 - LOW)"
    if c.eps_clip != _default(c, "eps_clip"):
        yield (f"--eps_clip {c.eps_clip:g} and --eps_clip_low_high {low:g} {high:g} both given: the pair replaces "
               "--eps_clip (drop one)")  # fmt: skip


@_rule("reward_clip_range")
def _reward_clip(c: Config) -> Iterator[str]:
    low, high = c.reward_clip_range
    if not low < high:
        yield f"--reward_clip_range {low:g} {high:g}: expected LOW < HIGH"


@_rule("advantage_estimator", "no_advantage_std_norm", "rloo_whiten")
def _advantage_normalisation(c: Config) -> Iterator[str]:
    e = estimator(c.advantage_estimator)
    if c.rloo_whiten != _default(c, "rloo_whiten") and not e.whiten_switch:
        yield (f"--rloo_whiten {c.rloo_whiten} only applies to --advantage_estimator "
               f"{_names(lambda x: x.whiten_switch)}, not {c.advantage_estimator} (drop the flag)")  # fmt: skip
    elif c.no_advantage_std_norm and advantage_norm(c) == "none":
        why = "--rloo_whiten off" if e.whiten_switch else f"{c.advantage_estimator} does not whiten over the batch"
        yield (f"--no_advantage_std_norm has no effect: the advantages are not normalised over the batch ({why}); "
               "drop the flag")  # fmt: skip


@_rule("freezing_actor_steps", "advantage_estimator", "max_steps")
def _critic_warmup(c: Config) -> Iterator[str]:
    if c.freezing_actor_steps <= 0:
        return
    if not has_critic(c):
        yield (f"--freezing_actor_steps {c.freezing_actor_steps} warms up a critic; --advantage_estimator "
               f"{c.advantage_estimator} has none (use {_critic_estimators()} or drop the flag)")  # fmt: skip
    elif c.max_steps is not None and c.freezing_actor_steps >= c.max_steps:
        yield (f"--freezing_actor_steps {c.freezing_actor_steps} >= --max_steps {c.max_steps}: the policy would "
               "never be trained")  # fmt: skip


@_rule("profile_step", "max_steps", "max_samples", "rollout_batch_size", "num_episodes")
def _profile_step(c: Config) -> Iterator[str]:
    if c.profile_step <= 0 or c.rollout_batch_size <= 0:
        return
    run_rollouts = c.total_rollouts(c.max_samples)  # at most: the data may hold fewer prompts
    if c.profile_step > run_rollouts:
        yield (f"--profile_step {c.profile_step} is beyond the run's last step {run_rollouts} (--max_steps, or "
               "--max_samples / --rollout_batch_size * --num_episodes): nothing would be profiled; pick 1.."
               f"{run_rollouts}")  # fmt: skip


# Flags that act only in some configurations: set to anything but their default elsewhere they would be
# accepted and ignored, so they are an error. (flag names, condition, what is missing here, the condition)
_ONLY_WITH: list[tuple[tuple[str, ...], str, Callable[[Config], str], Callable[[Config], bool]]] = [
    (("critic_learning_rate", "critic_num_nodes", "critic_num_gpus_per_node", "critic_micro_train_batch_size",
      "critic_lr_warmup_ratio", "value_clip", "lambd", "save_value_network"),
     f"--advantage_estimator {_names(lambda e: e.critic)} (a critic)",
     lambda c: f"{c.advantage_estimator} has no critic", has_critic),
    (("ref_num_nodes", "ref_num_gpus_per_node", "kl_estimator", "ref_zero_stage"), "a reference model (--init_kl_coef > 0)",
     lambda c: "--init_kl_coef 0 creates none", has_ref),
    (("sft_output_key", "sft_learning_rate", "sft_data"), "--sft_warmup_steps > 0",
     lambda c: "there is no supervised warm-up", lambda c: c.sft_warmup_steps > 0),
    (("wandb_project", "wandb_run_name"), "--use_wandb", lambda c: "W&B logging is off",
     lambda c: c.use_wandb is not None),
    (("remote_rm_timeout", "remote_rm_retries", "reward_outage_timeout"), "--remote_rm_url", lambda c: "the reward is a local function",
     lambda c: bool(c.remote_rm_url)),
    (("vllm_gpu_memory_utilization", "vllm_sync_backend", "sync_bucket_bytes", "vllm_in_process",
      "vllm_cudagraph_mode", "vllm_compile", "vllm_prewarm_kernels", "vllm_preload_workers"), "--rollout_backend vllm",
     lambda c: "the HF engine generates", lambda c: c.rollout_backend == "vllm"),
    (("max_turns", "state_masking", "tool_format", "tool_max_calls", "tool_max_result_tokens",
      "tool_max_sample_tokens", "tool_rejoin_steps"),
     "--tools or --retriever_url (multi-turn tool rollouts)", lambda c: "rollouts are single-turn without tools",
     lambda c: bool(tool_names(c))),
    (("retriever_topk", "retriever_timeout", "retriever_retries", "retriever_outage_timeout"),
     "the search tool (--retriever_url)", lambda c: "no rollout searches", lambda c: c.retriever_url is not None),
    (("python_timeout", "python_cpu_s", "python_memory_mb", "python_max_procs", "python_max_output", "python_disk_mb",
      "python_parallel", "python_executable", "python_site_packages"),
     "--tools python", lambda c: "no rollout runs python", lambda c: "python" in tool_names(c)),
    (("http_tool_url", "http_tool_name", "http_tool_template", "http_tool_result_key", "http_tool_token_file",
      "http_tool_timeout", "http_tool_retries", "http_tool_outage_timeout"),
     "--tools http", lambda c: "no rollout calls the http tool", lambda c: "http" in tool_names(c)),
    (("profile_trace",), "--profile_step N", lambda c: "no step is profiled", lambda c: c.profile_step > 0),
    (("max_staleness",), "--async_train", lambda c: "training is synchronous", lambda c: c.async_train),
    (("adam_offload_ratio",), "--adam_offload with --zero_stage 3 (DeepSpeed's partial offload)",
     lambda c: "the Adam states are not offloaded" if not c.adam_offload else f"ZeRO stage {c.zero_stage} offloads all",
     lambda c: c.adam_offload and c.zero_stage == 3),
    (("vllm_start_with_models",), "--colocate_all_models and --rollout_backend vllm",
     lambda c: "the engines do not share the models' GPUs", lambda c: c.colocate_all_models and c.rollout_backend == "vllm"),
    (("prime_models",), "--vllm_start_with_models where the engines share the models' devices (--colocate_all_models "
     "with --rollout_backend vllm)", lambda c: "colocated engines measure the free memory as they start, and the "
     "priming's would be counted against their KV cache",
     lambda c: c.vllm_start_with_models or not (c.colocate_all_models and c.rollout_backend == "vllm")),
    (("vllm_preload_workers",), "--vllm_tensor_parallel_size > 1 and --vllm_in_process (engines whose own process "
     "starts their TP workers)",
     lambda c: f"engines of TP {c.vllm_tensor_parallel_size} have no workers of their own"
     if c.vllm_tensor_parallel_size < 2 else "without it each engine's core runs in a process vLLM spawns, whose "
     "executor starts workers of its own and never takes the preloaded ones",
     lambda c: c.rollout_backend != "vllm" or (c.vllm_tensor_parallel_size > 1 and c.vllm_in_process)),
    (("dynamic_filtering_reward_range", "dynamic_filtering_max_rounds"), "--dynamic_filtering",
     lambda c: "every prompt is kept", lambda c: c.dynamic_filtering),
    (("is_correction_threshold",), "--is_correction tis, icepop or seq-mask-tis", lambda c: "no correction is made",
     lambda c: c.is_correction != "none"),
    (("eval_input_key", "eval_label_key", "eval_steps", "eval_at_start", "eval_n_samples", "eval_temperature",
      "save_best"), "--eval_data", lambda c: "there is nothing to evaluate on", lambda c: c.eval_data is not None),
    (("save_hf_ckpt",), "--save_steps > 0 (it is saved with each checkpoint)",
     lambda c: "no checkpoint is saved during training", lambda c: c.save_steps > 0),
    (("use_ds_universal_ckpt",), "--load_checkpoint (it says how a checkpoint is loaded)",
     lambda c: "this run loads none", lambda c: c.load_checkpoint),
]  # fmt: skip


def _default(c: Config, name: str) -> Any:
    return next(spec.default for spec in flag_specs(type(c)) if spec.name == name)


def _only_with_rule(names: tuple[str, ...], condition: str, missing: Callable[[Config], str],
                    applies: Callable[[Config], bool]) -> Rule:
    reads = {"advantage_estimator", "init_kl_coef", "sft_warmup_steps", "use_wandb", "remote_rm_url",
             "rollout_backend", "save_steps", "retriever_url", "tools", "async_train", "dynamic_filtering", "is_correction",
             "colocate_all_models", "load_checkpoint", "eval_data", "profile_step", "vllm_start_with_models",
             "vllm_tensor_parallel_size", "vllm_in_process",
             *names}

    @_rule(*reads)
    def only_with(c: Config) -> Iterator[str]:
        if applies(c):
            return
        for name in names:
            value = getattr(c, name)
            if value != _default(c, name):
                shown = "" if isinstance(value, bool) else f" {value:g}" if isinstance(value, float) else f" {value}"
                yield f"--{name}{shown} is only used with {condition}; {missing(c)} (drop the flag)"

    return only_with


for _entry in _ONLY_WITH:
    _only_with_rule(*_entry)


@_rule("async_train", "colocate_all_models", "max_staleness", "rollout_backend")
def _async_needs_engines_of_their_own(c: Config) -> Iterator[str]:
    if not c.async_train:
        return
    if c.colocate_all_models:
        yield ("--async_train with --colocate_all_models: the engines share the policy's GPUs, and one GPU cannot "
               "generate the next rollout while it trains on this one; drop --colocate_all_models (engines on "
               "GPUs of their own) or --async_train")
    if c.max_staleness < 1:
        yield (f"--async_train with --max_staleness {c.max_staleness}: a rollout made while the policy trains is "
               "at least one version old; use --max_staleness >= 1, or drop --async_train for on-policy training")


@_rule("is_correction", "skip_rollout_logprobs")
def _is_correction_needs_rollout_logprobs(c: Config) -> Iterator[str]:
    if c.is_correction != "none" and c.skip_rollout_logprobs:
        yield (f"--is_correction {c.is_correction} with --skip_rollout_logprobs: the correction weighs each token "
               "by pi_train / pi_rollout and needs the engines' log-probs; drop --skip_rollout_logprobs")


@_rule("old_logprobs", "rollout_batch_size", "n_samples_per_prompt", "train_batch_size", "max_epochs",
       "init_kl_coef", "use_kl_loss", "skip_rollout_logprobs", "is_correction")
def _old_logprobs_source(c: Config) -> Iterator[str]:
    if c.old_logprobs == "train":
        samples = c.rollout_batch_size * c.n_samples_per_prompt
        steps = _steps_per_rollout(c)
        if steps != 1:
            yield (f"--old_logprobs train with {steps} optimizer steps per rollout (--rollout_batch_size "
                   f"{c.rollout_batch_size} x --n_samples_per_prompt {c.n_samples_per_prompt} / --train_batch_size "
                   f"{c.train_batch_size} x --max_epochs {c.max_epochs}): after the first step the policy has moved "
                   "and its own log-probs are no longer the old ones; use one step per rollout (--train_batch_size "
                   f"{samples} --max_epochs 1) or --old_logprobs policy")
        if has_ref(c) and not c.use_kl_loss:
            yield (f"--old_logprobs train with a KL penalty in the reward (--init_kl_coef {c.init_kl_coef:g}): the "
                   "rewards need the policy's log-probs before training; use --use_kl_loss, --init_kl_coef 0, or "
                   "--old_logprobs policy")
    if c.old_logprobs == "rollout":
        if c.skip_rollout_logprobs:
            yield ("--old_logprobs rollout with --skip_rollout_logprobs: the engines' log-probs are the old ones; "
                   "drop --skip_rollout_logprobs")
        if c.is_correction != "none":
            yield (f"--old_logprobs rollout with --is_correction {c.is_correction}: the correction weighs by "
                   "pi_old / pi_rollout, which is 1 when the engines' log-probs are the old ones; use --old_logprobs "
                   "policy (or train) with the correction")


@_rule("is_correction_threshold")
def _is_band(c: Config) -> Iterator[str]:
    low, high = c.is_correction_threshold
    if not low <= high:
        yield f"--is_correction_threshold {low:g} {high:g}: expected LOW <= HIGH"


@_rule("dynamic_filtering_reward_range")
def _filter_range(c: Config) -> Iterator[str]:
    low, high = c.dynamic_filtering_reward_range
    if not low < high:
        yield f"--dynamic_filtering_reward_range {low:g} {high:g}: expected LOW < HIGH (prompts with LOW < mean < HIGH are kept)"


@_rule("use_kl_loss", "init_kl_coef")
def _kl_loss_needs_coef(c: Config) -> Iterator[str]:
    if c.use_kl_loss and not has_ref(c):
        yield (
            f"--use_kl_loss with --init_kl_coef {c.init_kl_coef:g}: the KL loss weight is init_kl_coef and "
            "0 disables the reference model; set --init_kl_coef > 0"
        )


# --- placement and rollout engine --------------------------------------------------------------------------
@_rule("colocate_all_models", "rollout_backend", "vllm_num_engines", "vllm_tensor_parallel_size",
       "actor_num_nodes", "actor_num_gpus_per_node")  # fmt: skip
def _colocated_vllm(c: Config) -> Iterator[str]:
    if not (c.colocate_all_models and c.rollout_backend == "vllm" and c.vllm_num_engines):
        return
    vllm = c.vllm_num_engines * c.vllm_tensor_parallel_size
    if vllm != _world(c, "actor"):
        yield (
            f"--colocate_all_models requires --vllm_num_engines {c.vllm_num_engines} * "
            f"--vllm_tensor_parallel_size {c.vllm_tensor_parallel_size} = {vllm} vLLM GPUs to equal the "
            f"{_world_text(c, 'actor')}"
        )


@_rule("colocate_all_models", "colocate_actor_ref", "init_kl_coef", "advantage_estimator", "actor_num_nodes",
       "actor_num_gpus_per_node", "ref_num_nodes", "ref_num_gpus_per_node", "critic_num_nodes",
       "critic_num_gpus_per_node")  # fmt: skip
def _colocated_placement(c: Config) -> Iterator[str]:
    if c.colocate_actor_ref and not has_ref(c):
        yield "--colocate_actor_ref without a reference model (--init_kl_coef 0): nothing to colocate; drop the flag"
    if c.colocate_actor_ref and c.colocate_all_models:
        yield "--colocate_actor_ref with --colocate_all_models: the second already puts the reference there; drop one"
    if not (c.colocate_all_models or c.colocate_actor_ref):
        return
    flag = "--colocate_all_models" if c.colocate_all_models else "--colocate_actor_ref"
    actor = (c.actor_num_nodes, c.actor_num_gpus_per_node)
    roles = [("ref", has_ref(c)), ("critic", has_critic(c) and c.colocate_all_models)]
    for role, present in roles:
        placement = (getattr(c, f"{role}_num_nodes"), getattr(c, f"{role}_num_gpus_per_node"))
        if present and placement != actor:
            yield (f"{flag} requires the {role} placement to equal the actor's: "
                   f"--{role}_num_nodes {placement[0]} x --{role}_num_gpus_per_node {placement[1]} != "
                   f"--actor_num_nodes {actor[0]} x --actor_num_gpus_per_node {actor[1]}")  # fmt: skip


@_rule("rollout_backend", "vllm_num_engines", "vllm_tensor_parallel_size", "vllm_enable_sleep",
       "enable_prefix_caching", "enforce_eager", "vllm_cudagraph_mode", "vllm_compile", "colocate_all_models")  # fmt: skip
def _rollout_backend(c: Config) -> Iterator[str]:
    if c.rollout_backend == "vllm":
        if c.vllm_num_engines == 0:
            yield (
                "--vllm_num_engines 0 with --rollout_backend vllm: need at least 1 engine "
                "(for HF generate() rollouts use --rollout_backend hf)"
            )
        if c.vllm_enable_sleep and not c.colocate_all_models:
            yield (
                "--vllm_enable_sleep only applies with --colocate_all_models (OpenRLHF silently turns it "
                "off): add --colocate_all_models or drop --vllm_enable_sleep"
            )
        if c.vllm_cudagraph_mode == "full":
            yield ("--vllm_cudagraph_mode full: whole CUDA graphs for the steps that hold a prefill make the engine "
                   "compute wrong log-probs (vLLM 0.26 on an H200, 2026-11-28: 0.84 nats off a transformers forward "
                   "of the same tokens on average, NaN after a tool's result, against 0.001-0.004 by default; "
                   "torchtitan saw degenerate tokens, pytorch/torchtitan#3685); expected auto, full_and_piecewise, "
                   "full_decode_only, piecewise or none")
        elif c.enforce_eager and c.vllm_cudagraph_mode not in ("auto", "none"):
            yield (f"--vllm_cudagraph_mode {c.vllm_cudagraph_mode} with --enforce_eager: eager means no CUDA graphs "
                   "(drop one of them)")
        conflict = compile_conflict(c.vllm_compile, c.vllm_cudagraph_mode, c.enforce_eager)
        if conflict:
            other = ("--enforce_eager" if conflict[0] == "enforce_eager"
                     else f"--vllm_cudagraph_mode {c.vllm_cudagraph_mode}")
            yield f"--vllm_compile {c.vllm_compile} with {other}: {conflict[1]}"
        return
    if c.vllm_num_engines:
        yield f"--vllm_num_engines {c.vllm_num_engines} with --rollout_backend hf: vLLM is not used"
    if c.vllm_tensor_parallel_size != 1:
        yield (
            f"--vllm_tensor_parallel_size {c.vllm_tensor_parallel_size} with --rollout_backend hf: "
            "vLLM is not used"
        )
    for switch in ("vllm_enable_sleep", "enable_prefix_caching", "enforce_eager"):
        if getattr(c, switch):
            yield f"--{switch} with --rollout_backend hf: vLLM is not used (drop the flag)"


# --- data, checkpoints, logging ---------------------------------------------------------------------------
@_rule("input_template", "apply_chat_template")
def _input_template(c: Config) -> Iterator[str]:
    if c.input_template is None:
        return
    if "{}" not in c.input_template:
        yield f"--input_template {c.input_template!r}: must contain '{{}}' where the prompt goes"
    if c.apply_chat_template:
        yield "--input_template and --apply_chat_template both given: the template would be ignored"


@_rule("save_steps")
def _save_steps(c: Config) -> Iterator[str]:
    if c.save_steps == 0 or c.save_steps < -1:
        yield f"--save_steps {c.save_steps}: expected -1 (no checkpoints during training) or >= 1"


@_rule("eval_data", "eval_steps", "eval_at_start", "eval_n_samples", "save_best")
def _evaluation(c: Config) -> Iterator[str]:
    if c.eval_steps == 0:
        yield "--eval_steps 0: expected -1 (no evaluation during training) or N >= 1 (every N steps)"
    if c.eval_data is not None and c.eval_steps < 1 and not c.eval_at_start:
        yield (f"--eval_data {c.eval_data} without --eval_steps N or --eval_at_start: it would never be evaluated "
               "on (add --eval_steps N)")
    if c.save_best is not None and c.eval_data is not None:
        k = c.eval_n_samples
        name, _, at = c.save_best.partition("@")
        if not c.save_best.startswith("eval/") or c.save_best == "eval/":
            yield (f"--save_best {c.save_best!r}: expected an eval metric: eval/greedy, eval/pass@{k}, eval/mean@{k} "
                   "or eval/<a log of the reward, e.g. accuracy>")
        elif name in ("eval/pass", "eval/mean") and at != str(k):
            yield (f"--save_best {c.save_best}: the evaluation samples --eval_n_samples {k} answers per prompt, so "
                   f"its metric is {name}@{k}")
        elif c.eval_steps < 1:
            yield (f"--save_best {c.save_best} with --eval_at_start only: one evaluation has nothing to compare; add "
                   "--eval_steps N")


@_rule("save_path", "ckpt_path", "input_key", "wandb_project")
def _non_empty(c: Config) -> Iterator[str]:
    for name in ("save_path", "ckpt_path", "input_key", "wandb_project"):
        if not getattr(c, name):
            yield f"--{name} is empty: expected a non-empty string"
