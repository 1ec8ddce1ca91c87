"""Advantage estimation and reward shaping for PPO / REINFORCE-family RL (pure torch; no Ray, no DeepSpeed).

Conventions (as in OpenRLHF): ``B`` sequences, ``T`` response tokens; token tensors are ``[B, T]``,
right-padded; ``action_mask`` is 1 on real response tokens (up to and including EOS) and 0 on padding.
Sequence scores (reward-model / reward-function outputs) are ``[B]``. For the group estimators the
``n`` samples of one prompt are adjacent: ``scores.view(-1, n)`` has one prompt per row.

The pipeline of one rollout, :func:`compute_advantages_and_returns` (the trainer calls it through
:func:`advantages_from_config`, which takes every choice from the values ``--print-config`` shows):

1. (optional, stateful, done by the caller) ``scores = normalize_reward(scores, stats)``;
2. sequence estimators: ``scores = ADVANTAGE_ESTIMATORS[name](scores, n)`` (rloo, reinforce_baseline,
   dr_grpo, group_norm subtract a baseline from the prompt's other samples; reinforce keeps the score);
3. ``scores.clamp(*reward_clip)`` (``--reward_clip_range``, as OpenRLHF), then
   ``r = compute_token_rewards(scores, kl, action_mask, kl_coef)``: score on the last valid token,
   ``-kl_coef * kl`` on every valid token (``kl_coef=0`` when the KL is a loss, ``--use_kl_loss``);
4. gae: ``advantages, returns = gae(r, values, action_mask, gamma, lambd)``;
   others: ``returns = cumulative_returns(r, action_mask, gamma)`` and ``advantages = returns``;
5. :func:`normalize_advantages` over the batch's valid tokens: ``whiten`` (mean 0, std 1; gae, reinforce,
   reinforce_baseline, and rloo unless ``--rloo_whiten off``), ``center`` (mean 0 only:
   ``--no_advantage_std_norm``) or ``none`` (group_norm, dr_grpo). Returns are never normalised.

Losses and log-probabilities live in :mod:`trainer.learn.losses` and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

from trainer.config.estimators import ESTIMATORS
from trainer.learn.losses import (
    KL_ESTIMATORS,
    compute_kl,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_loss,
    log_probs_from_logits,
    masked_mean,
    masked_whiten,
    policy_loss,
    value_loss,
)

Normalization = Literal["whiten", "center", "none"]
NORMALIZATIONS: tuple[str, ...] = ("whiten", "center", "none")

__all__ = [
    "ADVANTAGE_ESTIMATORS", "KL_ESTIMATORS", "NORMALIZATIONS", "WHITEN_ADVANTAGES", "RunningMeanStd",
    "advantages_from_config", "compute_advantages_and_returns", "compute_kl", "compute_token_rewards",
    "cumulative_returns", "dr_grpo", "gae", "group_norm", "kl_k1", "kl_k2", "kl_k3", "kl_loss",
    "log_probs_from_logits", "masked_mean", "masked_whiten", "normalize_advantages", "normalize_reward",
    "policy_loss", "reinforce", "reinforce_baseline", "rloo", "value_loss",
]  # fmt: skip


def compute_token_rewards(
    scores: torch.Tensor, kl: torch.Tensor | None, action_mask: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """Per-token rewards ``[B, T]`` from sequence scores ``[B]`` (OpenRLHF ``compute_reward``)::

        r[b, t] = -kl_coef * kl[b, t] * mask[b, t]  +  scores[b] * [t == last valid token of b]

    ``kl_coef <= 0`` or ``kl=None`` means no KL penalty. A row without valid tokens gets no score.
    """
    mask = action_mask.to(scores.dtype)
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    if kl is not None and kl_coef > 0:
        rewards = rewards - kl_coef * kl.to(scores.dtype) * mask
    length = mask.size(1)
    # index of the last 1 in each row: T - 1 - (position of the first 1 in the reversed row)
    last = length - 1 - mask.flip(dims=[1]).argmax(dim=1)
    has_tokens = mask.sum(dim=1) > 0
    bonus = torch.zeros_like(rewards).scatter_(1, last.unsqueeze(1), (scores * has_tokens).unsqueeze(1))
    return rewards + bonus


def cumulative_returns(token_rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted reward-to-go ``G[t] = r[t] + gamma * G[t+1]`` over valid tokens (padding rewards are
    zeroed first), ``G[T] = 0``. With the score on the last token and ``gamma = 1`` every token of a
    sequence gets ``score - kl_coef * (sum of the KL from t to the end)``. Masked tokens are skipped (the
    discount runs over action tokens only) and get return 0: with a multi-turn response's tool tokens masked,
    the tokens before them see the return of the next action token.
    """
    mask = action_mask.to(token_rewards.dtype)
    rewards = token_rewards * mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        # a masked token (padding, or tool output inside a multi-turn response) passes the return through
        running = mask[:, t] * (rewards[:, t] + gamma * running) + (1 - mask[:, t]) * running
        returns[:, t] = running * mask[:, t]
    return returns


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, action_mask: torch.Tensor, gamma: float, lambd: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (OpenRLHF ``get_advantages_and_returns``).

    With ``V`` and ``r`` zeroed on padding and ``V[T] = 0``::

        delta[t] = r[t] + gamma * V[t+1] - V[t]
        A[t]     = delta[t] + gamma * lambd * A[t+1],   A[T] = 0
        returns  = A + V

    where ``t + 1`` is the next *unmasked* token: masked tokens (padding, and the tool output inside a
    multi-turn response with ``--state_masking``) are skipped, so they get no advantage and no value target
    (both 0) and do not cut the recursion. Returns ``(advantages, returns)``, both ``[B, T]``, detached
    (targets, not part of the graph).
    """
    mask = action_mask.to(values.dtype)
    values = values.detach() * mask
    rewards = token_rewards.detach() * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    next_value = torch.zeros_like(running)
    for t in reversed(range(rewards.size(1))):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        m = mask[:, t]
        # masked tokens (padding; tool output inside a multi-turn response) are skipped: the next action
        # token's value and advantage pass through them unchanged (verl's multi-turn GAE does the same)
        running = m * (delta + gamma * lambd * running) + (1 - m) * running
        next_value = m * values[:, t] + (1 - m) * next_value
        advantages[:, t] = running * m
    return advantages, advantages + values


def _groups(scores: torch.Tensor, n: int) -> torch.Tensor:
    if scores.dim() != 1 or n < 1 or scores.numel() % n:
        raise ValueError(
            f"scores must be 1-D with a multiple of n={n} entries, got shape {tuple(scores.shape)}"
        )
    return scores.view(-1, n)


def rloo(scores: torch.Tensor, n: int) -> torch.Tensor:
    """REINFORCE leave-one-out: ``s_i - (sum_j s_j - s_i) / (n - 1)`` within each prompt's n samples.

    ``scores`` is ``[B*n]`` with a prompt's samples adjacent; returns ``[B*n]``. Requires ``n > 1``.
    """
    if n < 2:
        raise ValueError(f"rloo needs n > 1 samples per prompt, got n={n}")
    groups = _groups(scores, n)
    baseline = (groups.sum(dim=1, keepdim=True) - groups) / (n - 1)
    return (groups - baseline).reshape(-1)


def reinforce(scores: torch.Tensor, n: int = 1) -> torch.Tensor:
    """REINFORCE++ (no baseline): the score itself (a copy), for any ``n``. Its variance reduction is the
    batch whitening of the token advantages (step 5 of :func:`compute_advantages_and_returns`), and the
    KL penalty sits in the per-token rewards, so ``--gamma`` discounts it (OpenRLHF allows gamma != 1
    for this estimator only among the REINFORCE family)."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D, got shape {tuple(scores.shape)}")
    return scores.clone()


