"""Turn rollout samples into the padded tensors the model workers take (pure torch, no Ray).

Layout, as OpenRLHF: each sequence is its prompt left-padded to the longest
prompt, then its response right-padded to the longest response, so the action
tokens of every row sit in the last R columns and `num_actions = R`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Experience:
    """One rollout's tensors; rows are prompt-major (n samples of a prompt are adjacent)."""

    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    action_mask: torch.Tensor  # [B, R], 1.0 on response tokens the policy generated (0 on tool-inserted ones)
    old_logprobs: torch.Tensor | None = None  # [B, R]
    ref_logprobs: torch.Tensor | None = None  # [B, R]
    advantages: torch.Tensor | None = None  # [B, R]
    values: torch.Tensor | None = None  # [B, R], critic V(s_t) at rollout time (gae)
    returns: torch.Tensor | None = None  # [B, R], the critic's targets (gae)
    scores: torch.Tensor | None = None  # [B]
    rollout_logprobs: torch.Tensor | None = None  # [B, R], the engines' log-probs of the sampled tokens

    @property
    def num_actions(self) -> int:
        return self.action_mask.size(1)

    def rows(self, index: torch.Tensor | Sequence[int]) -> dict[str, torch.Tensor]:
        """The tensors of some rows, as the micro-batch dict ModelWorker.train_policy takes."""
        idx = torch.as_tensor(index, dtype=torch.long)
        out = {"input_ids": self.input_ids[idx], "attention_mask": self.attention_mask[idx],
               "action_mask": self.action_mask[idx]}
        for name in ("old_logprobs", "ref_logprobs", "advantages", "values", "returns", "rollout_logprobs"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value[idx]
        return out


def build_experience(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                     pad_id: int, action_masks: Sequence[Sequence[int] | None] | None = None) -> Experience:
    """Pad prompts left and responses right; an empty response keeps one masked pad column.

    ``action_masks`` (state masking of multi-turn tool rollouts): per response, 1 on the tokens the policy
    generated and 0 on those a tool inserted; the inserted tokens stay in ``input_ids`` and
    ``attention_mask`` (the model reads them) but their ``action_mask`` is 0, so they get no policy loss, no
    KL and no value target. None (or a None entry): every response token is an action."""
    if len(prompt_ids) != len(response_ids) or not prompt_ids:
        raise ValueError(f"{len(prompt_ids)} prompts and {len(response_ids)} responses; expected equal, > 0")
    if action_masks is not None:
        if len(action_masks) != len(response_ids):
            raise ValueError(f"{len(action_masks)} action masks for {len(response_ids)} responses; expected one each")
        for i, (m, r) in enumerate(zip(action_masks, response_ids, strict=True)):
            if m is not None and len(m) != len(r):
                raise ValueError(f"response {i}: action mask of {len(m)} entries for {len(r)} tokens; expected "
                                 "one entry per response token")
    p_len = max(len(p) for p in prompt_ids)
    r_len = max(1, max(len(r) for r in response_ids))
    b = len(prompt_ids)
    input_ids = torch.full((b, p_len + r_len), pad_id, dtype=torch.long)
    attention = torch.zeros((b, p_len + r_len), dtype=torch.long)
    action = torch.zeros((b, r_len), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        input_ids[i, p_len - len(p):p_len] = torch.tensor(p, dtype=torch.long)
        attention[i, p_len - len(p):p_len] = 1
        if r:
            input_ids[i, p_len:p_len + len(r)] = torch.tensor(r, dtype=torch.long)
            attention[i, p_len:p_len + len(r)] = 1
            mask = action_masks[i] if action_masks is not None else None
            action[i, :len(r)] = 1.0 if mask is None else torch.tensor(mask, dtype=torch.float32)
    return Experience(input_ids, attention, action)


def pad_right(rows: Sequence[Sequence[float]], width: int, value: float = 0.0) -> torch.Tensor:
    """``[len(rows), width]`` float32, each row's values from the left, ``value`` after them (the response
    layout of :func:`build_experience`); a row longer than ``width`` is an error."""
    out = torch.full((len(rows), width), value, dtype=torch.float32)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"row {i} has {len(row)} values for {width} response columns")
        if row:
            out[i, :len(row)] = torch.tensor(list(row), dtype=torch.float32)
    return out


def shard(n: int, parts: int) -> list[list[int]]:
    """Row indices 0..n-1 split into `parts` contiguous shards of near-equal size (one per rank)."""
    base, extra = divmod(n, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + base + (i < extra)
        out.append(list(range(lo, hi)))
        lo = hi
    return out


def micro_batches(exp: Experience, rows: torch.Tensor, ranks: int, size: int) -> list[list[dict[str, torch.Tensor]]]:
    """``rows`` of ``exp`` split over ``ranks`` ranks (:func:`shard`), each rank's share cut into micro-batches of
    ``size`` rows: what a group's ``run_sharded`` hands its ranks."""
    return [[exp.rows(mine[i:i + size]) for i in range(0, len(mine), size)]
            for mine in (rows[idx] for idx in shard(len(rows), ranks))]
