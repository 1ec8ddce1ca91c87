"""Masked reductions, KL estimators, PPO losses and token log-probabilities (pure torch).

Shapes follow :mod:`trainer.learn.algorithms`: token tensors ``[B, T]``, ``action_mask`` 1 on real response
tokens and 0 on padding. All functions are importable from ``trainer.learn.algorithms`` too.

Loss reduction: ``"token"`` (default) is the mean over all valid tokens of the batch (OpenRLHF's
token-level loss); ``"sequence"`` is the mean over sequences of each sequence's token mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

Reduction = Literal["token", "sequence"]


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(x * mask)`` over ``dim`` (all elements if ``None``)."""
    prod = x * mask.to(x.dtype)
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(x * mask) / sum(mask)`` over ``dim`` (all elements if ``None``).

    Padding values never leak in, even if they are inf/nan-free garbage; an all-masked slice gives 0
    (the denominator is clamped to 1e-8) instead of nan.
    """
    mask = mask.to(x.dtype)
    denom = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / denom.clamp_min(1e-8)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Whiten the valid entries: ``(x - m) / sqrt(max(v, eps))`` with ``m = masked_mean(x)`` and
    ``v = masked_mean((x - m)^2)`` (population variance over all valid tokens of the batch, as
    OpenRLHF's replay-buffer normalisation). ``shift_mean=False`` adds ``m`` back (scale only).
    Padding positions are set to 0.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(var.clamp_min(eps))
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)


def _log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor, action_mask: torch.Tensor | None) -> torch.Tensor:
    log_ratio = logp.float() - ref_logp.float()
    return log_ratio if action_mask is None else log_ratio * action_mask.to(log_ratio.dtype)


def kl_k1(
    logp: torch.Tensor, ref_logp: torch.Tensor, action_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """k1 = log r, with ``log r = logp - ref_logp`` (unbiased estimate of KL(pi || ref), high variance).
    Masked positions are 0."""
    return _log_ratio(logp, ref_logp, action_mask)


def kl_k2(
    logp: torch.Tensor, ref_logp: torch.Tensor, action_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """k2 = (log r)^2 / 2 (biased, low variance; its gradient equals k1's gradient as a loss)."""
    return _log_ratio(logp, ref_logp, action_mask) ** 2 / 2


def kl_k3(
    logp: torch.Tensor, ref_logp: torch.Tensor, action_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """k3 = exp(-log r) - 1 + log r (unbiased, non-negative; the GRPO KL loss), clamped to [-10, 10]
    as OpenRLHF does against overflow."""
    log_ratio = _log_ratio(logp, ref_logp, action_mask)
    return (torch.exp(-log_ratio) - 1 + log_ratio).clamp(min=-10, max=10)


KL_ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def compute_kl(
    logp: torch.Tensor, ref_logp: torch.Tensor, action_mask: torch.Tensor | None = None, estimator: str = "k1"
) -> torch.Tensor:
    """Per-token KL ``[B, T]`` with the estimator named by ``--kl_estimator``."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[estimator](logp, ref_logp, action_mask)


def _reduce(x: torch.Tensor, mask: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    if reduction == "token":
        return masked_mean(x, mask)
    if reduction == "sequence":
        return masked_mean(x, mask, dim=-1).mean()
    raise ValueError(f"unknown reduction {reduction!r}; expected 'token' or 'sequence'")


def _surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped objective (to maximise) and where the ratio clip / the dual clip bind."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    objective = torch.min(unclipped, clipped)
    ratio_bound = clipped < unclipped
    dual_bound = torch.zeros_like(ratio_bound)
    if dual_clip is not None:
        floor = dual_clip * advantages
        dual_bound = (advantages < 0) & (floor > objective)
        objective = torch.where(dual_bound, floor, objective)
    return objective, ratio_bound, dual_bound


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    eps_clip: float,
    reduction: Reduction = "token",
    *,
    eps_clip_high: float | None = None,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate. With ``ratio = exp(logp - old_logp)``::

        obj_t  = min(ratio * A, clip(ratio, 1 - eps_clip, 1 + eps_clip_high) * A)
        obj_t  = max(obj_t, dual_clip * A)       where A < 0, with dual_clip (c > 1; Ye et al. 2019)
        loss_t = -obj_t

    reduced over valid tokens. ``eps_clip_high`` defaults to ``eps_clip`` (symmetric clip; the asymmetric
    "clip-higher" form is ``--eps_clip_low_high``). Dual clip bounds the loss of a negative advantage
    when the ratio is far above 1 (the ratio clip leaves that side unbounded). Returns
    ``(loss, clip_frac)``; ``clip_frac`` is the fraction of valid tokens where the ratio clip is strictly
    the smaller term, i.e. where clipping removes the gradient.
    """
    high = eps_clip if eps_clip_high is None else eps_clip_high
    objective, ratio_bound, _ = _surrogate(logp, old_logp, advantages, eps_clip, high, dual_clip)
    clip_frac = masked_mean(ratio_bound.to(objective.dtype), action_mask).detach()
    return _reduce(-objective, action_mask, reduction), clip_frac


IS_CORRECTIONS = ("none", "tis", "icepop", "seq-mask-tis")


def is_correction_weights(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    action_mask: torch.Tensor,
    kind: str,
    low: float,
    high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weights that correct for sampling with the engine's policy (``rollout_logp``, vLLM's own
    numerics or an older version of the weights) while the loss is computed for the trainer's
    (``old_logp``), on the ratio ``r = exp(old_logp - rollout_logp)`` (OpenRLHF 0.11's formula):

    - ``tis`` (truncated importance sampling; token level, OpenRLHF's ``clip`` mode): ``w = clamp(r, low, high)``;
    - ``icepop`` (token level, ``mask``): ``w = r`` where ``low <= r <= high``, else 0 (the token is dropped);
    - ``seq-mask-tis`` (sequence level, ``mask``): a sequence whose geometric-mean ratio (``exp`` of the
      masked mean of ``old_logp - rollout_logp``) lies outside ``[low, high]`` is dropped; the others keep
      their per-token ``r``;
    - ``none``: 1.

    Returns ``(weights, filtered)``: ``weights`` detached, ``[B, R]``; ``filtered`` the share of action tokens
    (token level) or of sequences (``seq-mask-tis``) outside the band."""
    if kind not in IS_CORRECTIONS:
        raise ValueError(f"unknown IS correction {kind!r}; expected one of {', '.join(IS_CORRECTIONS)}")
    if not 0 <= low <= high:
        raise ValueError(f"IS correction band [{low}, {high}]: expected 0 <= low <= high")
    mask = action_mask.to(torch.float32)
    if kind == "none":
        return torch.ones_like(mask), torch.zeros((), dtype=torch.float32)
    log_ratio = (old_logp.float() - rollout_logp.float()).detach()
    ratio = log_ratio.exp()
    if kind == "tis":
        filtered = ((ratio < low) | (ratio > high)).float()
        return ratio.clamp(min=low, max=high) * mask, masked_mean(filtered, mask)
    if kind == "icepop":
        keep = (ratio >= low) & (ratio <= high)
        return torch.where(keep, ratio, 0.0) * mask, masked_mean((~keep).float(), mask)
    seq = masked_mean(log_ratio, mask, dim=-1).exp().unsqueeze(-1)  # seq-mask-tis
    keep = (seq >= low) & (seq <= high)
    return torch.where(keep, ratio, 0.0) * mask, (~keep).float().mean()


def rollout_mismatch(old_logp: torch.Tensor, rollout_logp: torch.Tensor,
                     action_mask: torch.Tensor) -> dict[str, float]:
    """How far the engine's log-probs of the sampled tokens are from the trainer's: ``rollout/logprob_mismatch``
    (mean |rollout - policy| over action tokens), ``rollout/logprob_mismatch_max``, and
    ``rollout/logprob_kl``, the k3 estimate of KL(rollout || policy) from the rollout's own samples
    (``r - 1 - log r`` with ``r = exp(policy - rollout)``; >= 0, 0 when they agree)."""
    mask = action_mask.to(torch.float32)
    diff = old_logp.float() - rollout_logp.float()
    absdiff = diff.abs() * mask
    k3 = (diff.exp() - 1 - diff) * mask
    return {"rollout/logprob_mismatch": masked_mean(diff.abs(), mask).item(),
            "rollout/logprob_mismatch_max": absdiff.max().item() if mask.any() else 0.0,
            "rollout/logprob_kl": masked_mean(k3, mask).item()}


#: --old_logprobs: where the ratio's old log-probs come from (trainer.config.schema)
OLD_LOGPROBS = ("policy", "train", "rollout")


@dataclass(frozen=True)
class PolicyObjective:
    """What the policy's training loss is: the one description the trainer hands to every policy rank.

    Built from a validated config by :meth:`from_config`, from the values ``--print-config`` shows
    (``eps_clip_low`` / ``eps_clip_high`` / ``kl_loss_coef`` are derived there), so the printed config and
    the computation cannot disagree.
    """

    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    dual_clip: float | None = None
    kl_loss_coef: float = 0.0  # weight of the KL loss term; 0: the KL is not a loss (reward penalty or none)
    kl_estimator: str = "k1"  # estimator of that loss term (--kl_estimator)
    reduction: Reduction = "token"
    is_correction: str = "none"  # rollout/train mismatch correction (is_correction_weights)
    is_low: float = 0.5
    is_high: float = 5.0
    old_logprobs: str = "policy"  # --old_logprobs; "train": the micro-batch's own log-probs, detached, are the old

    def __post_init__(self) -> None:
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"unknown old log-probs source {self.old_logprobs!r}; expected one of {OLD_LOGPROBS}")
        if self.is_correction not in IS_CORRECTIONS:
            raise ValueError(f"unknown IS correction {self.is_correction!r}; expected one of {IS_CORRECTIONS}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL estimator {self.kl_estimator!r}; expected one of {sorted(KL_ESTIMATORS)}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip {self.dual_clip} must be > 1")

    @classmethod
    def from_config(cls, cfg: Any) -> PolicyObjective:
        """The objective of a validated ``TrainerConfig``."""
        low, high = cfg.is_correction_threshold
        return cls(eps_clip_low=cfg.eps_clip_low, eps_clip_high=cfg.eps_clip_high, dual_clip=cfg.dual_clip,
                   kl_loss_coef=cfg.kl_loss_coef, kl_estimator=cfg.kl_estimator, is_correction=cfg.is_correction,
                   is_low=low, is_high=high, old_logprobs=cfg.old_logprobs)  # fmt: skip


def policy_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    ref_logp: torch.Tensor | None,
    objective: PolicyObjective,
    rollout_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy's loss for one micro-batch: the clipped surrogate, each token's term weighted by the
    rollout/train importance correction (:func:`is_correction_weights`, ``--is_correction``), plus
    ``kl_loss_coef * kl_loss``.

    Returns ``(total, metrics)``; metrics ``loss/policy``, ``policy/clip_frac``, with a dual clip
    ``policy/dual_clip_frac``, with a KL loss ``loss/kl`` (the unweighted estimate), with an IS correction
    ``policy/is_filtered`` (the share outside the band) and ``policy/is_weight`` (the mean weight), all
    detached. A KL loss without ``ref_logp``, or an IS correction without ``rollout_logp``, is an error:
    silently training without it would disagree with the config. ``old_logp`` is None exactly when the
    objective takes the old log-probs from this forward (``--old_logprobs train``).
    """
    o = objective
    if o.old_logprobs == "train":  # one optimizer step per rollout: the policy has not moved, its log-probs are the old
        if old_logp is not None:
            raise ValueError("the objective takes the old log-probs from the train forward (--old_logprobs train) "
                             "but the batch brings its own; expected none")
        old_logp = logp.detach()
    elif old_logp is None:
        raise ValueError(f"the batch has no old log-probs (--old_logprobs {o.old_logprobs} makes them before "
                         "training); expected them, or --old_logprobs train")
    surrogate, ratio_bound, dual_bound = _surrogate(logp, old_logp, advantages, o.eps_clip_low, o.eps_clip_high,
                                                    o.dual_clip)  # fmt: skip
    weights = None
    if o.is_correction != "none":
        if rollout_logp is None:
            raise ValueError(f"the objective corrects with {o.is_correction} but the batch has no rollout log-probs")
        weights, filtered = is_correction_weights(old_logp, rollout_logp, action_mask, o.is_correction, o.is_low,
                                                  o.is_high)
        surrogate = surrogate * weights.to(surrogate.dtype)
    loss = _reduce(-surrogate, action_mask, o.reduction)
    metrics = {"loss/policy": loss.detach(),
               "policy/clip_frac": masked_mean(ratio_bound.to(loss.dtype), action_mask).detach()}  # fmt: skip
    if o.dual_clip is not None:
        metrics["policy/dual_clip_frac"] = masked_mean(dual_bound.to(loss.dtype), action_mask).detach()
    if weights is not None:
        metrics["policy/is_filtered"] = filtered.detach()
        metrics["policy/is_weight"] = masked_mean(weights, action_mask.to(weights.dtype)).detach()
    total = loss
    if o.kl_loss_coef:
        if ref_logp is None:
            raise ValueError("the objective has a KL loss (kl_loss_coef > 0) but the batch has no reference log-probs")
        kl = kl_loss(logp, ref_logp, action_mask, o.kl_estimator, o.reduction)
        total = total + o.kl_loss_coef * kl
        metrics["loss/kl"] = kl.detach()
    return total, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    action_mask: torch.Tensor,
    value_clip: float | None,
    reduction: Reduction = "token",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Critic loss (OpenRLHF ``ValueLoss``), reduced over valid tokens::

        clipped V  = old_V + clip(V - old_V, -value_clip, value_clip)
        loss_t     = 0.5 * max((V - R)^2, (clipped V - R)^2)      if value_clip is not None
        loss_t     = 0.5 * (V - R)^2                               otherwise

    Returns ``(loss, clip_frac)``; ``clip_frac`` is the fraction of valid tokens where the clipped error
    is strictly the larger one (0 without clipping).
    """
    unclipped = (values - returns) ** 2
    if value_clip is None:
        loss, clip_frac = unclipped, torch.zeros((), dtype=values.dtype, device=values.device)
    else:
        clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
        clipped = (clipped_values - returns) ** 2
        loss = torch.max(unclipped, clipped)
        clip_frac = masked_mean((clipped > unclipped).to(values.dtype), action_mask).detach()
    return 0.5 * _reduce(loss, action_mask, reduction), clip_frac


def kl_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    action_mask: torch.Tensor,
    estimator: str,
    reduction: Reduction = "token",
) -> torch.Tensor:
    """KL penalty as a loss (``--use_kl_loss``): the reduced per-token KL estimate with ``estimator``
    (``--kl_estimator``; no default, so that no caller can fall back to another estimator than the
    config's). The trainer adds ``init_kl_coef * kl_loss`` to the policy loss and then puts no KL into
    the rewards."""
    return _reduce(compute_kl(logp, ref_logp, action_mask, estimator), action_mask, reduction)


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024
) -> torch.Tensor:
    """``log softmax(logits / temperature)[label]`` per position, in float32.

    ``logits`` ``[..., V]``, ``labels`` ``[...]`` (token ids, e.g. the input ids shifted by one). Computed
    as ``logit[label] - logsumexp(logits)`` on chunks of ``chunk_size`` positions, so only a
    ``[chunk_size, V]`` float32 buffer is materialised at a time (never a full ``[B, T, V]`` float32
    log-softmax), and the max-shifted logsumexp keeps it stable for large logits and in bf16.
    Differentiable. Use the sampling temperature so that the log-probs match the rollout policy.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree")
    flat_logits = logits.reshape(-1, logits.size(-1))
    flat_labels = labels.reshape(-1, 1)
    pieces = []
    for start in range(0, flat_logits.size(0), chunk_size):
        chunk = flat_logits[start : start + chunk_size].float()
        if temperature != 1.0:
            chunk = chunk / temperature
        picked = chunk.gather(-1, flat_labels[start : start + chunk_size]).squeeze(-1)
        pieces.append(picked - torch.logsumexp(chunk, dim=-1))
    if not pieces:
        return torch.zeros(labels.shape, dtype=torch.float32, device=logits.device)
    return torch.cat(pieces).view(labels.shape)
