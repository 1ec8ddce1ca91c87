"""Issue 16's estimators and losses (reinforce, dr_grpo, rloo without whitening, --no_advantage_std_norm,
--reward_clip_range, --eps_clip_low_high, --dual_clip, the KL loss with each estimator): each against
values worked out by hand (in the comments), and where OpenRLHF has the feature, against its formula
written out here independently (v0.8.4 for the advantages and the clip pair, v0.8.9 for dual clip)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.learn import algorithms as alg
from trainer.learn.losses import PolicyObjective, policy_loss, policy_objective


def close(actual: torch.Tensor, expected, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


FULL = torch.ones(3, 2)


# --- reinforce (REINFORCE++) ----------------------------------------------------------------------------
def test_reinforce_whitens_the_plain_scores_over_the_batch():
    adv, ret = alg.compute_advantages_and_returns("reinforce", torch.tensor([1.0, 0.0, 3.0]), FULL)
    close(ret, [[1, 1], [0, 0], [3, 3]])  # the score on every token (gamma 1, no KL)
    # tokens 1,1,0,0,3,3: mean 4/3, var (2/9 + 32/9 + 50/9) / 6 = 14/9, std 1.2472191
    close(adv, [[-0.2672612, -0.2672612], [-1.0690450, -1.0690450], [1.3363062, 1.3363062]])


def test_reinforce_discounts_the_kl_penalty_with_gamma():
    adv, ret = alg.compute_advantages_and_returns(
        "reinforce", torch.tensor([2.0]), torch.ones(1, 3), kl=torch.tensor([[1.0, 0.0, 2.0]]), kl_coef=0.5,
        gamma=0.5, normalization="none")
    # rewards [-0.5, 0, -1 + 2]; G2 = 1, G1 = 0 + 0.5 * 1 = 0.5, G0 = -0.5 + 0.5 * 0.5 = -0.25
    close(ret, [[-0.25, 0.5, 1.0]])
    close(adv, [[-0.25, 0.5, 1.0]])


# --- dr_grpo ----------------------------------------------------------------------------------------------
def test_dr_grpo_subtracts_the_group_mean_without_std_and_without_whitening():
    scores = torch.tensor([1.0, 3.0, 0.0, 0.0])
    adv, _ = alg.compute_advantages_and_returns("dr_grpo", scores, torch.ones(4, 2), n_samples_per_prompt=2)
    close(adv, [[-1, -1], [1, 1], [0, 0], [0, 0]])  # groups (1, 3) and (0, 0): means 2 and 0
    grpo, _ = alg.compute_advantages_and_returns("group_norm", scores, torch.ones(4, 2), n_samples_per_prompt=2)
    close(grpo, [[-0.7071068, -0.7071068], [0.7071068, 0.7071068], [0, 0], [0, 0]])  # / unbiased std sqrt(2)
    # OpenRLHF v0.8.4: rewards.reshape(-1, n); rewards - rewards.mean(-1); no normalisation afterwards
    groups = scores.reshape(-1, 2)
    close(adv[:, 0], (groups - groups.mean(-1, keepdim=True)).reshape(-1).tolist())


def test_dr_grpo_needs_groups():
    with pytest.raises(ValueError, match="dr_grpo needs n > 1"):
        alg.dr_grpo(torch.tensor([1.0, 2.0]), 1)


# --- rloo whitening switch, --no_advantage_std_norm, --reward_clip_range -----------------------------
def test_rloo_with_and_without_batch_whitening():
    scores, mask = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.ones(4, 2)
    raw, _ = alg.compute_advantages_and_returns("rloo", scores, mask, n_samples_per_prompt=2, normalization="none")
    close(raw, [[1, 1], [-1, -1], [0, 0], [0, 0]])  # 1 - 0 / 1, 0 - 1 / 1; the second group all 0
    whitened, _ = alg.compute_advantages_and_returns("rloo", scores, mask, n_samples_per_prompt=2)
    close(whitened, [[1.4142136, 1.4142136], [-1.4142136, -1.4142136], [0, 0], [0, 0]])  # mean 0, var 4/8


def test_center_subtracts_the_mean_only():
    adv, _ = alg.compute_advantages_and_returns("reinforce", torch.tensor([1.0, 0.0, 3.0]), FULL,
                                                normalization="center")
    close(adv, [[-1 / 3, -1 / 3], [-4 / 3, -4 / 3], [5 / 3, 5 / 3]])  # minus the token mean 4/3
    # OpenRLHF v0.8.4 with --no_advantage_std_norm: (A - mean) * rstd with rstd = 1
    tokens = torch.tensor([[1.0, 1], [0, 0], [3, 3]])
    close(adv, ((tokens - tokens.mean()) * 1).tolist())


def test_normalisation_leaves_padding_at_zero_and_uses_valid_tokens_only():
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    out = alg.normalize_advantages(torch.tensor([[2.0, 99.0], [4.0, 6.0]]), mask, "center")
    close(out, [[-2.0, 0.0], [0.0, 2.0]])  # valid 2, 4, 6: mean 4
    with pytest.raises(ValueError, match="expected one of whiten, center, none"):
        alg.normalize_advantages(out, mask, "std")


def test_reward_clip_applies_to_the_shaped_score_before_the_kl_penalty():
    adv, ret = alg.compute_advantages_and_returns(
        "rloo", torch.tensor([30.0, 0.0]), torch.ones(2, 2), n_samples_per_prompt=2,
        kl=torch.tensor([[1.0, 1.0], [0.0, 0.0]]), kl_coef=0.5, normalization="none", reward_clip=(-10.0, 10.0))
    # rloo: 30 - 0 = 30, 0 - 30 = -30; clamped to 10 / -10; then -0.5 * kl per token (OpenRLHF compute_reward)
    close(ret, [[-0.5 + 10 - 0.5, 10 - 0.5], [-10, -10]])
    unclipped, _ = alg.compute_advantages_and_returns("rloo", torch.tensor([30.0, 0.0]), torch.ones(2, 2),
                                                      n_samples_per_prompt=2, normalization="none")
    close(unclipped, [[30, 30], [-30, -30]])


# --- the clipped surrogate ---------------------------------------------------------------------------------
LOGP_R2_R05 = torch.tensor([[math.log(2.0), math.log(0.5)]])


def test_asymmetric_clip_uses_low_below_and_high_above():
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    # ratio 2, A = +1: min(2, 1.3) = 1.3 (clipped) | ratio 0.5, A = -1: min(-0.5, -0.9) = -0.9 (clipped)
    loss, frac = policy_loss(LOGP_R2_R05, torch.zeros(1, 2), adv, mask, 0.1, eps_clip_high=0.3)
    close(loss, (-1.3 + 0.9) / 2)
    close(frac, 1.0)
    loss, _ = policy_loss(LOGP_R2_R05, torch.zeros(1, 2), adv, mask, 0.2)  # symmetric: 1.2 and -0.8
    close(loss, (-1.2 + 0.8) / 2)
    # OpenRLHF v0.8.4 PolicyLoss(clip_eps_low, clip_eps_high), token-level mean
    ratio = LOGP_R2_R05.exp()
    ref = -torch.min(ratio * adv, ratio.clamp(1 - 0.1, 1 + 0.3) * adv).mean()
    close(policy_loss(LOGP_R2_R05, torch.zeros(1, 2), adv, mask, 0.1, eps_clip_high=0.3)[0], ref.item())


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    logp = torch.tensor([[math.log(5.0), math.log(2.0), math.log(5.0)]])
    adv, mask = torch.tensor([[-1.0, -1.0, 1.0]]), torch.ones(1, 3)
    obj = PolicyObjective(dual_clip=3.0)
    total, metrics = policy_objective(logp, torch.zeros(1, 3), adv, mask, None, obj)
    # ratio 5, A -1: max(min(-5, -1.2), -3) = -3 -> 3 | ratio 2, A -1: -2 (c * A = -3 lower) -> 2
    # ratio 5, A +1: min(5, 1.2) = 1.2 -> -1.2 (dual clip only acts on negative advantages)
    close(total, (3 + 2 - 1.2) / 3)
    close(metrics["policy/dual_clip_frac"], 1 / 3)
    plain, _ = policy_objective(logp, torch.zeros(1, 3), adv, mask, None, PolicyObjective())
    close(plain, (5 + 2 - 1.2) / 3)
    # OpenRLHF v0.8.9: clip1 = min(surr1, surr2); clip2 = max(clip1, c * A); -where(A < 0, clip2, clip1)
    ratio = logp.exp()
    clip1 = torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    close(total, (-torch.where(adv < 0, torch.max(clip1, 3.0 * adv), clip1)).mean().item())


def test_objective_refuses_a_dual_clip_of_at_most_one():
    with pytest.raises(ValueError, match="must be > 1"):
        PolicyObjective(dual_clip=1.0)


# --- the KL loss with the configured estimator -----------------------------------------------------------------
@pytest.mark.parametrize(("estimator", "expected"), [
    ("k1", 0.0),  # log r = 0.5, -0.5
    ("k2", 0.125),  # 0.125 each
    ("k3", ((math.exp(-0.5) - 1 + 0.5) + (math.exp(0.5) - 1 - 0.5)) / 2),  # 0.1065307, 0.1487213
])
def test_kl_loss_term_uses_the_objectives_estimator(estimator, expected):
    logp, ref, mask = torch.tensor([[0.0, -1.0]]), torch.tensor([[-0.5, -0.5]]), torch.ones(1, 2)
    obj = PolicyObjective(kl_loss_coef=0.1, kl_estimator=estimator)
    total, metrics = policy_objective(logp, logp.detach(), torch.zeros(1, 2), mask, ref, obj)
    close(metrics["loss/kl"], expected)
    close(total, 0.1 * expected)  # ratio 1 and A 0: the surrogate is 0
    assert "loss/kl" not in policy_objective(logp, logp, torch.zeros(1, 2), mask, ref, PolicyObjective())[1]


def test_kl_loss_without_reference_log_probs_is_an_error():
    with pytest.raises(ValueError, match="no reference log-probs"):
        policy_objective(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), None,
                         PolicyObjective(kl_loss_coef=0.1, kl_estimator="k2"))


def test_kl_loss_has_no_default_estimator():
    with pytest.raises(TypeError):
        alg.kl_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1))  # type: ignore[call-arg]
