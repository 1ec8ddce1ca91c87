"""The RL training loop, run by `python -m trainer.train_ppo_ray` inside a Ray job.

One step, top to bottom: generate -> score -> advantages -> train -> sync -> metrics
(`Trainer.step`). The policy, reference and (PPO with GAE) critic groups are
DeepSpeed models on Ray actor groups (:mod:`trainer.learn`), rollout engines are vLLM (or HF generate)
Ray actors (:mod:`trainer.rollout`), the weights reach them through the plan's transport
(:mod:`trainer.weights`), rewards come from the remote reward service or a local function.

This module wires the three packages: each part is handed what it needs (the engines, the prompt sampler, a
``score`` of the job's reward, the weight push ``sync_weights``, a checkpoint saver), never the trainer. The
supervised warm-up is :mod:`trainer.warmup`, the run's state and its checkpoints :mod:`trainer.run_state`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from trainer.data import PromptSampler, prompts_from_config
from trainer.experience import Experience, build_experience, micro_batches, pad_right, shard
from trainer.learn.algorithms import RunningMeanStd, advantages_from_config, normalize_reward
from trainer.learn.critic_worker import CriticWorker
from trainer.learn.group import ActorGroup, GroupSpec, bundle_nodes, reserve
from trainer.learn.losses import PolicyObjective, compute_kl, masked_mean, rollout_mismatch
from trainer.learn.model_worker import ModelWorker
from trainer.metrics import MetricsLogger, Timer, WandbLogger
from trainer.placement import GroupPlan, plan
from trainer.reward.client import RemoteRewardClient, token_from_env
from trainer.reward.local import resolve_reward_fn
from trainer.rollout import kernel_prewarm
from trainer.rollout.engines import Engines, prewarm_spec
from trainer.rollout.evaluate import Evaluator
from trainer.rollout.memory import EngineMemory
from trainer.rollout.producer import AsyncRollouts, Rollout, Rollouts, SyncRollouts, scorer
from trainer.run_state import Checkpoints, RunState
from trainer.schedule import learning_rate
from trainer.startup import Marks, latest, report
from trainer.warmup import warmup
from trainer.weights.transports import make_weight_sync

log = logging.getLogger("trainer")


def make_reward(cfg):
    """The reward: remote services (health-checked now, not an hour in) or a local function."""
    if cfg.remote_rm_url:
        client = RemoteRewardClient(list(cfg.remote_rm_url), token=token_from_env(),
                                    timeout=cfg.remote_rm_timeout, retries=cfg.remote_rm_retries,
                                    outage_timeout=cfg.reward_outage_timeout)
        client.health_check()
        return client.score
    return resolve_reward_fn(cfg.reward_fn)


def spec_of(group: GroupPlan) -> GroupSpec:
    """The actor group's spec of a planned group (trainer.placement)."""
    return GroupSpec(group.name, group.num_nodes, group.gpus_per_node, group.use_gpus,
                     gpus_per_actor=group.gpus_per_actor, cpus_per_actor=group.cpus_per_actor)


