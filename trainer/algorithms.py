"""Advantage estimation and reward shaping for PPO / REINFORCE-family RL (pure torch; no Ray, no DeepSpeed).

Conventions (as in OpenRLHF): ``B`` sequences, ``T`` response tokens; token tensors are ``[B, T]``,
right-padded; ``action_mask`` is 1 on real response tokens (up to and including EOS) and 0 on padding.
Sequence scores (reward-model / reward-function outputs) are ``[B]``. For the group estimators the
``n`` samples of one prompt are adjacent: ``scores.view(-1, n)`` has one prompt per row.

The pipeline of one rollout, :func:`compute_advantages_and_returns`:

1. (optional, stateful, done by the caller) ``scores = normalize_reward(scores, stats)``;
2. group estimators only: ``scores = ADVANTAGE_ESTIMATORS[name](scores, n)`` (baseline-subtracted);
3. ``r = compute_token_rewards(scores, kl, action_mask, kl_coef)``: score on the last valid token,
   ``-kl_coef * kl`` on every valid token (pass ``kl_coef=0`` when the KL is a loss, ``--use_kl_loss``);
4. gae: ``advantages, returns = gae(r, values, action_mask, gamma, lambd)``;
   others: ``returns = cumulative_returns(r, action_mask, gamma)`` and ``advantages = returns``;
5. whitening of the token advantages over the batch (masked mean 0 / std 1) for every estimator but
   group_norm (``WHITEN_ADVANTAGES``); returns are never whitened.

Losses and log-probabilities live in :mod:`trainer.losses` and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.config.estimators import ESTIMATORS
from trainer.losses import (
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

__all__ = [
    "ADVANTAGE_ESTIMATORS", "KL_ESTIMATORS", "WHITEN_ADVANTAGES", "RunningMeanStd", "compute_advantages_and_returns",
    "compute_kl", "compute_token_rewards", "cumulative_returns", "gae", "group_norm", "kl_k1", "kl_k2", "kl_k3",
    "kl_loss", "log_probs_from_logits", "masked_mean", "masked_whiten", "normalize_reward", "policy_loss",
    "reinforce_baseline", "rloo", "value_loss",
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
    sequence gets ``score - kl_coef * (sum of the KL from t to the end)``.
    """
    rewards = token_rewards * action_mask.to(token_rewards.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, action_mask: torch.Tensor, gamma: float, lambd: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (OpenRLHF ``get_advantages_and_returns``).

    With ``V`` and ``r`` zeroed on padding and ``V[T] = 0``::

        delta[t] = r[t] + gamma * V[t+1] - V[t]
        A[t]     = delta[t] + gamma * lambd * A[t+1],   A[T] = 0
        returns  = A + V

    Returns ``(advantages, returns)``, both ``[B, T]``, detached (targets, not part of the graph).
    """
    mask = action_mask.to(values.dtype)
    values = values.detach() * mask
    rewards = token_rewards.detach() * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    length = rewards.size(1)
    for t in reversed(range(length)):
        next_value = values[:, t + 1] if t + 1 < length else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lambd * running
        advantages[:, t] = running
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


def reinforce_baseline(scores: torch.Tensor, n: int) -> torch.Tensor:
    """REINFORCE++ with baseline, sequence part: ``s_i - mean_j s_j`` within each prompt's n samples.

    No division by the group std (unlike group_norm); the batch whitening of the token-level advantages
    that completes REINFORCE++-baseline is step 5 of :func:`compute_advantages_and_returns`.
    """
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
    "rloo": rloo,  # (scores [B*n], n) -> shaped scores [B*n]
    "reinforce_baseline": reinforce_baseline,  # (scores [B*n], n) -> shaped scores [B*n]
    "group_norm": group_norm,  # (scores [B*n], n) -> shaped scores [B*n]
}
# Which estimators whiten over the batch: the estimator table's choice (trainer.config.estimators).
WHITEN_ADVANTAGES: dict[str, bool] = {name: e.batch_whiten for name, e in ESTIMATORS.items()}


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
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 2-5 of the module pipeline for one rollout; returns ``(advantages, returns)``, ``[B, T]``.

    ``scores`` ``[B]`` (already normalised if ``--normalize_reward``), ``kl`` ``[B, T]`` per-token KL
    (``None`` or ``kl_coef=0`` when the KL is a loss), ``values`` ``[B, T]`` critic values (gae only).
    ``whiten=False`` skips step 5 so that a distributed caller can whiten with all-reduced statistics;
    with ``whiten=True`` the statistics are those of this batch, so pass the whole rollout.
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {estimator!r}; expected one of {sorted(ADVANTAGE_ESTIMATORS)}"
        )
    if estimator == "gae":
        if values is None:
            raise ValueError("advantage estimator 'gae' needs critic values")
        advantages, returns = gae(compute_token_rewards(scores, kl, action_mask, kl_coef), values, action_mask,
                                  gamma, lambd)  # fmt: skip
    else:
        shaped = ADVANTAGE_ESTIMATORS[estimator](scores, n_samples_per_prompt)
        returns = cumulative_returns(
            compute_token_rewards(shaped, kl, action_mask, kl_coef), action_mask, gamma
        )
        advantages = returns.clone()
    if whiten and WHITEN_ADVANTAGES[estimator]:
        advantages = masked_whiten(advantages, action_mask)
    return advantages, returns


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
