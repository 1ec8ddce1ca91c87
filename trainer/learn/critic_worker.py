"""The critic of PPO (``--advantage_estimator gae``): the pretrained backbone plus a scalar value head.

One rank of the critic group, on DeepSpeed like the policy (ZeRO-3 partitions the backbone at
load). ``V(s_t)`` for the action at position t is the value head on the hidden state of the token
before it, so values line up with the policy's per-action log-probs. Saved as the backbone's
``save_pretrained`` plus ``value_head.safetensors``.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.checkpoint import CheckpointWorker
from trainer.learn.group import DistributedWorker
from trainer.learn.losses import value_loss
from trainer.learn.model_worker import (
    attn_implementation,
    check_granularity,
    ds_config,
    fp32_rope,
    grad_norm,
    liger_kernels,
    prepare_cpu_adam,
    to_device,
)
from trainer.learn.packing import pack, unpack


class ValueModel(nn.Module):
    """backbone (an ``AutoModel``) -> last hidden state -> Linear(hidden, 1)."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1, bias=False)
        # Zero init: the first returns are learnt from, not fought against (OpenRLHF starts the same way
        # from a reward model's head; a random head would add noise to the first advantages).
        nn.init.zeros_(self.value_head.weight)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        if position_ids is None:  # padded rows: positions count the real tokens
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids).last_hidden_state
        return self.value_head(hidden).squeeze(-1).float()


class CriticWorker(CheckpointWorker, DistributedWorker):
    """One rank of the critic group (checkpoints: :class:`trainer.checkpoint.CheckpointWorker`)."""

    packing = False  # init_model sets these three
    attn = "sdpa"
    dtype = torch.float32

    def init_model(self, pretrain: str, *, zero_stage: int = 3, bf16: bool = False, micro_batch: int = 1,
                   grad_accum: int = 1, learning_rate: float = 9e-6, adam_offload: bool = False,
                   gradient_checkpointing: bool = False, l2: float = 0.0, max_norm: float = 1.0,
                   seed: int = 42, flash_attn: bool = False, packing_samples: bool = False,
                   adam_offload_ratio: float = 1.0, use_liger_kernel: bool = False) -> int:
        self.startup_marks.mark("init_model")
        import deepspeed
        from transformers import AutoConfig, AutoModel
        from transformers.integrations import HfDeepSpeedConfig

        torch.manual_seed(seed)
        self.packing = packing_samples
        self.attn = attn_implementation(flash_attn)
        self.dtype = torch.bfloat16 if bf16 else torch.float32
        self.config = ds_config(zero_stage, bf16, micro_batch, grad_accum, adam_offload, max_norm, train=True,
                                offload_ratio=adam_offload_ratio)
        self._hf_ds = HfDeepSpeedConfig(self.config) if zero_stage == 3 else None
        hidden = AutoConfig.from_pretrained(pretrain).hidden_size
        backbone = AutoModel.from_pretrained(pretrain, dtype=self.dtype, attn_implementation=self.attn)
        self.startup_marks.mark("loaded")
        liger_kernels(backbone, use_liger_kernel)
        if gradient_checkpointing:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = ValueModel(backbone, hidden)
        if bf16:
            model.value_head.to(torch.bfloat16)
        check_granularity(model, self.config)
        params = [p for p in model.parameters() if p.requires_grad]
        if adam_offload:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            prepare_cpu_adam(self.node_ip())
            optimizer = DeepSpeedCPUAdam(params, lr=learning_rate, weight_decay=l2)
        else:
            optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=l2)
        self.startup_marks.mark("optimizer")  # as the policy's (ModelWorker.init_model)
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=self.config)
        fp32_rope(self.engine.module)  # the backbone's, as the policy's (trainer.learn.model_worker.fp32_rope)
        self.startup_marks.mark("ready")
        return sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())

    def _values(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        num_actions = mb["action_mask"].size(1)
        if self.packing:  # V at the token before each action, mapped back to the padded grid
            packed = pack(mb["input_ids"], mb["attention_mask"], num_actions, attn=self.attn, dtype=self.dtype)
            return unpack(self.engine(packed.input_ids, packed.attention_mask, packed.position_ids), packed)
        values = self.engine(mb["input_ids"], mb["attention_mask"])
        return values[:, :-1][:, -num_actions:]

    @torch.no_grad()
    def batch_values(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """V(s_t) for each action position of a micro-batch dict (as Experience.rows gives it)."""
        self.engine.eval()
        mb = to_device(mb, self.engine.device)
        return (self._values(mb) * mb["action_mask"]).cpu()

    def train_critic(self, micro_batches: list[dict[str, torch.Tensor]],
                     value_clip: float | None = None, lr: float | None = None) -> dict[str, float]:
        """One optimizer step of the clipped value loss towards the GAE returns (at `lr` when given)."""
        if lr is not None:
            for group in self.engine.optimizer.param_groups:
                group["lr"] = lr
        self.engine.train()
        totals = {"loss/critic": 0.0, "critic/clip_frac": 0.0, "critic/values": 0.0}
        for mb in micro_batches:
            mb = to_device(mb, self.engine.device)
            mask = mb["action_mask"]
            values = self._values(mb)
            loss, clip_frac = value_loss(values, mb["values"], mb["returns"], mask, value_clip)
            self.engine.backward(loss)
            self.engine.step()
            n = len(micro_batches)
            totals["loss/critic"] += loss.item() / n
            totals["critic/clip_frac"] += clip_frac.item() / n
            totals["critic/values"] += ((values.detach() * mask).sum() / mask.sum().clamp(min=1)).item() / n
        totals["critic/grad_norm"] = grad_norm(self.engine)
        return totals

    def save_hf(self, directory: str) -> None:
        """The backbone as an HF model (streamed, trainer.learn.hf_save) and the head as value_head.safetensors,
        from rank 0; all ranks call it."""
        import deepspeed
        from safetensors.torch import save_file

        from trainer.learn.hf_save import save_model

        module = self.engine.module
        save_model(module, directory, rank=self.rank, prefix="backbone.")
        head = module.value_head.weight
        with deepspeed.zero.GatheredParameters([head], enabled=hasattr(head, "ds_id")):
            if self.rank == 0:
                save_file({"weight": head.data.detach().cpu().contiguous()}, f"{directory}/value_head.safetensors")