class Trainer:
    def __init__(self, cfg, prewarm: kernel_prewarm.Prewarm | None = None):
        """``prewarm``: the kernel prewarm started on the driver's node (:func:`head_prewarm`); the
        engines stop it once they are ready."""
        import ray
        from transformers import AutoTokenizer

        self.startup_marks = Marks()  # the driver's: its process's start, then these (trainer.startup)
        self.startup_marks.mark("trainer")
        self.cfg = cfg
        self.timer = Timer()
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.pretrain)
        self.prompts, stats = prompts_from_config(cfg, self.tokenizer)
        print(f"data: {stats.as_dict()}", flush=True)
        self.reward = make_reward(cfg)
        use_gpus = ray.cluster_resources().get("GPU", 0) >= 1
        node_gpus = max((n["Resources"].get("GPU", 0) for n in ray.nodes() if n.get("Alive")), default=0)
        self.plan = plan(cfg, use_gpus, node_gpus)  # the same plan rlrun's pre-submit check validated
        # Every model group reserves its placement group first, in the plan's order, then the engines on devices
        # of their own reserve theirs: none can take a device another's placement needs.
        # Colocated engines start once the models are up (they share the models' GPUs: vLLM sizes its memory
        # from what is free when it starts), or with --vllm_start_with_models (their KV cache sized up front)
        # first of all: in the policy's placement group as soon as it is reserved, before any model worker's
        # process starts (2026-11-28, 7B on 4 H200s: started after the model groups' processes were up, the
        # engines' processes began 41 s into the driver's, 28 s after the models' workers)
        self.engines: Engines | None = None
        policy_plan, early_pg = self.plan.group("policy"), None
        if self.plan.engines.colocated and cfg.vllm_start_with_models and self.plan.use_gpus:
            early_pg = reserve(spec_of(policy_plan), cfg.placement_timeout)
            self.engines = Engines(cfg, self.plan, early_pg, bundle_nodes(early_pg), prewarm)
        self.policy = self._group(ModelWorker, policy_plan, own_pg=early_pg)
        self.ref = self._group(ModelWorker, self.plan.group("reference")) if self.plan.group("reference") else None
        self.critic = self._group(CriticWorker, self.plan.group("critic")) if self.plan.group("critic") else None
        # Engines on their own devices start now: vLLM's start-up (weights, KV cache, compilation) overlaps
        # the models' set-up and the warm-up, and the weight-sync group forms at the first push.
        if not self.plan.engines.colocated:
            self.engines = Engines(cfg, self.plan, head_prewarm=prewarm)
        model_args = dict(zero_stage=cfg.zero_stage, bf16=cfg.bf16, seed=cfg.seed, temperature=cfg.temperature,
                          flash_attn=cfg.flash_attn, packing_samples=cfg.packing_samples,
                          use_liger_kernel=cfg.use_liger_kernel)
        # The groups load their models at once (each its own process group; before 2026-11-28 one after the
        # other, the reference waiting for the policy's load).
        loading = [self.policy.async_run(
            "init_model", cfg.pretrain, micro_batch=cfg.micro_train_batch_size, grad_accum=cfg.grad_accum_steps,
            learning_rate=cfg.actor_learning_rate, adam_offload=cfg.adam_offload,
            adam_offload_ratio=cfg.adam_offload_ratio, gradient_checkpointing=cfg.gradient_checkpointing,
            l2=cfg.l2, max_norm=cfg.max_norm, **model_args)]
        if self.ref is not None:
            loading.append(self.ref.async_run("init_model", cfg.pretrain, micro_batch=cfg.micro_rollout_batch_size,
                                              learning_rate=None, **{**model_args, "zero_stage": cfg.ref_zero_stage}))
        if self.critic is not None:
            loading.append(self.critic.async_run(
                "init_model", cfg.critic_pretrain, zero_stage=cfg.zero_stage, bf16=cfg.bf16,
                micro_batch=cfg.critic_micro_train_batch_size, grad_accum=cfg.critic_grad_accum_steps,
                learning_rate=cfg.critic_learning_rate, adam_offload=cfg.adam_offload,
                adam_offload_ratio=cfg.adam_offload_ratio, gradient_checkpointing=cfg.gradient_checkpointing,
                l2=cfg.l2, max_norm=cfg.max_norm, seed=cfg.seed, flash_attn=cfg.flash_attn,
                packing_samples=cfg.packing_samples, use_liger_kernel=cfg.use_liger_kernel))
        ray.get([ref for refs in loading for ref in refs])
        self.startup_marks.mark("models")
        if self.engines is None:
            self.engines = Engines(cfg, self.plan, self.policy.pg, bundle_nodes(self.policy.pg), prewarm)
        self.priming = self._prime()  # --prime_models: beside the engines' start; step 1 waits for it
        self.weight_sync = make_weight_sync(cfg, self.plan, self.policy, self.engines)
        if self.plan.weight_transport != "broadcast":  # the broadcast group says so when it forms
            print(f"weight sync: {self.weight_sync.describe()}", flush=True)
        models = [g for g in (self.policy, self.ref, self.critic) if g is not None]
        # colocated vLLM on GPUs: engines release their memory between generate and the next sync
        self.memory = EngineMemory(self.engines, models, cfg.vllm_enable_sleep and cfg.rollout_backend == "vllm"
                                   and use_gpus)
        self.state = RunState(PromptSampler(self.prompts, cfg.rollout_batch_size, seed=cfg.seed),
                              RunningMeanStd() if cfg.normalize_reward else None)
        self.checkpoints = Checkpoints(cfg, self.state, {"policy": self.policy, **(
            {"critic": self.critic} if self.critic is not None else {})}, push=self.sync_weights)
        score = scorer(self.reward)
        # rollouts made now, or ahead of training at most --max_staleness versions old (--async_train)
        parts = (cfg, self.state.sampler, self.engines, score, self.sync_weights)
        self.rollouts: Rollouts = (AsyncRollouts(*parts, max_staleness=cfg.max_staleness) if cfg.async_train
                                   else SyncRollouts(*parts))
        self.total_train_steps = cfg.total_train_steps(len(self.prompts))
        wandb = (WandbLogger(cfg.use_wandb, cfg.wandb_project, cfg.wandb_run_name, cfg.to_dict(redact=True))
                 if cfg.use_wandb else None)
        self.metrics = MetricsLogger(cfg.metrics_path or str(Path(cfg.save_path) / "metrics.jsonl"),
                                     cfg.use_tensorboard, wandb=wandb)
        # --eval_data: eval/* every --eval_steps (trainer.rollout.evaluate); --save_best keeps the best checkpoint
        self.evaluator = Evaluator(cfg, self.tokenizer, self.engines, score, self.sync_weights, self.rollouts.exclusive,
                                   save=lambda directory: self.checkpoints.save(root=directory))
        if cfg.sft_warmup_steps:
            warmup(cfg, self.tokenizer, self.policy, self.ref, self.sync_weights)
        resumed = self.checkpoints.resume() if cfg.load_checkpoint else None
        note = self.metrics.begin(resumed)  # one run's steps, once each
        if note:
            print(note, flush=True)

    def _prime(self) -> list[Any]:
        """Each model's first forward (and the policy's first backward) on dummy tokens, started now, beside the
        engines' start (ModelWorker.prime), with --prime_models. The config check refuses the flag where
        colocated engines profile the free memory as they start (without --vllm_start_with_models): what the
        priming holds then would be taken from their KV cache. Returns the calls' refs."""
        cfg = self.cfg
        if not cfg.prime_models:
            return []
        refs = self.policy.async_run("prime", cfg.micro_train_batch_size, True)
        if self.ref is not None:
            refs += self.ref.async_run("prime", cfg.micro_rollout_batch_size, False)
        return refs

    def _group(self, worker_cls: type, group: GroupPlan, own_pg: object = None) -> ActorGroup:
        """An actor group as the plan places it (in the policy's placement group when colocated; ``own_pg``: its
        own placement group, reserved ahead with :func:`spec_of`)."""
        pg = own_pg if own_pg is not None else self.policy.pg if group.in_policy_group else None
        return ActorGroup(worker_cls, spec_of(group), pg=pg, owns_pg=own_pg is not None,
                          placement_timeout=self.cfg.placement_timeout, dist_timeout=self.cfg.dist_timeout)

    # --- one RL step ---------------------------------------------------------------------------------

    def step(self) -> dict[str, float]:
        """generate -> score -> advantages -> train -> sync -> metrics, for one rollout batch (made now, or
        ahead of training with --async_train: trainer.rollout.producer)."""
        cfg, state = self.cfg, self.state
        self.timer.times.clear()
        state.step += 1
        t0 = time.perf_counter()
        rollout = self.rollouts.next(state.step)  # prompts drawn, generated, scored (and filtered)
        if self.memory.sleeps:  # colocated on GPUs: the engines hand their memory to training until the next sync
            with self.timer("sleep"):
                freed = self.memory.sleep()
        if self.priming:  # step 1: the models' priming ran beside the engines' start and this rollout
            import ray

            with self.timer("prime_wait"):
                ray.get(self.priming)  # its errors are the job's
            self.priming = []
        profiled = self._profile_begin() if state.step == cfg.profile_step else []
        with self.timer("make_experience"):
            exp, extra = self.make_experience(rollout)
        with self.timer("train"):
            train_metrics = self.train(exp)
        if profiled:  # --profile_step: each group's rank 0, make_experience and train (trainer.learn.profile)
            train_metrics.update(self._profile_end(profiled))
        with self.timer("sync"):
            synced = self.rollouts.push()  # self.sync_weights, between two batches
        state.sampler_state = rollout.sampler_state
        evals = self.evaluator.after_step(state.step)  # with the weights just synced, every --eval_steps
        metrics = {**rollout.metrics, **extra, **train_metrics, **evals, **self.timer.times,
                   **self.weight_sync.timings, "sync/gib": synced / 2**30, "timing/step": time.perf_counter() - t0}
        if "step1" not in self.startup_marks:  # this run's first step: where the start-up went, once
            metrics.update(self._startup_report())
        if self.memory.sleeps:
            metrics["memory/engine_freed_gib"] = freed / 2**30
        if state.step % cfg.logging_steps == 0 or evals:
            self.metrics.log(state.step, metrics)
        if cfg.save_steps > 0 and state.step % cfg.save_steps == 0:
            self.checkpoints.save()
        return metrics

    def _startup_report(self) -> dict[str, float]:
        """Print and return (``startup/<who>/<mark>_s``) each process's start as seconds after the driver's
        process began: the driver's own marks, each model group's slowest rank (its marks read now, ``primed``
        included), each engine (trainer.startup)."""
        self.startup_marks.mark("step1")
        groups = {name: latest(group.run("startup")) for name, group in (
            ("policy", self.policy), ("reference", self.ref), ("critic", self.critic)) if group is not None}
        rows = {"driver": self.startup_marks.get(), **groups, **self.engines.startup_rows()}
        origin = rows["driver"].get("process", rows["driver"]["trainer"])
        line, metrics = report(rows, origin)
        print(line, flush=True)
        return metrics

    def _profile_begin(self) -> list[tuple[str, ActorGroup]]:
        """torch.profiler on rank 0 of every model group, into <save_path>/profile/<group>_step<N>.*"""
        groups = [(name, g) for name, g in (("policy", self.policy), ("ref", self.ref), ("critic", self.critic))
                  if g is not None]
        directory = Path(self.cfg.save_path) / "profile"
        for name, group in groups:
            group.run("profile_begin", str(directory / f"{name}_step{self.state.step}"), self.cfg.profile_trace)
        return groups

    def _profile_end(self, groups: list[tuple[str, ActorGroup]]) -> dict[str, float]:
        import ray

        from trainer.learn.profile import render

        # every group stops at once: summarising a 7B step takes its rank a minute, and a group stopped after
        # another's summary would count that minute in its window
        refs = {name: group.async_run("profile_end") for name, group in groups}
        out: dict[str, float] = {}
        for name, _ in groups:
            summary = next((s for s in ray.get(refs[name]) if s), None)
            if summary is None:
                continue
            print(f"{name} rank 0, step {self.state.step} (make_experience + train), "
                  f"{render(summary)}", flush=True)
            out[f"profile/{name}_wall_s"] = summary["wall_s"]
            out[f"profile/{name}_compute_s"] = summary["compute_s"]
            for kind, seconds in summary["by_kind_s"].items():
                out[f"profile/{name}_{kind}_s"] = seconds
        return out

    def make_experience(self, rollout: Rollout) -> tuple[Experience, dict[str, float]]:
        import ray

        cfg = self.cfg
        entered = time.time()
        samples = rollout.samples
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # --state_masking: the tool's tokens stay in the sequences but are no actions (no loss, KL, values)
        masks = [s.action_mask for s in samples] if cfg.state_masking else None
        exp = build_experience([s.prompt_token_ids for s in samples], [s.response_token_ids for s in samples], pad,
                               masks)
        if not cfg.skip_rollout_logprobs:
            missing = sum(s.logprobs is None for s in samples)
            if missing:
                raise RuntimeError(f"{missing} of {len(samples)} samples came back without the engine's log-probs; "
                                   "the engines were asked for them (--skip_rollout_logprobs to go without)")
            exp.rollout_logprobs = pad_right([s.logprobs for s in samples], exp.num_actions)
        # The models' forwards run at once (own processes, possibly one GPU). --old_logprobs train / rollout: no
        # policy forward (the train step's own log-probs, or the engines', are the old ones)
        forwards = {}
        called = time.time()
        if cfg.old_logprobs == "policy":
            forwards["old_logprobs"] = self._per_rank(self.policy, "batch_logprobs", exp)
        if self.ref is not None:
            forwards["ref_logprobs"] = self._per_rank(self.ref, "batch_logprobs", exp)
        if self.critic is not None:
            forwards["values"] = self._per_rank(self.critic, "batch_values", exp)
        rewards = rollout.rewards
        raw = torch.tensor(rewards.rewards, dtype=torch.float32)
        norm = self.state.norm
        scores = normalize_reward(raw, norm) if norm is not None else raw
        seconds, waits = {}, {}
        gathered = ray.get([ref for refs in forwards.values() for ref in refs])  # every model's, in one wait
        got = time.time()
        ended = max((end for *_, end in gathered), default=got)
        at = 0
        for name, refs in forwards.items():
            results, at = gathered[at:at + len(refs)], at + len(refs)
            setattr(exp, name, torch.cat([out for out, *_ in results]))
            seconds[name] = max(s for _, s, _, _ in results)
            waits[name] = max(started for _, _, started, _ in results) - called
        if cfg.old_logprobs == "rollout":
            exp.old_logprobs = exp.rollout_logprobs
        kl = None
        if self.ref is not None and exp.old_logprobs is not None:  # (train: a KL loss only, which the step logs)
            kl = compute_kl(exp.old_logprobs, exp.ref_logprobs, exp.action_mask, cfg.kl_estimator)
        # every choice (estimator, KL in the rewards or not, normalisation) as --print-config shows it
        exp.advantages, exp.returns = advantages_from_config(cfg, scores, exp.action_mask, kl=kl, values=exp.values)
        exp.scores = raw
        lengths = exp.action_mask.sum(-1)
        adv_mean = masked_mean(exp.advantages, exp.action_mask)
        extra = {"reward/mean": raw.mean().item(), "reward/std": raw.std(unbiased=False).item(),
                 "advantage/mean": adv_mean.item(),
                 "advantage/std": masked_mean((exp.advantages - adv_mean) ** 2, exp.action_mask).sqrt().item(),
                 "response_length/mean": lengths.mean().item(),
                 # what train() feeds the policy per epoch: real tokens, and with padding (throughput, MFU)
                 "tokens/real": float(exp.attention_mask.sum()), "tokens/padded": float(exp.input_ids.numel()),
                 # each model's forward in its slowest rank (make_experience's time is these, run at once,
                 # plus the transfers and the driver's own work), and how long after the driver's call its last
                 # rank started it (a rank still busy with earlier work; host clocks: across nodes their offset)
                 **{f"timing/forward/{_FORWARD_NAMES[name]}": s for name, s in seconds.items()},
                 **{f"timing/forward_wait/{_FORWARD_NAMES[name]}": s for name, s in waits.items()},
                 # the rest of the phase, in order: the driver's padding before its call, the last result's
                 # way back (the last rank's end to the driver holding every result), the driver's work after
                 "timing/make_experience/build": called - entered}
        if forwards:
            extra["timing/make_experience/return"] = got - ended
        if exp.values is not None:
            extra["critic/returns"] = masked_mean(exp.returns, exp.action_mask).item()
        if kl is not None:
            extra["kl/mean"] = masked_mean(kl, exp.action_mask).item()
        if exp.rollout_logprobs is not None and cfg.old_logprobs == "policy":  # else train()'s first step measures it
            extra.update(rollout_mismatch(exp.old_logprobs, exp.rollout_logprobs, exp.action_mask))
        extra.update({f"reward/{k}": v for k, v in rewards.extra_logs.items()
                      if k in ("accuracy", "n_timeout", "exact_match", "f1")})
        extra["timing/make_experience/post"] = time.time() - got
        return exp, extra

    def _per_rank(self, group: ActorGroup, method: str, exp: Experience) -> list:
        """`method` on one shard of the rows per rank, in forwards of --micro_rollout_batch_size rows: refs of
        (result, seconds in the worker, its start and end), in row order."""
        parts = shard(exp.input_ids.size(0), group.spec.world_size)
        return group.async_run_sharded("timed", [exp.rows(idx) for idx in parts], method,
                                       self.cfg.micro_rollout_batch_size)

    def train(self, exp: Experience) -> dict[str, float]:
        import ray

        cfg, state = self.cfg, self.state
        b = exp.input_ids.size(0)
        sums: dict[str, float] = {}
        once: dict[str, float] = {}
        steps = 0
        objective = PolicyObjective.from_config(cfg)  # the loss --print-config describes, for every rank
        # critic warm-up (--freezing_actor_steps): the first N rollout steps train the critic only, and the
        # actor's LR schedule starts when the actor does
        frozen = max(cfg.freezing_actor_steps, 0)
        actor_trains = state.step > frozen
        for epoch in range(cfg.max_epochs):
            gen = torch.Generator().manual_seed(cfg.seed * 100_003 + state.step * 101 + epoch)
            perm = torch.randperm(b, generator=gen)
            for start in range(0, b, cfg.train_batch_size):
                batch = perm[start:start + cfg.train_batch_size]
                refs = []
                if actor_trains:
                    lr = learning_rate(cfg.actor_learning_rate, state.opt_step - frozen * cfg.train_steps_per_rollout,
                                       self.total_train_steps, cfg.lr_warmup_ratio, cfg.lr_scheduler)
                    micro = micro_batches(exp, batch, self.policy.spec.world_size, cfg.micro_train_batch_size)
                    # no policy forward in make_experience: the first step's forward (the policy as it
                    # generated, up to the engines' numerics) measures the rollout mismatch instead
                    measure = cfg.old_logprobs != "policy" and steps == 0 and exp.rollout_logprobs is not None
                    refs = self.policy.async_run_sharded("train_policy", micro, objective, lr=lr,
                                                         measure_mismatch=measure)
                    sums["lr/actor"] = sums.get("lr/actor", 0.0) + lr
                if self.critic is not None:  # the critic steps on the same minibatch, at the same time
                    clr = learning_rate(cfg.critic_learning_rate, state.opt_step, self.total_train_steps,
                                        cfg.critic_lr_warmup_ratio, cfg.lr_scheduler)
                    micro = micro_batches(exp, batch, self.critic.spec.world_size, cfg.critic_micro_train_batch_size)
                    crefs = self.critic.async_run_sharded("train_critic", micro, value_clip=cfg.value_clip, lr=clr)
                    for key, value in _mean_of(ray.get(crefs)).items():
                        sums[key] = sums.get(key, 0.0) + value
                    sums["lr/critic"] = sums.get("lr/critic", 0.0) + clr
                if refs:
                    for key, value in _mean_of(ray.get(refs)).items():
                        if key.startswith("rollout/"):  # measured once, on the first step
                            once[key] = value
                        else:
                            sums[key] = sums.get(key, 0.0) + value
                steps += 1
                state.opt_step += 1
        return {**{k: v / max(steps, 1) for k, v in sums.items()}, **once}

    def sync_weights(self) -> int:
        """Policy -> engines through the plan's transport (:mod:`trainer.weights.transports`); sleeping engines
        wake their weights first (their KV cache once the weights are in: :mod:`trainer.rollout.memory`), and
        the engines reset their prefix cache. Returns the bytes of weights handed over."""
        # the sync's parts before the push's own (sync/gather_s, ...), in the step's timings: the wait for the
        # engines' start (step 1), then the weights' memory woken (room made first where needed)
        with self.timer("sync/ready"):
            self.engines.wait_ready()  # the engines' start-up overlapped the models' and the warm-up; needed now
        with self.timer("sync/wake"):
            self.memory.wake_weights()  # the weights' memory back (contents undefined until the push below)
        return self.weight_sync.push()

    # --- run -----------------------------------------------------------------------------------------

    def fit(self) -> None:
        cfg, state = self.cfg, self.state
        total = cfg.total_rollouts(len(self.prompts))  # --max_steps, else every rollout of --num_episodes
        self.metrics.plan(total_steps=total, start_step=state.step, algorithm=cfg.advantage_estimator,
                          sft_warmup_steps=cfg.sft_warmup_steps)
        evals = self.evaluator.at_start(state.step)  # --eval_at_start: step 0, the weights the run starts from
        if evals:
            self.metrics.log(0, evals)
        self.rollouts.start(state.step + 1, total)
        try:
            # async: the producer draws ahead, so the step count alone ends the run
            while state.step < total and (cfg.async_train or state.sampler.episode < cfg.num_episodes):
                self.step()
        finally:
            self.rollouts.close()
        self.policy.run("save_hf", self.cfg.save_path)
        self.tokenizer.save_pretrained(self.cfg.save_path)
        if self.critic is not None:  # as OpenRLHF: next to the policy, "<save_path>_critic"
            self.critic.run("save_hf", f"{self.cfg.save_path.rstrip('/')}_critic")

    def shutdown(self) -> None:
        self.metrics.close()
        if self.engines is not None:
            self.engines.shutdown()
        for group in (self.critic, self.ref, self.policy):
            if group is not None:
                group.shutdown()
        close = getattr(self.reward, "close", None)
        if close:
            close()



