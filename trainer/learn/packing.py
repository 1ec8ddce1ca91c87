"""Sample packing (``--packing_samples``): a micro-batch's sequences in fewer rows, without padding.

The loop's micro-batches are padded (prompts left-padded, responses right-padded; see
:mod:`trainer.experience`), so a forward spends its FLOPs on pad tokens too: RL responses vary in
length and padding is often a third to a half of the slots. Packing puts the real tokens of several
sequences side by side in one row, with

- ``position_ids`` restarting at 0 for each sequence, and
- attention kept inside each sequence.

How depends on the attention kernel:

- FlashAttention-2: every sequence in **one row**, ``attention_mask=None``; transformers finds the
  sequences from ``position_ids`` and runs the variable-length kernel, which skips the blocks between
  sequences.
- SDPA and eager: a 4-D block-diagonal causal mask, which transformers uses as given (boolean for SDPA,
  additive float for eager). These kernels compute every query x key pair of a row, masked or not, so
  one long row would trade the pad tokens' MLP work for quadratic attention work across sequences.
  Sequences go first-fit (longest first) into rows **no wider than the padded micro-batch**: the
  attention of a packed row never costs more than that of a padded one, and the MLP, norms and LM head
  (most of a step) see ``rows x width`` slots instead of ``B x L``.

Per-token outputs of the packed forward (log-probs, values) are mapped back to the padded ``[B, R]``
action grid with the index :func:`pack` returns, so everything after the forward (losses, GAE, metrics)
is unchanged. Pure torch, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ATTENTION = ("sdpa", "eager", "flash_attention_2")  # the attention implementations packing supports


@dataclass
class Packed:
    """Packed rows and how to map them back to the padded action grid."""

    input_ids: torch.Tensor  # [K, W] the real tokens of the sequences, tails of rows filled with token 0
    position_ids: torch.Tensor  # [K, W] 0.. within each sequence (0 on fill)
    attention_mask: torch.Tensor | None  # [K, 1, W, W] block-diagonal causal, or None (FlashAttention-2)
    pred_index: torch.Tensor  # [B, R] long: flat index (row * W + col) of the output that predicts action
    #                           (b, r), as the per-token outputs [K, W] give it; -1 = padding, no output
    lengths: torch.Tensor  # [B] real tokens of each sequence

    @property
    def num_slots(self) -> int:
        return self.input_ids.numel()


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """[K, 1, W, W] bool from segment ids [K, W] (-1 = fill): token i sees token j iff both belong to one
    sequence and j <= i; a fill slot sees itself only (a row of the softmax must not be empty)."""
    width = segments.size(1)
    causal = torch.ones(width, width, dtype=torch.bool, device=segments.device).tril_()
    same = segments[:, :, None] == segments[:, None, :]
    mask = same & causal & (segments[:, :, None] >= 0)
    mask |= torch.eye(width, dtype=torch.bool, device=segments.device) & (segments[:, :, None] < 0)
    return mask[:, None]


def first_fit(lengths: list[int], width: int) -> list[tuple[int, int]]:
    """(row, start column) of each sequence: longest first, each into the first row it fits in."""
    placed: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    fill: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        row = next((r for r, used in enumerate(fill) if used + lengths[i] <= width), None)
        if row is None:
            row = len(fill)
            fill.append(0)
        placed[i] = (row, fill[row])
        fill[row] += lengths[i]
    return placed


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, *, attn: str = "sdpa",
         dtype: torch.dtype = torch.float32) -> Packed:
    """Pack a padded micro-batch ``[B, L]`` whose last ``num_actions`` columns are the action slots, for
    attention implementation ``attn`` (``dtype``: the model's, for the eager kernel's additive mask).

    A sequence's real tokens are those where ``attention_mask`` is 1, in order (the padded forward's
    ``position_ids`` count the same tokens, so positions agree). Action slot ``(b, r)`` is column
    ``L - num_actions + r``; its log-prob comes from the output at the real token before it.
    """
    if attn not in ATTENTION:
        raise ValueError(f"packing_samples supports attention {', '.join(ATTENTION)}; the model uses {attn!r}")
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(f"pack needs input_ids and attention_mask of one [B, L] shape; got "
                         f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}")
    _, width = input_ids.shape
    if not 0 < num_actions < width:
        raise ValueError(f"num_actions={num_actions}: expected 0 < num_actions < L={width}")
    real = attention_mask.bool()
    lengths = real.sum(dim=1)
    if int(lengths.min()) == 0:
        raise ValueError(f"row {int((lengths == 0).nonzero()[0])} of the micro-batch has no real token")
    device = input_ids.device
    lens = lengths.tolist()
    flash = attn == "flash_attention_2"
    placed = first_fit(lens, sum(lens) if flash else width)
    rows = 1 + max(r for r, _ in placed)
    out_width = max(start + n for (_, start), n in zip(placed, lens, strict=True))
    row_of = torch.tensor([r for r, _ in placed], device=device)
    start_of = torch.tensor([s for _, s in placed], device=device)

    rank = real.long().cumsum(dim=1) - 1  # index of each real token within its sequence
    seq = torch.arange(len(lens), device=device)[:, None].expand_as(rank)
    col = start_of[:, None] + rank  # packed column of each real token
    ids = torch.zeros(rows, out_width, dtype=input_ids.dtype, device=device)
    positions = torch.zeros(rows, out_width, dtype=torch.long, device=device)
    segments = torch.full((rows, out_width), -1, dtype=torch.long, device=device)
    r_idx, c_idx = row_of[:, None].expand_as(rank)[real], col[real]
    ids[r_idx, c_idx] = input_ids[real]
    positions[r_idx, c_idx] = rank[real]
    segments[r_idx, c_idx] = seq[real]

    cols = slice(width - num_actions, width)
    # the output that predicts an action token sits one column before it, in the same row and sequence
    pred = row_of[:, None] * out_width + col[:, cols] - 1
    valid = real[:, cols] & (rank[:, cols] > 0)
    pred_index = torch.where(valid, pred, torch.full_like(pred, -1))
    mask = None
    if not flash:
        mask = block_causal_mask(segments)
        if attn == "eager":  # the eager kernel adds the mask to the scores
            mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, torch.finfo(dtype).min)
    return Packed(ids, positions, mask, pred_index, lengths)


def unpack(per_token: torch.Tensor, packed: Packed, fill: float = 0.0) -> torch.Tensor:
    """Per-token outputs ``[K, W]`` of the packed rows (output at column c is about token c + 1; a
    ``[K, W - 1]`` log-prob tensor is taken as its first W - 1 columns) -> the ``[B, R]`` action grid."""
    k, width = packed.input_ids.shape
    if per_token.shape == (k, width - 1):  # log-probs of logits[:, :-1] against ids[:, 1:]
        per_token = torch.nn.functional.pad(per_token, (0, 1))
    if per_token.shape != (k, width):
        raise ValueError(f"unpack: per-token outputs of shape {tuple(per_token.shape)}; expected "
                         f"{(k, width)} or {(k, width - 1)} for these packed rows")
    index = packed.pred_index
    out = per_token.reshape(-1)[index.clamp(min=0)]
    return torch.where(index >= 0, out, torch.full_like(out, fill))
