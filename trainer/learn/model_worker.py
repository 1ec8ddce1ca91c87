"""A DeepSpeed model on one rank: policy (trainable) or reference (inference).

ZeRO-3 partitions the parameters at load time (HfDeepSpeedConfig before
from_pretrained), so no rank ever holds the full model in training; the same
code runs on CPU (gloo) and GPU (NCCL).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from trainer.checkpoint import CheckpointWorker
from trainer.learn.group import DistributedWorker
from trainer.learn.losses import (
    PolicyObjective,
    log_probs_from_logits,
    masked_mean,
    policy_objective,
    rollout_mismatch,
)
from trainer.learn.packing import pack, unpack
from trainer.weights.shared import push_shared


def require_cuda(flag: str, what: str) -> None:
    """One of :data:`trainer.config.CUDA_ONLY_FLAGS` on a node without CUDA: refused in one line."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"--{flag} needs CUDA GPUs ({what}); this node has none: drop the flag")


def attn_implementation(flash_attn: bool) -> str:
    """FlashAttention-2 when asked for (CUDA + the flash-attn package), else PyTorch's SDPA."""
    if not flash_attn:
        return "sdpa"
    require_cuda("flash_attn", "FlashAttention-2")
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        raise RuntimeError("--flash_attn needs the flash-attn package on the nodes (pip install flash-attn), "
                           "or drop the flag") from None
    return "flash_attention_2"


#: The version of liger-kernel the GPU nodes install (pyproject's extra ``gpu``) and the error names.
LIGER_PIN = "liger-kernel==0.8.5"


def liger_kernels(model: Any, enabled: bool) -> bool:
    """--use_liger_kernel: Liger's fused Triton kernels for RMSNorm, rotary embedding and SwiGLU in place of the
    loaded model's own modules (the element-wise part of every forward and backward: casts, ``cat``, SiLU times
    the gate). The weights, and their ZeRO-3 partitions, stay as they are, and so do the log-probs and losses:
    Liger's fused linear cross-entropy, which returns a loss instead of per-token log-probs, is not used. The
    rotary function is replaced for the process (Liger patches the model's module). True where applied."""
    if not enabled:
        return False
    require_cuda("use_liger_kernel", "Liger's kernels are Triton's")
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        raise RuntimeError(f"--use_liger_kernel needs the liger-kernel package on the GPU nodes ({LIGER_PIN}, "
                           "in the stack's extra gpu), or drop the flag") from None
    model_type = getattr(model.config, "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise RuntimeError(f"--use_liger_kernel: Liger has no kernels for model type {model_type!r} (it has them "
                           f"for {', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}); drop the flag")
    _apply_liger_kernel_to_instance(model=model, rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=False)
    return True


#: ZeRO-3 keeps parameters up to this many elements whole on every rank (biases, norms) instead of gathering
#: them at every module: fewer hooks per forward/backward. Weight sync reads them from their partitions
#: like the others (tests/integration/test_sync_zero3.py covers both kinds).
PERSISTENCE_THRESHOLD = 100_000  # DeepSpeed's default; 0.74x the train phase of threshold 0 on one H100


#: No ZeRO-3 module-granularity setting by default (``stage3_module_granularity_threshold``). From 2026-11-24
#: to 2026-11-27 it was on for CUDA at 5e6 parameters per module, where it made a model up to ~1e9 parameters
#: (the 0.5B shape, the tiny demo models) ONE ZeRO-3 leaf module: "faster" (the 0.5B train phase on an H100
#: 4.41 -> 1.68 s) because nothing was trained. A leaf module's gradients are reduced by a backward hook that
#: fires only for inputs that need a gradient (DeepSpeed PR 5008/5074); a whole model's input is token ids, so
#: its gradients never reached the optimizer (grad norm 0, the warm-up's loss flat for 400 steps on an H200,
#: reproduced on one CPU rank: tests/integration/test_zero3_granularity.py). check_granularity refuses it.
GRANULARITY_THRESHOLD = 0


#: The sequence lengths --prime_models runs: Triton specialises a kernel on each integer argument that is a
#: multiple of 16 (and on 1), and Liger's rotary kernel takes the sequence length as one: both classes.
PRIME_LENGTHS = (32, 33)


def padded_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_actions: int,
                    temperature: float = 1.0) -> torch.Tensor:
    """The log-probs of the last ``num_actions`` tokens of each row of a padded batch (left-padded prompts,
    right-padded responses, as trainer.experience.build_experience lays them out): one forward with the
    attention mask, positions counting the real tokens. The trainer's unpacked path, and what
    bench/gpu/logprob_check.py measures against the engines."""
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logp = log_probs_from_logits(logits[:, :-1], input_ids[:, 1:], temperature=temperature)
    return logp[:, -num_actions:]