#: make_experience's forwards by the model that runs them (timing/forward/<model>)
_FORWARD_NAMES = {"old_logprobs": "policy", "ref_logprobs": "ref", "values": "critic"}


def _mean_of(results: list[dict[str, float]]) -> dict[str, float]:
    """The per-rank metric dicts of one train call, averaged over ranks (a ``*_max`` metric: their max)."""
    return {key: max(r[key] for r in results) if key.endswith("_max") else sum(r[key] for r in results) / len(results)
            for key in results[0]}


def init_ray() -> None:
    """Join the cluster inside a Ray job (RAY_ADDRESS set by `rlrun submit`), else a private local Ray."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"])
    else:  # a local run: a private one-machine Ray, on loopback only
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False)


def head_prewarm(cfg) -> kernel_prewarm.Prewarm | None:
    """--vllm_prewarm_kernels on a driver's node with a GPU: the kernel prewarm of the job's engines
    (:mod:`trainer.rollout.kernel_prewarm`) started there before anything else of the job, Ray included, so it
    has compiled the kernels before the engines of this node need them (a 7B job's engine processes began ~25 s
    after the driver's; each engine's own prewarm then finds the node's lock taken, or the marker). None
    otherwise (also when it cannot start: a warning, not the job's end)."""
    if not cfg.vllm_prewarm_kernels or not torch.cuda.device_count():
        return None
    spec = prewarm_spec(cfg, plan(cfg, use_gpus=True))
    return kernel_prewarm.start(spec) if spec is not None else None


def run(cfg) -> int:
    """Train with `cfg` (a validated TrainerConfig); returns the exit code."""
    prewarm = head_prewarm(cfg)
    try:
        init_ray()
        trainer = Trainer(cfg, prewarm)
        try:
            trainer.fit()
        finally:
            trainer.shutdown()
    finally:
        if prewarm is not None:  # a start that failed before the engines stopped it
            prewarm.finish()
    return 0
