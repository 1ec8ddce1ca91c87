"""State masking on a hand-built multi-turn sequence: the tokens a tool inserted stay in the model's input
but get no policy loss, no KL and no value target (and do not cut the GAE recursion)."""

from __future__ import annotations

import pytest
import torch

from trainer.experience import build_experience
from trainer.learn.algorithms import compute_advantages_and_returns, compute_token_rewards, gae
from trainer.learn.losses import PolicyObjective, compute_kl, policy_objective, value_loss

PAD = 0
# Row 0: prompt, a search turn (3 generated), the <information> block (4 inserted), the answer turn (3
# generated, EOS last). Row 1: a single-turn answer (2 generated).
PROMPTS = [[5, 6, 7], [5, 8]]
TURN1, INFO, TURN2 = [10, 11, 12], [20, 21, 22, 23], [13, 14, 2]
RESPONSES = [TURN1 + INFO + TURN2, [13, 2]]
MASKS = [[1] * 3 + [0] * 4 + [1] * 3, None]
ROW0 = torch.tensor([1, 1, 1, 0, 0, 0, 0, 1, 1, 1], dtype=torch.float32)
INFO_COLS = slice(3, 7)


@pytest.fixture
def exp():
    return build_experience(PROMPTS, RESPONSES, PAD, MASKS)


def test_inserted_tokens_are_read_but_are_no_actions(exp) -> None:
    assert exp.input_ids[0, 3:].tolist() == RESPONSES[0]
    assert exp.attention_mask[0].tolist() == [1] * 13  # the model attends to the information block
    assert torch.equal(exp.action_mask[0], ROW0)
    assert exp.action_mask[1].tolist() == [1, 1] + [0] * 8  # None: every response token is an action
    assert exp.attention_mask[1].tolist() == [0, 1, 1, 1, 1] + [0] * 8


def test_without_masks_inserted_tokens_are_actions() -> None:
    exp = build_experience(PROMPTS, RESPONSES, PAD)
    assert exp.action_mask[0].tolist() == [1.0] * 10


def test_bad_masks_are_refused() -> None:
    with pytest.raises(ValueError, match="response 0: action mask of 9 entries for 10 tokens"):
        build_experience(PROMPTS, RESPONSES, PAD, [[1] * 9, None])
    with pytest.raises(ValueError, match="1 action masks for 2 responses"):
        build_experience(PROMPTS, RESPONSES, PAD, [None])


def test_no_kl_on_inserted_tokens(exp) -> None:
    gen = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(2, 10, generator=gen), torch.randn(2, 10, generator=gen)
    for estimator in ("k1", "k2", "k3"):
        kl = compute_kl(logp, ref, exp.action_mask, estimator)
        assert torch.all(kl[0, INFO_COLS] == 0), estimator
        assert torch.all(kl[0, :3] != 0) and torch.all(kl[0, 7:] != 0), estimator


def test_score_lands_on_the_last_generated_token(exp) -> None:
    r = compute_token_rewards(torch.tensor([1.0, 0.5]), None, exp.action_mask, 0.0)
    assert r[0].tolist() == [0.0] * 9 + [1.0]
    assert r[1].tolist() == [0.0, 0.5] + [0.0] * 8


def _gae_over_actions(rewards: list[float], values: list[float], gamma: float, lambd: float) -> list[float]:
    """Plain GAE on the action tokens alone (the tool's tokens removed): what the masked GAE must equal."""
    adv, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(rewards) else 0.0
        running = rewards[t] + gamma * next_value - values[t] + gamma * lambd * running
        adv[t] = running
    return adv


def test_gae_skips_inserted_tokens_and_gives_them_no_target(exp) -> None:
    gamma, lambd = 0.9, 0.8
    values = torch.tensor([[0.1, 0.2, 0.3, 9.0, 9.0, 9.0, 9.0, 0.4, 0.5, 0.6], [0.7, 0.8] + [5.0] * 8])
    kl = torch.full((2, 10), 0.05)
    rewards = compute_token_rewards(torch.tensor([1.0, 0.0]), kl, exp.action_mask, 0.1)
    adv, ret = gae(rewards, values, exp.action_mask, gamma, lambd)
    keep = ROW0.bool()
    expected = _gae_over_actions(rewards[0][keep].tolist(), values[0][keep].tolist(), gamma, lambd)
    assert adv[0][keep].tolist() == pytest.approx(expected)
    # the tool's tokens: no advantage and no value target; the token before them sees V of the next action
    assert torch.all(adv[0, INFO_COLS] == 0) and torch.all(ret[0, INFO_COLS] == 0)
    assert adv[0, 2].item() == pytest.approx(rewards[0, 2].item() + gamma * 0.4 - 0.3 + gamma * lambd * adv[0, 7].item())
    # what the critic predicts for the tool's tokens changes nothing
    other = values.clone()
    other[0, INFO_COLS] = -3.0
    adv2, ret2 = gae(rewards, other, exp.action_mask, gamma, lambd)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)


def test_reinforce_returns_skip_inserted_tokens(exp) -> None:
    _, ret = compute_advantages_and_returns("reinforce", torch.tensor([1.0, 0.0]), exp.action_mask, gamma=1.0,
                                            normalization="none")
    assert ret[0].tolist() == [1.0] * 3 + [0.0] * 4 + [1.0] * 3


def _losses(exp, logp, old, adv, ref, values, old_values, returns):
    objective = PolicyObjective(kl_loss_coef=0.1, kl_estimator="k3")
    total, _ = policy_objective(logp, old, adv, exp.action_mask, ref, objective)
    v, _ = value_loss(values, old_values, returns, exp.action_mask, value_clip=0.2)
    return total, v


def test_inserted_tokens_get_no_policy_loss_no_kl_loss_no_value_loss(exp) -> None:
    gen = torch.Generator().manual_seed(1)
    tensors = [torch.randn(2, 10, generator=gen) for _ in range(7)]
    logp = tensors[0].clone().requires_grad_(True)
    base_policy, base_value = _losses(exp, logp, *tensors[1:])
    base_policy.backward()
    assert torch.all(logp.grad[0, INFO_COLS] == 0)  # no gradient through the tool's tokens
    assert torch.all(logp.grad[0, :3] != 0)
    # whatever the log-probs, advantages, reference, values and returns say at the tool's tokens: same losses
    changed = [t.clone() for t in tensors]
    for t in changed:
        t[0, INFO_COLS] = 7.0
    policy, value = _losses(exp, *changed)
    assert torch.equal(policy.detach(), base_policy.detach()) and torch.equal(value, base_value)


def test_the_same_check_fails_without_state_masking() -> None:
    """The loss test above can fail: with the tool's tokens counted as actions, they move the losses."""
    exp = build_experience(PROMPTS, RESPONSES, PAD)
    gen = torch.Generator().manual_seed(1)
    tensors = [torch.randn(2, 10, generator=gen) for _ in range(7)]
    changed = [t.clone() for t in tensors]
    for t in changed:
        t[0, INFO_COLS] = 7.0
    assert not torch.equal(_losses(exp, *tensors)[0], _losses(exp, *changed)[0])
    assert not torch.equal(_losses(exp, *tensors)[1], _losses(exp, *changed)[1])