def reinforce_baseline(scores: torch.Tensor, n: int) -> torch.Tensor:
    """REINFORCE++ with baseline, sequence part: ``s_i - mean_j s_j`` within each prompt's n samples.

    No division by the group std (unlike group_norm); the batch whitening of the token-level advantages
    that completes REINFORCE++-baseline is step 5 of :func:`compute_advantages_and_returns`.
    """
    groups = _groups(scores, n)
    return (groups - groups.mean(dim=1, keepdim=True)).reshape(-1)


def dr_grpo(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "GRPO done right"): ``s_i - mean_j s_j`` within each prompt's n
    samples: GRPO without the division by the group std (which favours prompts whose samples all
    score alike). Not whitened over the batch either. Requires ``n > 1``.

    As in OpenRLHF v0.8.4 the loss is the token mean over the micro-batch like every estimator's
    here; the paper's other change (dividing token sums by a constant instead of each sequence's
    length) is what a token-level mean already avoids: no per-sequence length normalisation.
    """
    if n < 2:
        raise ValueError(f"dr_grpo needs n > 1 samples per prompt, got n={n}")
    groups = _groups(scores, n)
    return (groups - groups.mean(dim=1, keepdim=True)).reshape(-1)


def group_norm(scores: torch.Tensor, n: int, eps: float = 1e-9) -> torch.Tensor:
    """GRPO: ``(s_i - mean_group) / (std_group + eps)``, std unbiased (n - 1 denominator) as in OpenRLHF.

    A group of identical scores gets advantage 0. Not whitened again over the batch.
    """
    if n < 2:
        raise ValueError(f"group_norm needs n > 1 samples per prompt, got n={n}")
    groups = _groups(scores, n)
    std = groups.std(dim=1, keepdim=True)
    return ((groups - groups.mean(dim=1, keepdim=True)) / (std + eps)).reshape(-1)


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]]] = {
    "gae": gae,  # (token_rewards, values, action_mask, gamma, lambd) -> (advantages, returns)
    "reinforce": reinforce,  # (scores [B], n) -> scores [B]
    "rloo": rloo,  # (scores [B*n], n) -> shaped scores [B*n]
    "reinforce_baseline": reinforce_baseline,  # (scores [B*n], n) -> shaped scores [B*n]
    "group_norm": group_norm,  # (scores [B*n], n) -> shaped scores [B*n]
    "dr_grpo": dr_grpo,  # (scores [B*n], n) -> shaped scores [B*n]
}
# Which estimators whiten over the batch by default: the estimator table's choice (trainer.config.estimators).
WHITEN_ADVANTAGES: dict[str, bool] = {name: e.batch_whiten for name, e in ESTIMATORS.items()}


def normalize_advantages(advantages: torch.Tensor, action_mask: torch.Tensor, mode: Normalization) -> torch.Tensor:
    """Normalise token advantages over the valid tokens of the batch (OpenRLHF's replay-buffer step).

    ``whiten``: ``(A - m) / sqrt(max(v, 1e-8))`` with the masked mean ``m`` and population variance ``v``;
    ``center``: ``A - m`` (``--no_advantage_std_norm``); ``none``: unchanged. Padding becomes 0 in the
    first two modes (OpenRLHF leaves it at ``-m * rstd``; the losses never read it).
    """
    if mode == "whiten":
        return masked_whiten(advantages, action_mask)
    if mode == "center":
        return (advantages - masked_mean(advantages, action_mask)) * action_mask.to(advantages.dtype)
    if mode == "none":
        return advantages
    raise ValueError(f"unknown advantage normalization {mode!r}; expected one of {', '.join(NORMALIZATIONS)}")


def compute_advantages_and_returns(
    estimator: str,
    scores: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    n_samples_per_prompt: int = 1,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lambd: float = 1.0,
    normalization: Normalization | None = None,
    reward_clip: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 2-5 of the module pipeline for one rollout; returns ``(advantages, returns)``, ``[B, T]``.

    ``scores`` ``[B]`` (already normalised if ``--normalize_reward``), ``kl`` ``[B, T]`` per-token KL
    (``None`` or ``kl_coef=0`` when the KL is a loss), ``values`` ``[B, T]`` critic values (gae only),
    ``reward_clip`` ``(low, high)`` clamps the (shaped) scores. ``normalization`` None is the estimator's
    default (``whiten`` or ``none``, :data:`WHITEN_ADVANTAGES`); pass ``"none"`` to normalise elsewhere
    (e.g. with all-reduced statistics). The statistics are those of this batch: pass the whole rollout.
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {estimator!r}; expected one of {sorted(ADVANTAGE_ESTIMATORS)}"
        )
    if estimator == "gae":
        if values is None:
            raise ValueError("advantage estimator 'gae' needs critic values")
        shaped = scores
    else:
        shaped = ADVANTAGE_ESTIMATORS[estimator](scores, n_samples_per_prompt)
    if reward_clip is not None:
        low, high = reward_clip
        shaped = shaped.clamp(min=low, max=high)
    token_rewards = compute_token_rewards(shaped, kl, action_mask, kl_coef)
    if estimator == "gae":
        advantages, returns = gae(token_rewards, values, action_mask, gamma, lambd)
    else:
        returns = cumulative_returns(token_rewards, action_mask, gamma)
        advantages = returns.clone()
    mode = normalization or ("whiten" if WHITEN_ADVANTAGES[estimator] else "none")
    return normalize_advantages(advantages, action_mask, mode), returns


def advantages_from_config(
    cfg: Any,
    scores: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`compute_advantages_and_returns` with every choice taken from a validated ``TrainerConfig``:
    the estimator, ``n_samples_per_prompt``, ``gamma`` / ``lambd``, ``reward_clip_range`` and the derived
    ``kl_penalty_coef`` (the KL's weight in the rewards: 0 with ``--use_kl_loss``) and
    ``advantage_norm`` (whiten / center / none), exactly as ``--print-config`` shows them."""
    return compute_advantages_and_returns(
        cfg.advantage_estimator, scores, action_mask, n_samples_per_prompt=cfg.n_samples_per_prompt, kl=kl,
        kl_coef=cfg.kl_penalty_coef, values=values, gamma=cfg.gamma, lambd=cfg.lambd,
        normalization=cfg.advantage_norm, reward_clip=cfg.reward_clip_range,
    )  # fmt: skip


class RunningMeanStd:
    """Running mean / variance of all scores seen so far (Chan et al. parallel update, population var).

    OpenRLHF's ``--normalize_reward`` divides a *reward model's* output by the mean/std stored with that
    model at RM-training time. Remote reward services and reward functions carry no such statistics, so
    here ``--normalize_reward`` normalises with statistics accumulated over all rollouts so far.
    """

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.var = 1.0

    def update(self, x: torch.Tensor) -> None:
        """Fold a batch of scores into the statistics."""
        x = x.detach().double().flatten()
        n = x.numel()
        if n == 0:
            return
        batch_mean, batch_var = x.mean().item(), x.var(unbiased=False).item()
        if self.count == 0:
            self.count, self.mean, self.var = n, batch_mean, batch_var
            return
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.var = m2 / total
        self.count = total

    @property
    def std(self) -> float:
        """Population standard deviation of the scores seen."""
        return self.var**0.5

    def state_dict(self) -> dict[str, float]:
        """For checkpoints."""
        return {"count": self.count, "mean": self.mean, "var": self.var}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore :meth:`state_dict` output."""
        self.count, self.mean, self.var = int(state["count"]), float(state["mean"]), float(state["var"])


def normalize_reward(
    scores: torch.Tensor, stats: RunningMeanStd, *, update: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """``(scores - mean) / max(std, eps)`` with running statistics, updated with ``scores`` first.

    Call it on the whole rollout's scores (driver side) so that every rank sees the same statistics.
    """
    if update:
        stats.update(scores)
    return (scores - stats.mean) / max(stats.std, eps)
