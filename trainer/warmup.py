"""The supervised warm-up (``--sft_warmup_steps``): the policy learns the answer format before RL.

``--sft_warmup_steps`` optimizer steps of NLL on ``sft_output_key + eos`` (the RL prompts' labels, or
``--sft_data``), at ``--sft_learning_rate``; then the optimizer's moments are reset (RL starts from a fresh
optimizer), the reference takes the warmed-up weights (the KL anchors there) and so do the engines. Seeded, so a
resumed run repeats it exactly before its checkpoint replaces the policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainer.experience import build_experience, micro_batches


def warmup(cfg: Any, tokenizer: Any, policy: Any, ref: Any | None, push: Callable[[], int]) -> None:
    """Run the warm-up on ``policy`` (its ActorGroup), hand the weights to ``ref`` (the reference group, if any)
    and to the engines (``push``)."""
    import ray

    from trainer.data import chat_tools, load_prompts

    tok = tokenizer
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
    policy.run("set_learning_rate", cfg.sft_learning_rate or cfg.actor_learning_rate)
    gen = torch.Generator().manual_seed(cfg.seed)
    for step in range(1, cfg.sft_warmup_steps + 1):
        idx = torch.randint(len(data), (cfg.train_batch_size,), generator=gen).tolist()
        exp = build_experience([prompt_ids[i] for i in idx], [target_ids[i] for i in idx], pad)
        micro = micro_batches(exp, torch.arange(len(idx)), policy.spec.world_size, cfg.micro_train_batch_size)
        losses = policy.run_sharded("train_sft", micro)
        print(f"warm-up step {step}/{cfg.sft_warmup_steps}: loss/sft={sum(losses) / len(losses):.4f}", flush=True)
    policy.run("set_learning_rate", cfg.actor_learning_rate)
    policy.run("reset_optimizer_state")
    if ref is not None:
        state = ray.put(policy.run("full_state")[0])
        ref.run("load_full_state", state)
    push()