def fp32_rope(model: torch.nn.Module) -> int:
    """Put the rotary embeddings' frequencies back in float32; returns how many modules it changed.

    Under ZeRO-3 with bf16, ``from_pretrained`` builds the model inside DeepSpeed's ``zero.Init``, which casts
    the floating-point buffers to bf16 too, so ``inv_freq`` loses all but 8 bits (``0.6494`` becomes
    ``0.6484``). A plain load keeps it in float32, and so does vLLM's own RoPE. The rotation angle is
    ``position x inv_freq``, so the error grows along the sequence. On a model whose attention is sharp, as
    a trained model's is, that made the trainer's log-probs 6x further from float32 than the bf16 weights
    alone do (0.068 against 0.011 mean |difference| over 1,000 tokens; tests/integration/test_rope_precision.py).
    The engines then disagree with the policy on every long sequence. The frequencies are recomputed from the
    config, as transformers initialises them, in float32 (the forward already computes the angles in float32)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    changed = 0
    for module in model.modules():
        freq = getattr(module, "inv_freq", None)
        if not isinstance(freq, torch.Tensor) or freq.dtype == torch.float32 or not hasattr(module, "config"):
            continue
        rope_type = getattr(module, "rope_type", "default")
        init = {"default": getattr(module, "compute_default_rope_parameters", None), **ROPE_INIT_FUNCTIONS}.get(rope_type)
        if init is None:
            raise RuntimeError(f"{type(module).__name__}: RoPE type {rope_type!r} has no init function in this "
                               "transformers; its inv_freq stays in " + str(freq.dtype))
        value, _ = init(module.config)  # (config) only: as transformers calls it, in 5.17 and 5.19
        module.inv_freq = value.to(device=freq.device, dtype=torch.float32)
        if isinstance(getattr(module, "original_inv_freq", None), torch.Tensor):
            module.original_inv_freq = module.inv_freq.clone()
        changed += 1
    return changed


def top_granularity(model: torch.nn.Module) -> int:
    """DeepSpeed's "module granularity" of the model itself (ZeRO-3 ``_get_granularity_recursively``): its
    parameters over its parameter-holding modules + 1, containers not counted; sys.maxsize (never one unit)
    for a container, a module without children or above 1e9 parameters."""
    def numel(p: torch.nn.Parameter) -> int:
        return int(getattr(p, "ds_numel", p.numel()))

    def walk(m: torch.nn.Module) -> tuple[int, int]:
        if next(m.parameters(), None) is None:
            return 0, 0
        params = sum(numel(p) for p in m.parameters(recurse=False))
        children = list(m.children())
        if not children:
            return 1, params
        layers = 0
        for child in children:
            n, p = walk(child)
            layers, params = layers + n, params + p
        if type(m).__name__ in torch.nn.modules.container.__all__:
            return layers, params
        return layers + 1, params

    layers, params = walk(model)
    if (not layers or params > 10**9 or next(model.children(), None) is None  # a torch leaf module: never
            or type(model).__name__ in torch.nn.modules.container.__all__):
        return sys.maxsize
    return params // layers


def grad_norm(engine: Any) -> float:
    """The global gradient norm of a DeepSpeed engine's last optimizer step (before clipping); NaN when DeepSpeed
    kept none."""
    norm = engine.get_global_grad_norm()
    return float("nan") if norm is None else float(norm)


def check_granularity(model: torch.nn.Module, config: dict[str, Any]) -> None:
    """Refuse a module-granularity setting (an explicit ``granularity_threshold``) that makes the whole model one
    ZeRO-3 leaf module: DeepSpeed would never reduce its gradients (see GRANULARITY_THRESHOLD), and training
    would change no weight without a word. A setting that makes only inner modules leaves (their inputs are
    hidden states, which need gradients) is left as it is."""
    threshold = config["zero_optimization"].get("stage3_module_granularity_threshold", 0)
    granularity = top_granularity(model)
    if threshold and granularity <= threshold:
        raise ValueError(
            f"stage3_module_granularity_threshold {threshold} makes the whole model one ZeRO-3 leaf module (its "
            f"granularity is {granularity}): DeepSpeed reduces a leaf module's gradients only through inputs that "
            "need a gradient, and a model's input is token ids, so no weight would ever change; expected 0 (off) "
            f"or a threshold below {granularity}")


def ds_config(zero_stage: int, bf16: bool, micro_batch: int, grad_accum: int, adam_offload: bool = False,
              max_norm: float = 1.0, train: bool = True,
              persistence_threshold: int | None = None, granularity_threshold: int | None = None,
              offload_ratio: float = 1.0) -> dict[str, Any]:
    """The DeepSpeed config of one model (training or inference). granularity_threshold: ZeRO-3 fetches
    modules of fewer parameters per descendant than this as one unit (one hook instead of one per child);
    None = GRANULARITY_THRESHOLD (0, off: see there). offload_ratio: with adam_offload, the share of the
    optimizer's sub-groups on the host (DeepSpeed ZeRO-3's ``offload_optimizer.ratio``; 1: all)."""
    threshold = PERSISTENCE_THRESHOLD if persistence_threshold is None else persistence_threshold
    if granularity_threshold is None:
        granularity_threshold = GRANULARITY_THRESHOLD
    zero: dict[str, Any] = {"stage": zero_stage, "stage3_param_persistence_threshold": threshold}
    if granularity_threshold and zero_stage == 3:
        zero["stage3_module_granularity_threshold"] = granularity_threshold
    if train and adam_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
        if offload_ratio < 1:
            zero["offload_optimizer"]["ratio"] = offload_ratio
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "gradient_clipping": max_norm if train else 0.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def cpu_adam_threads(node: str) -> int:
    """Give DeepSpeed's CPU Adam this rank's share of the node's cores (the cores this process may run on,
    divided among the group's ranks on ``node``); returns the thread count. Ray starts every worker with
    OMP_NUM_THREADS=1 (its CPU ask), so without this each rank's optimizer step over its offloaded states
    (billions of parameters at 32B) runs on one core. Set before the optimizer's extension loads: its
    OpenMP runtime reads the variable then, torch's own takes ``set_num_threads``. Every rank must call it
    (the ranks' nodes are gathered)."""
    import os

    import torch.distributed as dist

    nodes = [node]
    if dist.is_initialized() and dist.get_world_size() > 1:
        nodes = [None] * dist.get_world_size()
        dist.all_gather_object(nodes, node)
    threads = max(1, len(os.sched_getaffinity(0)) // max(1, nodes.count(node)))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    return threads


def prepare_cpu_adam(node: str) -> int:
    """What a rank does before it makes DeepSpeed's CPU Adam: its threads (:func:`cpu_adam_threads`, returned),
    and a killed build's stale lock on the op cleared (trainer.deepspeed_ops.clear_stale_lock), on which the
    extension's build would wait for ever."""
    from trainer.deepspeed_ops import clear_stale_lock

    threads = cpu_adam_threads(node)
    if (lock := clear_stale_lock("cpu_adam")) is not None:
        print(f"removed {lock}: a killed build's lock, an hour old or more", flush=True)
    return threads


def to_device(mb: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A micro-batch's tensors on the engine's device: batches arrive through Ray as CPU tensors, and
    DeepSpeed does not move a forward's inputs (on a GPU rank the embedding lookup would fail)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in mb.items()}


class ModelWorker(CheckpointWorker, DistributedWorker):
    """One rank of the policy or reference group (checkpoints: :class:`trainer.checkpoint.CheckpointWorker`)."""

    packing = False  # init_model sets these three
    attn = "sdpa"
    dtype = torch.float32
    forward_slots = 0  # token slots of the last forward (padded or packed)

    def init_model(self, pretrain: str, *, zero_stage: int = 3, bf16: bool = False, micro_batch: int = 1,
                   grad_accum: int = 1, learning_rate: float | None = None, adam_offload: bool = False,
                   gradient_checkpointing: bool = False, l2: float = 0.0, max_norm: float = 1.0,
                   seed: int = 42, temperature: float = 1.0, flash_attn: bool = False,
                   packing_samples: bool = False, persistence_threshold: int | None = None,
                   granularity_threshold: int | None = None, adam_offload_ratio: float = 1.0,
                   use_liger_kernel: bool = False) -> int:
        """Load `pretrain` with from_pretrained under DeepSpeed. learning_rate None = inference only.
        packing_samples: forwards run on each micro-batch packed into fewer rows (trainer.learn.packing)."""
        self.startup_marks.mark("init_model")
        import deepspeed
        from transformers import AutoModelForCausalLM
        from transformers.integrations import HfDeepSpeedConfig

        torch.manual_seed(seed)
        train = learning_rate is not None
        self.temperature = temperature
        self.packing = packing_samples
        self.attn = attn_implementation(flash_attn)
        self.dtype = torch.bfloat16 if bf16 else torch.float32
        self.config = ds_config(zero_stage, bf16, micro_batch, grad_accum, adam_offload, max_norm, train,
                                persistence_threshold, granularity_threshold, offload_ratio=adam_offload_ratio)
        # Must live while the model is built: from_pretrained then partitions at load (ZeRO-3).
        self._hf_ds = HfDeepSpeedConfig(self.config) if zero_stage == 3 else None
        model = AutoModelForCausalLM.from_pretrained(pretrain, dtype=self.dtype, attn_implementation=self.attn)
        self.startup_marks.mark("loaded")
        liger_kernels(model, use_liger_kernel)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        check_granularity(model, self.config)
        optimizer = None
        if train:
            params = [p for p in model.parameters() if p.requires_grad]
            if adam_offload:
                from deepspeed.ops.adam import DeepSpeedCPUAdam

                prepare_cpu_adam(self.node_ip())
                optimizer = DeepSpeedCPUAdam(params, lr=learning_rate, weight_decay=l2)
            else:  # one fused kernel on CUDA instead of a loop over parameter groups
                optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=l2,
                                              fused=torch.cuda.is_available())
            # DeepSpeedCPUAdam builds its C++ op the first time a node uses it (43-54 s on the GPU machines) unless
            # ray_node__deepspeed_ops built it there (trainer.deepspeed_ops)
            self.startup_marks.mark("optimizer")
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=self.config)
        fp32_rope(self.engine.module)  # zero.Init cast the RoPE frequencies to bf16 (see fp32_rope)
        if not train:
            self.engine.eval()
        self.startup_marks.mark("ready")
        return sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())

    def _to_device(self, mb: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return to_device(mb, self.engine.device)

    def _action_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         num_actions: int) -> torch.Tensor:
        input_ids, attention_mask = input_ids.to(self.engine.device), attention_mask.to(self.engine.device)
        if self.packing:
            packed = pack(input_ids, attention_mask, num_actions, attn=self.attn, dtype=self.dtype)
            self.forward_slots = packed.num_slots
            logits = self.engine(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                                 position_ids=packed.position_ids).logits
            logp = log_probs_from_logits(logits[:, :-1], packed.input_ids[:, 1:], temperature=self.temperature)
            return unpack(logp, packed)
        self.forward_slots = input_ids.numel()
        return padded_logprobs(self.engine, input_ids, attention_mask, num_actions, self.temperature)

    @torch.no_grad()
    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_actions: int) -> torch.Tensor:
        """Log-probs of the last `num_actions` tokens of each sequence (left-padded prompt + response)."""
        return self._action_logprobs(input_ids, attention_mask, num_actions).cpu()

    @torch.no_grad()
    def batch_logprobs(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """logprobs() of a micro-batch dict (as Experience.rows gives it)."""
        return self.logprobs(mb["input_ids"], mb["attention_mask"], mb["action_mask"].size(1))

    def prime(self, rows: int, train: bool) -> None:
        """Run this model's forward (and with ``train`` its backward) once on a small batch of dummy tokens, so
        that step 1 finds done what a process does the first time (--prime_models): Triton's compiles of the
        fused kernels (Liger's, per shape class: :data:`PRIME_LENGTHS`), ZeRO-3's record of the modules' order,
        cuBLAS's and the caching allocator's set-up; the loop runs it while the engines start. At 7B on 4 H200s
        it took step 1's make_experience from 5.6 to 2.9 s, not its train phase, whose first step costs
        something else (docs/benchmarks.md, thirteenth loan). Nothing is learnt and no random number is drawn:
        the backward is taken with respect to the embeddings' output only (``torch.autograd.grad``), so no
        parameter's gradient is computed and DeepSpeed's reduction hooks never fire; the batch is ``arange``
        token ids. ``rows``: the micro-batch it will see. Its end is the start-up mark ``primed``."""
        device = self.engine.device
        captured: list[torch.Tensor] = []  # the embeddings' output of the forward with gradients
        embeddings = self.engine.module.get_input_embeddings()
        vocab = int(embeddings.num_embeddings)  # kept under ZeRO-3, whose weight is a partition
        for length in PRIME_LENGTHS:
            ids = (torch.arange(rows * length, device=device) % vocab).view(rows, length)
            mask = torch.ones_like(ids)
            with torch.no_grad():  # make_experience's forward
                self._action_logprobs(ids, mask, length - 1)
            if not train:
                continue
            self.engine.train()
            captured.clear()
            hook = embeddings.register_forward_hook(lambda _m, _i, out: captured.append(out))
            try:
                logp = self._action_logprobs(ids, mask, length - 1)
            finally:
                hook.remove()
            torch.autograd.grad(logp.float().sum(), captured[0])
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # back to the engines starting beside it
        self.startup_marks.mark("primed")

    def train_policy(self, micro_batches: list[dict[str, torch.Tensor]], objective: PolicyObjective,
                     lr: float | None = None, measure_mismatch: bool = False) -> dict[str, float]:
        """One optimizer step over this rank's micro-batches with the trainer's `objective` (clipped
        surrogate, optional KL loss with the configured estimator: trainer.learn.losses.policy_objective), at
        learning rate `lr` when given (the trainer's schedule). Metrics: the micro-batches' mean.

        ``measure_mismatch`` (the first step on a rollout, when make_experience ran no policy forward: --old_logprobs
        train or rollout): the engines' log-probs against this forward's, rollout/logprob_mismatch and its
        max and KL over this rank's micro-batches, as make_experience measures them otherwise."""
        if lr is not None:
            self.set_learning_rate(lr)
        self.engine.train()
        # tokens/forward_slots: token slots a micro-batch's forward computes (padded B x L, or packed rows)
        totals: dict[str, float] = {"tokens/forward_slots": 0.0}
        pairs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for mb in micro_batches:
            mb = self._to_device(mb)
            mask = mb["action_mask"]
            logp = self._action_logprobs(mb["input_ids"], mb["attention_mask"], mask.size(1))
            if measure_mismatch and "rollout_logprobs" in mb:  # kept on the device: no sync between micro-batches
                pairs.append((logp.detach().float(), mb["rollout_logprobs"], mask))
            total, metrics = policy_objective(logp, mb.get("old_logprobs"), mb["advantages"], mask,
                                              mb.get("ref_logprobs"), objective, mb.get("rollout_logprobs"))
            self.engine.backward(total)
            self.engine.step()
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value.item() / len(micro_batches)
            totals["tokens/forward_slots"] += self.forward_slots / len(micro_batches)
        totals["policy/grad_norm"] = grad_norm(self.engine)
        if pairs:
            totals.update(rollout_mismatch(*(torch.cat([p[i] for p in pairs]) for i in range(3))))
        return totals

    def train_sft(self, micro_batches: list[dict[str, torch.Tensor]]) -> float:
        """One optimizer step of negative log-likelihood on the response tokens (a supervised warm-up). A loss
        with no gradient at all reaching the optimizer is an error: it cannot happen unless something drops the
        gradients, and then nothing would be trained (see GRANULARITY_THRESHOLD)."""
        self.engine.train()
        total = 0.0
        for mb in micro_batches:
            mb = self._to_device(mb)
            mask = mb["action_mask"]
            logp = self._action_logprobs(mb["input_ids"], mb["attention_mask"], mask.size(1))
            loss = -masked_mean(logp, mask)
            self.engine.backward(loss)
            self.engine.step()
            total += loss.item() / len(micro_batches)
        norm = grad_norm(self.engine)
        if total > 0 and norm == 0.0:
            raise RuntimeError(f"supervised step: loss {total:.4f} but the gradient that reached the optimizer is 0, "
                               "so no weight changes (a ZeRO-3 setting that drops gradients? see "
                               "trainer.learn.model_worker.GRANULARITY_THRESHOLD)")
        return total

    def init_weight_sync(self, master_addr: str, master_port: int, world_size: int, backend: str,
                         timeout_s: float = 600.0) -> None:
        """Rank 0 hosts the policy -> engines weight-sync group (it is its rank 0, the sender); forming it
        waits at most ``timeout_s`` for the engines' workers."""
        from trainer.weights.broadcast import make_sync_group

        if self.rank == 0:
            self._sync = make_sync_group(master_addr, master_port, 0, world_size, backend, timeout_s=timeout_s,
                                         master_listen_fd=self.take_listen_fd(master_port))

    def close_weight_sync(self) -> None:
        """Rank 0 leaves the weight-sync group without waiting for its other members (engines were replaced: it
        forms again with them)."""
        from trainer.weights.broadcast import close_sync_group

        group, self._sync = getattr(self, "_sync", None), None
        if group is not None:
            close_sync_group(group, abort=True)  # the replaced engines are gone: wait for no one

    def broadcast_weights(self, bucket_bytes: int) -> int:
        """Gather the ZeRO-3 parameters in buckets (one all-gather per bucket; every rank must call it) and,
        from rank 0, stream them to the engines: the plan first (from the parameters' metadata), then each
        bucket posted while the next one is gathered. Returns the bytes sent (0 on the other ranks)."""
        from trainer.weights.broadcast import broadcast_buckets
        from trainer.weights.gather import iter_zero3_buckets, model_bucket_plan

        buckets = iter_zero3_buckets(self.engine, bucket_bytes)
        if self.rank == 0:
            return broadcast_buckets(self._sync, buckets, plan=model_bucket_plan(self.engine, bucket_bytes))
        for _ in buckets:  # the other ranks take part in every bucket's all-gather
            pass
        return 0

    def push_weights_shared(self, engines: list[Any], bucket_bytes: int) -> dict[str, float]:
        """Colocated engines: the policy's weights handed over in place (:func:`trainer.weights.shared.push_shared`);
        every rank must call it. Returns ``bytes`` handed over (0 on ranks other than 0) and this rank's seconds
        by part of the push (push_shared's ``timings``)."""
        timings: dict[str, float] = {}
        sent = push_shared(self.engine, self.rank, engines, bucket_bytes, timings)
        return {"bytes": float(sent), **timings}

    def reset_optimizer_state(self) -> None:
        """Forget the optimizer's moments (Adam's running averages and step count): RL after the supervised
        warm-up starts from a fresh optimizer. Carried over, the warm-up's momentum keeps moving the weights
        where the warm-up went, with no RL gradient at all (a batch of equal rewards has none)."""
        opt = getattr(self.engine.optimizer, "optimizer", self.engine.optimizer)
        for state in opt.state.values():
            for key, value in state.items():
                if torch.is_tensor(value):
                    value.zero_()
                elif key == "step":
                    state[key] = 0

    def set_learning_rate(self, lr: float) -> None:
        """Set the optimizer's learning rate (the supervised warm-up uses its own)."""
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr

    @torch.no_grad()
    def load_full_state(self, state: dict[str, torch.Tensor]) -> None:
        """Overwrite the parameters with a full state (as full_state gives it); every rank must call it."""
        import deepspeed

        params = dict(self.engine.module.named_parameters())
        if set(params) != set(state):
            raise ValueError(f"state has {len(state)} tensors, the model {len(params)}; "
                             f"differing names: {sorted(set(params) ^ set(state))[:5]}")
        for name, param in params.items():
            with deepspeed.zero.GatheredParameters([param], modifier_rank=0, enabled=hasattr(param, "ds_id")):
                if self.rank == 0 or not hasattr(param, "ds_id"):
                    param.data.copy_(state[name].to(param.dtype))

    def full_state(self) -> dict[str, torch.Tensor] | None:
        """Full (gathered) parameters on rank 0, None on the others; every rank must call it."""
        import deepspeed

        state: dict[str, torch.Tensor] = {}
        for name, param in self.engine.module.named_parameters():
            with deepspeed.zero.GatheredParameters([param], enabled=hasattr(param, "ds_id")):
                if self.rank == 0:
                    state[name] = param.data.detach().clone().cpu()
        return state if self.rank == 0 else None

    def save_hf(self, directory: str) -> None:
        """HF-format weights and config, streamed shard by shard from rank 0 (trainer.learn.hf_save); all ranks
        call it."""
        from trainer.learn.hf_save import save_model

        stats = save_model(self.engine.module, directory, rank=self.rank)
        if stats is not None:
            print(f"saved {directory}: {stats.shards} shard(s), {stats.total_bytes / 2**30:.2f} GiB; "
                  f"rank 0 held {stats.peak_bytes / 2**30:.2f} GiB at most", flush=True)
