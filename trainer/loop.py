"""The RL training loop, run by `python -m trainer.train_ppo_ray` inside a Ray job.

One step, top to bottom: generate -> score -> advantages -> train -> sync -> metrics
(`Trainer.step`). The policy, reference and (PPO with GAE) critic groups are
DeepSpeed models on Ray actor groups, rollout engines are vLLM (or HF generate)
Ray actors, rewards come from the remote reward service or a local function.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path

import torch

from trainer import checkpoint
from trainer.data import PromptSampler, prompts_from_config
from trainer.experience import Experience, build_experience, pad_right, shard
from trainer.learn.algorithms import RunningMeanStd, advantages_from_config, normalize_reward
from trainer.learn.critic_worker import CriticWorker
from trainer.learn.group import ActorGroup, GroupSpec, bundle_nodes
from trainer.learn.losses import PolicyObjective, compute_kl, masked_mean, rollout_mismatch
from trainer.learn.model_worker import ModelWorker
from trainer.metrics import MetricsLogger, Timer, WandbLogger
from trainer.placement import GroupPlan, plan
from trainer.reward.client import RemoteRewardClient, token_from_env
from trainer.reward.local import resolve_reward_fn
from trainer.rollout.engines import Engines
from trainer.rollout.evaluate import Evaluator
from trainer.rollout.producer import AsyncRollouts, Rollout, SyncRollouts
from trainer.schedule import learning_rate
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


class Trainer:
    def __init__(self, cfg):
        import ray
        from transformers import AutoTokenizer

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
        self.policy = self._group(ModelWorker, self.plan.group("policy"))
        self.ref = self._group(ModelWorker, self.plan.group("reference")) if self.plan.group("reference") else None
        self.critic = self._group(CriticWorker, self.plan.group("critic")) if self.plan.group("critic") else None
        # Engines on their own devices start now: vLLM's start-up (weights, KV cache, compilation) overlaps
        # the models' set-up and the warm-up, and the weight-sync group forms at the first push. Colocated
        # engines start once the models are up (they share the models' GPUs: vLLM sizes its memory from
        # what is free when it starts).
        self.engines: Engines | None = None if self.plan.engines.colocated else Engines(cfg, self.plan)
        if self.engines is None and cfg.vllm_start_with_models and self.plan.use_gpus:  # KV cache sized up front
            self.engines = Engines(cfg, self.plan, self.policy.pg, bundle_nodes(self.policy.pg))
        model_args = dict(zero_stage=cfg.zero_stage, bf16=cfg.bf16, seed=cfg.seed, temperature=cfg.temperature,
                          flash_attn=cfg.flash_attn, packing_samples=cfg.packing_samples)
        self.policy.run("init_model", cfg.pretrain, micro_batch=cfg.micro_train_batch_size,
                        grad_accum=cfg.grad_accum_steps, learning_rate=cfg.actor_learning_rate,
                        adam_offload=cfg.adam_offload, adam_offload_ratio=cfg.adam_offload_ratio,
                        gradient_checkpointing=cfg.gradient_checkpointing, l2=cfg.l2, max_norm=cfg.max_norm,
                        **model_args)
        if self.ref is not None:
            self.ref.run("init_model", cfg.pretrain, micro_batch=cfg.micro_rollout_batch_size, learning_rate=None,
                         **model_args)
        if self.critic is not None:
            self.critic.run("init_model", cfg.critic_pretrain, zero_stage=cfg.zero_stage, bf16=cfg.bf16,
                            micro_batch=cfg.critic_micro_train_batch_size, grad_accum=cfg.critic_grad_accum_steps,
                            learning_rate=cfg.critic_learning_rate, adam_offload=cfg.adam_offload,
                            adam_offload_ratio=cfg.adam_offload_ratio,
                            gradient_checkpointing=cfg.gradient_checkpointing, l2=cfg.l2, max_norm=cfg.max_norm,
                            seed=cfg.seed, flash_attn=cfg.flash_attn, packing_samples=cfg.packing_samples)
        if self.engines is None:
            self.engines = Engines(cfg, self.plan, self.policy.pg, bundle_nodes(self.policy.pg))
        self.weight_sync = make_weight_sync(cfg, self.plan, self.policy, self.engines)
        if self.plan.weight_transport != "broadcast":  # the broadcast group says so when it forms
            print(f"weight sync: {self.weight_sync.describe()}", flush=True)
        # colocated vLLM on GPUs: engines release their memory between generate and the next sync
        self._sleeps = cfg.vllm_enable_sleep and cfg.rollout_backend == "vllm" and use_gpus
        self._wake_need: dict[str, int] = {}
        self.sampler = PromptSampler(self.prompts, cfg.rollout_batch_size, seed=cfg.seed)
        self.sampler_state = self.sampler.state_dict()  # after the last batch trained on (checkpoints)
        self.rollouts: SyncRollouts | AsyncRollouts = SyncRollouts(self)
        self.total_train_steps = cfg.total_train_steps(len(self.prompts))
        self.opt_step = 0  # optimizer steps taken: the position in the LR schedule (checkpointed)
        self.norm = RunningMeanStd() if cfg.normalize_reward else None
        self.step_no = 0
        wandb = (WandbLogger(cfg.use_wandb, cfg.wandb_project, cfg.wandb_run_name, cfg.to_dict(redact=True))
                 if cfg.use_wandb else None)
        self.metrics = MetricsLogger(cfg.metrics_path or str(Path(cfg.save_path) / "metrics.jsonl"),
                                     cfg.use_tensorboard, wandb=wandb)
        self.evaluator = Evaluator(self)  # --eval_data: eval/* every --eval_steps (trainer.rollout.evaluate)
        if cfg.sft_warmup_steps:
            self.warmup()
        resumed = bool(cfg.load_checkpoint) and self._resume()
        note = self.metrics.begin(self.step_no if resumed else None)  # one run's steps, once each
        if note:
            print(note, flush=True)

    def _group(self, worker_cls: type, group: GroupPlan) -> ActorGroup:
        """An actor group as the plan places it (in the policy's placement group when colocated)."""
        spec = GroupSpec(group.name, group.num_nodes, group.gpus_per_node, group.use_gpus,
                         gpus_per_actor=group.gpus_per_actor, cpus_per_actor=group.cpus_per_actor)
        return ActorGroup(worker_cls, spec, pg=self.policy.pg if group.in_policy_group else None,
                          placement_timeout=self.cfg.placement_timeout, dist_timeout=self.cfg.dist_timeout)

    # --- supervised warm-up ----------------------------------------------------------------------------

    def warmup(self) -> None:
        """--sft_warmup_steps optimizer steps of NLL on `sft_output_key + eos`, then the reference and the
        engines take the warmed-up weights (the KL anchors there). Seeded, so a resumed run repeats it
        exactly before its checkpoint replaces the policy."""
        import ray

        from trainer.data import chat_tools, load_prompts

        cfg, tok = self.cfg, self.tokenizer
        # Own warm-up data (--sft_data) is read whole: --max_samples caps the RL prompts.
        data, stats = load_prompts(cfg.sft_data or cfg.prompt_data, input_key=cfg.input_key,
                                   label_key=cfg.sft_output_key, apply_chat_template=cfg.apply_chat_template,
                                   input_template=cfg.input_template,
                                   max_samples=None if cfg.sft_data else cfg.max_samples,
                                   prompt_max_len=cfg.prompt_max_len, tokenizer=tok, require_labels=True,
                                   chat_tools=chat_tools(cfg))
        print(f"warm-up data ({cfg.sft_data or cfg.prompt_data}, {cfg.sft_output_key!r} as targets): "
              f"{stats.as_dict()}", flush=True)
        eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        prompt_ids = [tok(p.text, add_special_tokens=False)["input_ids"] for p in data]
        target_ids = [tok(p.label, add_special_tokens=False)["input_ids"] + [eos] for p in data]
        self.policy.run("set_learning_rate", cfg.sft_learning_rate or cfg.actor_learning_rate)
        gen = torch.Generator().manual_seed(cfg.seed)
        for step in range(1, cfg.sft_warmup_steps + 1):
            idx = torch.randint(len(data), (cfg.train_batch_size,), generator=gen).tolist()
            exp = build_experience([prompt_ids[i] for i in idx], [target_ids[i] for i in idx], pad)
            losses = self.policy.run_sharded("train_sft", self._micro(exp, torch.arange(len(idx)), self.policy))
            print(f"warm-up step {step}/{cfg.sft_warmup_steps}: loss/sft={sum(losses) / len(losses):.4f}", flush=True)
        self.policy.run("set_learning_rate", cfg.actor_learning_rate)
        self.policy.run("reset_optimizer_state")
        if self.ref is not None:
            state = ray.put(self.policy.run("full_state")[0])
            self.ref.run("load_full_state", state)
        self.sync_weights()

    def _micro(self, exp: Experience, rows: torch.Tensor, group: ActorGroup,
               size: int | None = None) -> list[list[dict[str, torch.Tensor]]]:
        """`rows` of `exp` split over the ranks of `group`, each rank's share cut into micro-batches of `size`
        (default --micro_train_batch_size)."""
        size = size or self.cfg.micro_train_batch_size
        return [[exp.rows(mine[i:i + size]) for i in range(0, len(mine), size)]
                for mine in (rows[idx] for idx in shard(len(rows), group.spec.world_size))]

    # --- one RL step ---------------------------------------------------------------------------------

    def step(self) -> dict[str, float]:
        """generate -> score -> advantages -> train -> sync -> metrics, for one rollout batch (made now, or
        ahead of training with --async_train: trainer.rollout.producer)."""
        cfg = self.cfg
        self.timer.times.clear()
        self.step_no += 1
        t0 = time.perf_counter()
        rollout = self.rollouts.next(self.step_no)  # prompts drawn, generated, scored (and filtered)
        if self._sleeps:  # colocated on GPUs: the engines hand their memory to training until the next sync
            with self.timer("sleep"):
                freed = self.sleep_engines()
        with self.timer("make_experience"):
            exp, extra = self.make_experience(rollout)
        with self.timer("train"):
            train_metrics = self.train(exp)
        with self.timer("sync"):
            synced = self.rollouts.push(self.sync_weights)
        self.sampler_state = rollout.sampler_state
        evals = self.evaluator.after_step(self.step_no)  # with the weights just synced, every --eval_steps
        metrics = {**rollout.metrics, **extra, **train_metrics, **evals, **self.timer.times,
                   "sync/gib": synced / 2**30, "timing/step": time.perf_counter() - t0}
        if self._sleeps:
            metrics["memory/engine_freed_gib"] = freed / 2**30
        if self.step_no % cfg.logging_steps == 0 or evals:
            self.metrics.log(self.step_no, metrics)
        if cfg.save_steps > 0 and self.step_no % cfg.save_steps == 0:
            self.save_checkpoint()
        return metrics

    def generate_batch(self, texts: list[str], seed: int) -> tuple[list, list[dict[str, float]]]:
        """Samples of ``texts`` from the engines, with the engines' log-probs of them (unless
        --skip_rollout_logprobs), and for multi-turn search rollouts (--retriever_url) each engine's time
        split."""
        self.engines.wait_ready()
        restore = functools.partial(self.rollouts.restore, self.sync_weights)  # replaced engines need the weights
        if self.cfg.multi_turn:
            return self.engines.generate_with_tools(texts, seed=seed, restore=restore)
        return self.engines.generate(texts, seed=seed, logprobs=not self.cfg.skip_rollout_logprobs,
                                     restore=restore), []

    def score(self, prompts, samples):
        """The rewards of ``samples`` (RewardBatch; the same number of samples per prompt, prompt-major), by the
        remote service or the local function."""
        n = len(samples) // max(len(prompts), 1)
        labels = [p.label for p in prompts for _ in range(n)]
        return self.reward([s.prompt + s.response for s in samples], [s.prompt for s in samples], labels)

    def sleep_engines(self) -> int:
        """Every engine releases its weights and KV cache (vLLM sleep level 2); returns the bytes freed. What
        the engines freed on each GPU, summed, is what waking them needs back there (``_wake_need``)."""
        self._wake_need = self.engines.sleep()
        return sum(self._wake_need.values())

    def make_room_for_engines(self) -> bool:
        """Before sleeping engines wake: if a GPU has less free memory than its engines need back, the models
        hand their allocators' cached blocks back (emptying them costs the next step its allocations, so
        only then). Returns whether they did."""
        import ray

        groups = [g for g in (self.policy, self.ref, self.critic) if g is not None]
        free = ray.get([ref for g in groups for ref in g.async_run("device_free")])
        if not needs_room(free, self._wake_need):
            return False
        ray.get([ref for g in groups for ref in g.async_run("empty_cache")])
        return True

    def make_experience(self, rollout: Rollout) -> tuple[Experience, dict[str, float]]:
        import ray

        cfg = self.cfg
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
        # The models' forwards run at once (own processes, possibly one GPU).
        forwards = {"old_logprobs": self._per_rank(self.policy, "batch_logprobs", exp)}
        if self.ref is not None:
            forwards["ref_logprobs"] = self._per_rank(self.ref, "batch_logprobs", exp)
        if self.critic is not None:
            forwards["values"] = self._per_rank(self.critic, "batch_values", exp)
        rewards = rollout.rewards
        raw = torch.tensor(rewards.rewards, dtype=torch.float32)
        scores = normalize_reward(raw, self.norm) if self.norm is not None else raw
        for name, refs in forwards.items():
            setattr(exp, name, torch.cat(ray.get(refs)))
        kl = None
        if self.ref is not None:
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
                 "tokens/real": float(exp.attention_mask.sum()), "tokens/padded": float(exp.input_ids.numel())}
        if exp.values is not None:
            extra["critic/returns"] = masked_mean(exp.returns, exp.action_mask).item()
        if kl is not None:
            extra["kl/mean"] = masked_mean(kl, exp.action_mask).item()
        if exp.rollout_logprobs is not None:
            extra.update(rollout_mismatch(exp.old_logprobs, exp.rollout_logprobs, exp.action_mask))
        extra.update({f"reward/{k}": v for k, v in rewards.extra_logs.items()
                      if k in ("accuracy", "n_timeout", "exact_match", "f1")})
        if cfg.multi_turn:
            extra.update(tool_metrics(samples, rollout.tool_stats, cfg.tool_names))
        return exp, extra

    @staticmethod
    def _per_rank(group: ActorGroup, method: str, exp: Experience) -> list:
        """`method` on one shard of the rows per rank (refs; ray.get and concatenate them: row order)."""
        parts = shard(exp.input_ids.size(0), group.spec.world_size)
        return group.async_run_sharded(method, [exp.rows(idx) for idx in parts])

    def train(self, exp: Experience) -> dict[str, float]:
        import ray

        cfg = self.cfg
        b = exp.input_ids.size(0)
        sums: dict[str, float] = {}
        steps = 0
        objective = PolicyObjective.from_config(cfg)  # the loss --print-config describes, for every rank
        # critic warm-up (--freezing_actor_steps): the first N rollout steps train the critic only, and the
        # actor's LR schedule starts when the actor does
        frozen = max(cfg.freezing_actor_steps, 0)
        actor_trains = self.step_no > frozen
        for epoch in range(cfg.max_epochs):
            gen = torch.Generator().manual_seed(cfg.seed * 100_003 + self.step_no * 101 + epoch)
            perm = torch.randperm(b, generator=gen)
            for start in range(0, b, cfg.train_batch_size):
                batch = perm[start:start + cfg.train_batch_size]
                refs = []
                if actor_trains:
                    lr = learning_rate(cfg.actor_learning_rate, self.opt_step - frozen * cfg.train_steps_per_rollout,
                                       self.total_train_steps, cfg.lr_warmup_ratio, cfg.lr_scheduler)
                    refs = self.policy.async_run_sharded("train_policy", self._micro(exp, batch, self.policy), objective,
                                                         lr=lr)
                    sums["lr/actor"] = sums.get("lr/actor", 0.0) + lr
                if self.critic is not None:  # the critic steps on the same minibatch, at the same time
                    clr = learning_rate(cfg.critic_learning_rate, self.opt_step, self.total_train_steps,
                                        cfg.critic_lr_warmup_ratio, cfg.lr_scheduler)
                    micro = self._micro(exp, batch, self.critic, cfg.critic_micro_train_batch_size)
                    crefs = self.critic.async_run_sharded("train_critic", micro, value_clip=cfg.value_clip, lr=clr)
                    for key, value in _mean_of(ray.get(crefs)).items():
                        sums[key] = sums.get(key, 0.0) + value
                    sums["lr/critic"] = sums.get("lr/critic", 0.0) + clr
                if refs:
                    for key, value in _mean_of(ray.get(refs)).items():
                        sums[key] = sums.get(key, 0.0) + value
                steps += 1
                self.opt_step += 1
        return {k: v / max(steps, 1) for k, v in sums.items()}

    def sync_weights(self) -> int:
        """Policy -> engines through the plan's transport (:mod:`trainer.weights.transports`); sleeping engines wake
        their weights first (their KV cache once the weights are in), and the engines reset their prefix
        cache. Returns the bytes of weights handed over."""
        self.engines.wait_ready()  # the engines' start-up overlapped the models' and the warm-up; needed now
        if self._sleeps:  # the weights' memory back (contents undefined until the push below)
            self.make_room_for_engines()
            self.engines.wake(tags=["weights"])
        return self.weight_sync.push()

    # --- checkpoints ---------------------------------------------------------------------------------

    def save_checkpoint(self, tag: str | None = None, *, hf: bool | None = None, root: str | None = None) -> Path:
        """The policy's (and critic's) DeepSpeed state and the client state (step, optimizer steps, sampler,
        reward normaliser), written atomically under --ckpt_path, or under ``root`` (the best one of
        --save_best, :mod:`trainer.rollout.evaluate`) (:mod:`trainer.checkpoint`); ``hf`` (default --save_hf_ckpt) adds
        the HF model. ``tag`` None: ``global_step<N>``, which becomes ``latest``, older ones past --max_ckpt_num
        go. A tag of the caller's: kept beside them, replaced atomically when saved again, never ``latest``, never
        pruned. Returns the checkpoint's directory."""
        cfg = self.cfg
        client = {"step": self.step_no, "opt_step": self.opt_step, "sampler": self.sampler_state,
                  "norm": self.norm.state_dict() if self.norm else None}
        save_hf = cfg.save_hf_ckpt if hf is None else hf
        return checkpoint.save(Path(root or cfg.ckpt_path), tag or f"global_step{self.step_no}", self._checkpointed(), client,
                               hf=self.policy if save_hf else None, latest=tag is None,
                               keep=cfg.max_ckpt_num if tag is None else None)

    def _checkpointed(self) -> dict[str, ActorGroup]:
        """The groups a checkpoint holds, by name (the reference model is rebuilt: --pretrain, the warm-up)."""
        return {"policy": self.policy, **({"critic": self.critic} if self.critic is not None else {})}

    def _resume(self) -> bool:
        """Continue from the newest complete checkpoint in --ckpt_path (torn ones are named and skipped), on
        this run's placement: a group saved by another number of ranks loads DeepSpeed's universal checkpoint.
        False: there was none, the run starts fresh."""
        found = checkpoint.newest(Path(self.cfg.ckpt_path))
        if found is None:
            print(f"no complete checkpoint in {self.cfg.ckpt_path}; starting fresh", flush=True)
            return False
        client = checkpoint.load(found, self._checkpointed(), universal=self.cfg.use_ds_universal_ckpt)
        self.step_no = client["step"]
        self.opt_step = client.get("opt_step", 0)
        self.sampler.load_state_dict(client["sampler"])
        self.sampler_state = self.sampler.state_dict()
        if self.norm is not None and client.get("norm"):
            self.norm.load_state_dict(client["norm"])
        self.sync_weights()
        print(f"resumed from {found.path} (step {self.step_no})", flush=True)
        return True

    # --- run -----------------------------------------------------------------------------------------

    def fit(self) -> None:
        cfg = self.cfg
        total = cfg.total_rollouts(len(self.prompts))  # --max_steps, else every rollout of --num_episodes
        self.metrics.plan(total_steps=total, start_step=self.step_no, algorithm=cfg.advantage_estimator,
                          sft_warmup_steps=cfg.sft_warmup_steps)
        self.evaluator.at_start()  # --eval_at_start: step 0, the weights the run starts from
        if cfg.async_train:  # rollouts made ahead of training, at most --max_staleness versions old
            self.rollouts = AsyncRollouts(self, self.step_no + 1, total, cfg.max_staleness)
            self.rollouts.start()  # after the assignment: a replaced engine is restored through self.rollouts
        try:
            # async: the producer draws ahead, so the step count alone ends the run
            while self.step_no < total and (cfg.async_train or self.sampler.episode < cfg.num_episodes):
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


