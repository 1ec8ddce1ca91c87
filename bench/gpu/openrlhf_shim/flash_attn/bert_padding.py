"""Unpadding helpers with flash-attn's signatures, in plain PyTorch (no kernels)."""

from __future__ import annotations

import torch
from einops import rearrange

__all__ = ["index_first_axis", "pad_input", "rearrange", "unpad_input"]


def index_first_axis(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows ``indices`` of ``x`` along its first axis (any trailing shape)."""
    return x.reshape(x.shape[0], -1)[indices].reshape(-1, *x.shape[1:])


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None):
    """[batch, seq, ...] with a [batch, seq] mask -> (tokens, indices, cu_seqlens, max_seqlen, seqused)."""
    mask = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = mask.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    tokens = index_first_axis(rearrange(hidden_states, "b s ... -> (b s) ..."), indices)
    return tokens, indices, cu_seqlens, int(seqlens.max().item()) if seqlens.numel() else 0, used


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of :func:`unpad_input`: tokens back into a zero-padded [batch, seqlen, ...]."""
    out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], dtype=hidden_states.dtype,
                      device=hidden_states.device)
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
