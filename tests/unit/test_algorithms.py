"""Unit tests of trainer.learn.algorithms: expected values are worked out by hand and written out numerically."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch

from trainer.config import AdvantageEstimator, KlEstimator
from trainer.learn import algorithms as alg

REPO = Path(__file__).resolve().parents[2]


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# --- masked ops ---------------------------------------------------------------------------------------
X = torch.tensor([[1.0, 2.0, 100.0], [3.0, -50.0, -50.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_masked_mean_ignores_padding():
    close(alg.masked_mean(X, MASK), 2.0)  # (1 + 2 + 3) / 3
    close(alg.masked_mean(X, MASK, dim=-1), [1.5, 3.0])


def test_masked_mean_of_all_padding_row_is_zero_not_nan():
    close(alg.masked_mean(X, torch.tensor([[1, 1, 0], [0, 0, 0]]), dim=-1), [1.5, 0.0])


def test_masked_whiten_uses_valid_entries_only_and_zeroes_padding():
    # valid 1, 2, 3: mean 2, population var 2/3, std 0.8164966
    close(alg.masked_whiten(X, MASK), [[-1.2247449, 0.0, 0.0], [1.2247449, 0.0, 0.0]])
    close(alg.masked_whiten(X, MASK, shift_mean=False), [[0.7752551, 2.0, 0.0], [3.2247449, 0.0, 0.0]])


# --- KL estimators ------------------------------------------------------------------------------------
LOGP = torch.tensor([[0.0, -1.0, -2.0]])
REF_LOGP = torch.tensor([[-0.5, -1.0, -1.0]])  # log r = [0.5, 0, -1]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("k1", [[0.5, 0.0, -1.0]]),
        ("k2", [[0.125, 0.0, 0.5]]),  # (log r)^2 / 2
        ("k3", [[0.1065307, 0.0, 0.7182818]]),  # e^-0.5 - 1 + 0.5 ; e^1 - 1 - 1
    ],
)
def test_kl_estimators(name, expected):
    close(alg.KL_ESTIMATORS[name](LOGP, REF_LOGP), expected)


def test_kl_estimators_are_zero_on_padding():
    mask = torch.tensor([[1, 1, 0]])
    close(alg.kl_k1(LOGP, REF_LOGP, mask), [[0.5, 0.0, 0.0]])
    close(alg.kl_k3(LOGP, REF_LOGP, mask), [[0.1065307, 0.0, 0.0]])


def test_kl_loss_is_masked_mean_of_estimate():
    close(alg.kl_loss(LOGP, REF_LOGP, torch.tensor([[1, 1, 1]]), "k2"), 0.2083333)  # (0.125 + 0 + 0.5) / 3


# --- rewards and returns ------------------------------------------------------------------------------
def test_token_rewards_put_score_on_last_valid_token_and_kl_everywhere():
    scores = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 7.0], [1.0, 1.0, 1.0]])
    rewards = alg.compute_token_rewards(scores, kl, mask, kl_coef=0.1)
    close(rewards, [[-0.01, -0.02, 0.97], [-0.04, 1.95, 0.0], [0.0, 0.0, 0.0]])


def test_gae_hand_worked_with_padding():
    rewards = torch.tensor([[0.1, -0.2, 1.0], [0.0, 2.0, 5.0]])
    values = torch.tensor([[0.5, 0.4, 0.3], [1.0, 0.5, 9.0]])  # 5.0 and 9.0 are padding garbage
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    advantages, returns = alg.gae(rewards, values, mask, gamma=0.9, lambd=0.8)
    # row 0: d2 = 1 - .3 = .7; d1 = -.2 + .27 - .4 = -.33; d0 = .1 + .36 - .5 = -.04
    #        A2 = .7; A1 = -.33 + .72 * .7 = .174; A0 = -.04 + .72 * .174 = .08528
    # row 1: d2 = 0; d1 = 2 - .5 = 1.5; d0 = .45 - 1 = -.55; A = [-.55 + .72 * 1.5, 1.5, 0]
    close(advantages, [[0.08528, 0.174, 0.7], [0.53, 1.5, 0.0]])
    close(returns, [[0.58528, 0.574, 1.0], [1.53, 2.0, 0.0]])


def test_cumulative_returns_with_discount():
    rewards = torch.tensor([[1.0, 0.0, 2.0], [3.0, 4.0, 8.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    close(alg.cumulative_returns(rewards, mask, gamma=0.5), [[1.5, 1.0, 2.0], [5.0, 4.0, 0.0]])


# --- sequence-level estimators ------------------------------------------------------------------------
SCORES = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])


def test_rloo_leave_one_out_baseline():
    # prompt 1: sum 2, baseline of a 1 is 1/3, of a 0 is 2/3; prompt 2: sum 3, baselines 2/3 and 1
    close(alg.rloo(SCORES, 4), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 1 / 3, 1 / 3, 1 / 3, -1.0])


def test_group_norm_uses_unbiased_group_std():
    # prompt 1: mean .5, std sqrt(1/3) -> +-0.8660254; prompt 2: mean .75, std .5 -> .5 / -1.5
    expected = [0.8660254, -0.8660254, -0.8660254, 0.8660254, 0.5, 0.5, 0.5, -1.5]
    close(alg.group_norm(SCORES, 4), expected)


def test_group_norm_of_identical_scores_is_zero():
    close(alg.group_norm(torch.tensor([0.7, 0.7, 0.0, 1.0]), 2), [0.0, 0.0, -0.7071068, 0.7071068])


def test_reinforce_baseline_subtracts_group_mean():
    close(alg.reinforce_baseline(SCORES, 4), [0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75])


def test_group_estimators_reject_ungrouped_scores():
    with pytest.raises(ValueError, match="multiple of n=3"):
        alg.rloo(SCORES, 3)
    with pytest.raises(ValueError, match="n > 1"):
        alg.group_norm(SCORES, 1)


PIPE_SCORES = torch.tensor([1.0, 0.0, 0.5, 0.5])  # 2 prompts x 2 samples
PIPE_MASK = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
PIPE_KL = torch.tensor([[0.1, 0.2], [0.3, 9.0], [0.0, 0.0], [0.2, 0.0]])


def test_reinforce_baseline_pipeline_returns_and_whitened_advantages():
    advantages, returns = alg.compute_advantages_and_returns(
        "reinforce_baseline", PIPE_SCORES, PIPE_MASK, n_samples_per_prompt=2, kl=PIPE_KL, kl_coef=0.5
    )
    # shaped scores [.5, -.5, 0, 0]; token rewards [-.05, .4], [-.65, 0], [0, 0], [-.1, 0]
    close(returns, [[0.35, 0.4], [-0.65, 0.0], [0.0, 0.0], [-0.1, 0.0]])
    # 7 valid returns: mean 0, population std 0.3195980
    close(advantages, [[1.0951259, 1.2515724], [-2.0338052, 0.0], [0.0, 0.0], [-0.3128931, 0.0]])


def test_group_norm_pipeline_is_not_whitened():
    advantages, returns = alg.compute_advantages_and_returns(
        "group_norm", PIPE_SCORES, PIPE_MASK, n_samples_per_prompt=2, kl=PIPE_KL, kl_coef=0.0
    )
    # group 1: +-0.7071068 on every valid token (gamma 1, no KL); group 2: identical scores -> 0
    expected = [[0.7071068, 0.7071068], [-0.7071068, 0.0], [0.0, 0.0], [0.0, 0.0]]
    close(returns, expected)
    close(advantages, expected)


def test_gae_pipeline_without_whitening_matches_hand_values():
    advantages, returns = alg.compute_advantages_and_returns(
        "gae",
        torch.tensor([1.0]),
        torch.tensor([[1, 1]]),
        kl=torch.tensor([[0.2, 0.4]]),
        kl_coef=0.5,
        values=torch.tensor([[0.5, 0.25]]),
        gamma=1.0,
        lambd=0.5,
        normalization="none",
    )
    # rewards [-.1, .8]; d1 = .8 - .25 = .55; d0 = -.1 + .25 - .5 = -.35; A0 = -.35 + .5 * .55
    close(advantages, [[-0.075, 0.55]])
    close(returns, [[0.425, 0.8]])


def test_gae_requires_values():
    with pytest.raises(ValueError, match="critic values"):
        alg.compute_advantages_and_returns("gae", PIPE_SCORES, PIPE_MASK)


def test_estimator_names_match_config_choices():
    assert (
        set(typing.get_args(AdvantageEstimator))
        == set(alg.ADVANTAGE_ESTIMATORS)
        == set(alg.WHITEN_ADVANTAGES)
    )
    assert set(typing.get_args(KlEstimator)) == set(alg.KL_ESTIMATORS)


def test_normalize_reward_running_statistics():
    stats = alg.RunningMeanStd()
    close(alg.normalize_reward(torch.tensor([1.0, 3.0]), stats), [-1.0, 1.0])  # mean 2, std 1
    stats = alg.RunningMeanStd()
    stats.update(torch.tensor([1.0, 2.0, 3.0]))
    stats.update(torch.tensor([4.0, 5.0]))
    assert (stats.count, stats.mean, stats.var) == (5, pytest.approx(3.0), pytest.approx(2.0))
    close(alg.normalize_reward(torch.tensor([5.0]), stats, update=False), [1.4142136])


# --- losses -------------------------------------------------------------------------------------------
def test_policy_loss_clipping_binds_only_where_it_should():
    logp = torch.tensor([[math.log(1.5), math.log(1.5)], [math.log(0.5), math.log(1.1)]], requires_grad=True)
    old_logp = torch.zeros(2, 2)
    advantages = torch.tensor([[1.0, -1.0], [-2.0, 2.0]])
    # ratio 1.5, A=+1: min(1.5, 1.2) -> clipped, -1.2 | ratio 1.5, A=-1: min(-1.5, -1.2) -> unclipped, 1.5
    # ratio 0.5, A=-2: min(-1, -1.6) -> clipped, 1.6  | ratio 1.1, A=2: inside the range, -2.2
    loss, clip_frac = alg.policy_loss(logp, old_logp, advantages, torch.ones(2, 2), eps_clip=0.2)
    close(loss.detach(), -0.075)  # (-1.2 + 1.5 + 1.6 - 2.2) / 4
    close(clip_frac, 0.5)
    loss.backward()
    # d/dlogp = -A * ratio / 4 where unclipped, 0 where the clip binds
    close(logp.grad, [[0.0, 0.375], [0.0, -0.55]])


def test_policy_loss_masking_and_sequence_reduction():
    logp = torch.tensor([[math.log(1.5), math.log(1.5)], [math.log(0.5), math.log(1.1)]])
    advantages = torch.tensor([[1.0, -1.0], [-2.0, 2.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, clip_frac = alg.policy_loss(logp, torch.zeros(2, 2), advantages, mask, eps_clip=0.2)
    close(loss, 0.6333333)  # (-1.2 + 1.5 + 1.6) / 3
    close(clip_frac, 0.6666667)
    loss, _ = alg.policy_loss(logp, torch.zeros(2, 2), advantages, mask, eps_clip=0.2, reduction="sequence")
    close(loss, 0.875)  # mean(0.15, 1.6)


VALUES = torch.tensor([[1.0, 2.0, 0.1]])
OLD_VALUES = torch.tensor([[0.8, 1.0, 1.0]])
RETURNS = torch.tensor([[1.5, 1.0, 0.0]])


def test_value_loss_clipped():
    # token 0: step .2 within clip, both errors .25 | token 1: clipped V 1.2, max(1.0, .04) = 1.0
    # token 2: clipped V .8, max(.01, .64) = .64 (clip binds)
    loss, clip_frac = alg.value_loss(VALUES, OLD_VALUES, RETURNS, torch.ones(1, 3), value_clip=0.2)
    close(loss, 0.315)  # 0.5 * (0.25 + 1.0 + 0.64) / 3
    close(clip_frac, 1 / 3)
    loss, clip_frac = alg.value_loss(VALUES, OLD_VALUES, RETURNS, torch.tensor([[1, 1, 0]]), value_clip=0.2)
    close(loss, 0.3125)
    close(clip_frac, 0.0)


def test_value_loss_unclipped():
    loss, clip_frac = alg.value_loss(VALUES, OLD_VALUES, RETURNS, torch.ones(1, 3), value_clip=None)
    close(loss, 0.21)  # 0.5 * (0.25 + 1.0 + 0.01) / 3
    close(clip_frac, 0.0)


# --- log-probabilities --------------------------------------------------------------------------------
def test_log_probs_from_logits_matches_log_softmax_gather():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen) * 4
    labels = torch.randint(0, 11, (3, 5), generator=gen)
    direct = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(alg.log_probs_from_logits(logits, labels), direct)
    torch.testing.assert_close(
        alg.log_probs_from_logits(logits, labels, chunk_size=4), direct
    )  # ragged chunks
    half = logits.bfloat16()
    direct_half = torch.log_softmax(half.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    out = alg.log_probs_from_logits(half, labels)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, direct_half)


def test_log_probs_from_logits_is_stable_and_applies_temperature():
    logits = torch.tensor([[[1000.0, 0.0], [1000.0, 0.0]]])
    close(alg.log_probs_from_logits(logits, torch.tensor([[0, 1]])), [[0.0, -1000.0]])
    # logits / 2 = [1, 0]: log p(0) = 1 - log(e + 1)
    close(
        alg.log_probs_from_logits(torch.tensor([[2.0, 0.0]]), torch.tensor([0]), temperature=2.0),
        [-0.3132617],
    )


def test_log_probs_from_logits_is_differentiable():
    logits = torch.zeros(1, 2, 4, requires_grad=True)
    alg.log_probs_from_logits(logits, torch.tensor([[1, 3]])).sum().backward()
    # d log softmax(z)[y] / dz = onehot(y) - softmax(z) = onehot - 0.25
    close(logits.grad, [[[-0.25, 0.75, -0.25, -0.25], [-0.25, -0.25, -0.25, 0.75]]])


# --- import hygiene -----------------------------------------------------------------------------------
def test_algorithms_do_not_import_ray_or_deepspeed():
    code = (
        "import sys, trainer.learn.algorithms\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'deepspeed', 'vllm')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