#: Free memory a GPU must have beyond what a waking engine takes back (fragmentation, the CUDA graphs' pool).
WAKE_MARGIN = 1.1


def needs_room(free: list[tuple[str, int]], wake_need: dict[str, int]) -> bool:
    """Whether any GPU has less free memory than its sleeping engines need to wake: ``free`` is each model
    rank's view of its device (UUID, free bytes), ``wake_need`` the bytes the engines' sleep freed per device
    (summed over engines that share one), with :data:`WAKE_MARGIN`. A GPU no engine sleeps on needs nothing;
    without GPUs there is nothing to make room for."""
    return any(nbytes < WAKE_MARGIN * wake_need.get(device, 0) for device, nbytes in free)


def tool_metrics(samples, stats: list[dict[str, float]], tools: tuple[str, ...] = ("search",)) -> dict[str, float]:
    """What a multi-turn rollout did: ``tools/rate`` (share of samples that called a tool at least once),
    ``tools/calls`` (calls per sample), ``tools/turns`` (generation turns per sample), ``tools/inserted_tokens``
    (tool tokens per sample), ``tools/errors`` (share of the calls whose result was an error or a timeout), and per
    tool ``tools/<name>/rate``, ``calls``, ``errors``, ``timeouts``; with the search tool also the first four
    under ``search/*``, as Search-R1's runs logged them; and where the engines' time went:
    ``rollout/tool_s`` and ``rollout/other_s`` (the tools' calls; tokenising and bookkeeping between turns)
    against ``rollout/generate_s`` (the engines' generate calls), each the slowest engine's."""
    n = max(len(samples), 1)
    out = {"tools/rate": sum(s.tool_calls > 0 for s in samples) / n,
           "tools/calls": sum(s.tool_calls for s in samples) / n,
           "tools/turns": sum(s.turns for s in samples) / n,
           "tools/inserted_tokens": sum(len(s.action_mask or ()) - sum(s.action_mask or ()) for s in samples) / n}
    if "search" in tools:
        out.update({f"search/{key.split('/')[1]}": value for key, value in list(out.items())})
    for key in ("generate_s", "tool_s", "other_s"):
        out[f"rollout/{key}"] = max((st.get(key, 0.0) for st in stats), default=0.0)
    summed: dict[str, float] = {}
    for st in stats:
        for key, value in st.items():
            if key.startswith("tool/"):
                summed[key] = summed.get(key, 0.0) + value
    names = sorted({key.split("/")[1] for key in summed})
    calls = sum(summed[f"tool/{t}/calls"] for t in names)
    out["tools/errors"] = sum(summed[f"tool/{t}/errors"] for t in names) / calls if calls else 0.0
    for t in names:
        out[f"tools/{t}/rate"] = summed[f"tool/{t}/samples"] / n
        out[f"tools/{t}/calls"] = summed[f"tool/{t}/calls"] / n
        out[f"tools/{t}/errors"] = summed[f"tool/{t}/errors"] / max(summed[f"tool/{t}/calls"], 1.0)
        out[f"tools/{t}/timeouts"] = summed[f"tool/{t}/timeouts"] / max(summed[f"tool/{t}/calls"], 1.0)
    return out


def _mean_of(results: list[dict[str, float]]) -> dict[str, float]:
    """The per-rank metric dicts of one train call, averaged over ranks."""
    return {key: sum(r[key] for r in results) / len(results) for key in results[0]}


def init_ray() -> None:
    """Join the cluster inside a Ray job (RAY_ADDRESS set by `rlrun submit`), else a private local Ray."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"])
    else:  # a local run: a private one-machine Ray, on loopback only
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False)


def run(cfg) -> int:
    """Train with `cfg` (a validated TrainerConfig); returns the exit code."""
    init_ray()
    trainer = Trainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    return 0
