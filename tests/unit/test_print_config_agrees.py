"""Issue 16's acceptance, driver side: for every advantage estimator x KL flag combination (and the
normalisation and clip flags), what ``--print-config`` prints is what the trainer computes.

Each case runs ``python -m trainer.train_ppo_ray ... --print-config`` (in-process, ``main``), then
computes the advantages with the function the loop calls (``advantages_from_config``) and the policy
loss with the objective the loop hands to its workers (``PolicyObjective.from_config``), and compares
them with a reference written here from the *printed flags* alone (estimator, KL estimator, use_kl_loss,
init_kl_coef, gamma, lambd, rloo_whiten, no_advantage_std_norm, reward_clip_range, eps_clip(_low_high),
dual_clip), with loops instead of trainer.learn.algorithms' vectorised code. The worker side (the same
objective inside a real DeepSpeed ModelWorker) is tests/integration/test_objective_worker.py.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from trainer import train_ppo_ray
from trainer.config import ConfigError
from trainer.config.cli import parse_args
from trainer.config.estimators import ESTIMATORS
from trainer.learn.algorithms import advantages_from_config
from trainer.learn.losses import PolicyObjective, policy_objective

BASE = ["--pretrain", "/m", "--prompt_data", "/d.jsonl", "--reward_fn", "pkg.mod:fn", "--rollout_backend", "hf",
        "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1", "--rollout_batch_size", "3",
        "--n_samples_per_prompt", "2", "--micro_rollout_batch_size", "3", "--train_batch_size", "6",
        "--micro_train_batch_size", "6"]  # fmt: skip
KL_MODES = {  # name -> flags
    "kl-reward-k1": ["--init_kl_coef", "0.3", "--kl_estimator", "k1"],
    "kl-reward-k2": ["--init_kl_coef", "0.3", "--kl_estimator", "k2"],
    "kl-reward-k3": ["--init_kl_coef", "0.3", "--kl_estimator", "k3"],
    "kl-loss-k1": ["--init_kl_coef", "0.3", "--kl_estimator", "k1", "--use_kl_loss"],
    "kl-loss-k2": ["--init_kl_coef", "0.3", "--kl_estimator", "k2", "--use_kl_loss"],
    "kl-loss-k3": ["--init_kl_coef", "0.3", "--kl_estimator", "k3", "--use_kl_loss"],
    "no-kl": ["--init_kl_coef", "0"],
}
NORM_MODES = {"default": [], "no-std": ["--no_advantage_std_norm"], "rloo-off": ["--rloo_whiten", "off"]}
EXTRA = {  # per estimator: flags that only it takes
    "gae": ["--gamma", "0.9", "--lambd", "0.8", "--critic_num_gpus_per_node", "1"],
    "reinforce": ["--gamma", "0.8"],
}

# One rollout: 3 prompts x 2 samples, 3 response tokens, ragged.
SCORES = torch.tensor([1.0, 0.0, 0.5, 0.5, 14.0, -2.0])  # 14 - (-2) = 16 > the clip range 10 for rloo
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float32)
LOG_RATIO = torch.tensor([[0.3, -0.2, 0.1], [0.5, 0.0, 0.0], [-0.4, 0.0, 0.0], [0.2, 0.2, -0.1],
                          [0.0, 0.6, 0.0], [-0.3, 0.1, 0.4]]) * MASK  # fmt: skip
VALUES = torch.tensor([[0.1, 0.2, 0.3], [0.0, -0.1, 0.0], [0.4, 0.0, 0.0], [0.2, 0.2, 0.2],
                       [0.5, -0.5, 0.0], [0.0, 0.1, 0.0]]) * MASK  # fmt: skip


def printed_config(argv: list[str], capsys) -> dict:
    assert train_ppo_ray.main([*argv, "--print-config"]) == 0
    return json.loads(capsys.readouterr().out)


# --- the reference: the printed flags' meaning, written out token by token ----------------------------------
def ref_kl(estimator: str, d: float) -> float:
    return {"k1": d, "k2": d * d / 2, "k3": min(10.0, max(-10.0, math.exp(-d) - 1 + d))}[estimator]


def ref_shaped(p: dict, scores: list[float]) -> list[float]:
    est, n = p["advantage_estimator"], p["n_samples_per_prompt"]
    out = []
    for i, s in enumerate(scores):
        group = scores[i // n * n:(i // n + 1) * n]
        mean = sum(group) / n
        if est in ("gae", "reinforce"):
            out.append(s)
        elif est == "rloo":
            out.append(s - (sum(group) - s) / (n - 1))
        elif est in ("reinforce_baseline", "dr_grpo"):
            out.append(s - mean)
        elif est == "group_norm":
            std = math.sqrt(sum((g - mean) ** 2 for g in group) / (n - 1))
            out.append((s - mean) / (std + 1e-9))
    low, high = p["reward_clip_range"]
    return [min(high, max(low, v)) for v in out]


def ref_advantages(p: dict) -> list[list[float]]:
    kl_in_reward = p["init_kl_coef"] > 0 and not p["use_kl_loss"]
    shaped = ref_shaped(p, SCORES.tolist())
    rows = []
    for b in range(len(shaped)):
        length = int(MASK[b].sum())
        r = [-(p["init_kl_coef"] * ref_kl(p["kl_estimator"], LOG_RATIO[b, t].item())) if kl_in_reward else 0.0
             for t in range(length)]
        r[-1] += shaped[b]
        adv = [0.0] * length
        if p["advantage_estimator"] == "gae":
            v = VALUES[b, :length].tolist() + [0.0]
            running = 0.0
            for t in reversed(range(length)):
                running = r[t] + p["gamma"] * v[t + 1] - v[t] + p["gamma"] * p["lambd"] * running
                adv[t] = running
        else:
            running = 0.0
            for t in reversed(range(length)):
                running = r[t] + p["gamma"] * running
                adv[t] = running
        rows.append(adv)
    est = p["advantage_estimator"]
    whitened = est in ("gae", "reinforce", "reinforce_baseline") or (est == "rloo" and p["rloo_whiten"] == "on")
    if whitened:
        flat = [a for row in rows for a in row]
        mean = sum(flat) / len(flat)
        var = sum((a - mean) ** 2 for a in flat) / len(flat)
        scale = 1.0 if p["no_advantage_std_norm"] else 1 / math.sqrt(max(var, 1e-8))
        rows = [[(a - mean) * scale for a in row] for row in rows]
    return [row + [0.0] * (MASK.size(1) - len(row)) for row in rows]


def cases():
    for est, (kl_name, kl_flags), (norm_name, norm_flags) in itertools.product(
            ESTIMATORS, KL_MODES.items(), NORM_MODES.items()):
        yield pytest.param([*BASE, "--advantage_estimator", est, *EXTRA.get(est, []), *kl_flags, *norm_flags],
                           id=f"{est}-{kl_name}-{norm_name}")


@pytest.mark.parametrize("argv", list(cases()))
def test_advantages_follow_the_printed_flags(argv, capsys):
    try:
        cfg = parse_args(argv)
    except ConfigError as err:  # refused combinations are refused with the reason, never ignored
        text = "\n".join(err.problems)
        assert ("--no_advantage_std_norm has no effect" in text or "--rloo_whiten off only applies" in text), text
        return
    p = printed_config(argv, capsys)
    kl = None
    if p["needs_ref"]:  # the loop's KL for the rewards: the printed estimator on log(pi / ref)
        from trainer.learn.losses import compute_kl

        kl = compute_kl(LOG_RATIO, torch.zeros_like(LOG_RATIO), MASK, p["kl_estimator"])
    values = VALUES if p["needs_critic"] else None
    adv, _ = advantages_from_config(cfg, SCORES, MASK, kl=kl, values=values)
    torch.testing.assert_close(adv, torch.tensor(ref_advantages(p)), atol=1e-5, rtol=1e-5)


def test_the_cases_cover_every_estimator_and_refuse_what_has_no_effect(capsys):
    ids = [c.id for c in cases()]
    assert len(ids) == len(ESTIMATORS) * len(KL_MODES) * len(NORM_MODES)
    for argv, why in (([*BASE, "--advantage_estimator", "group_norm", "--no_advantage_std_norm"], "has no effect"),
                      ([*BASE, "--advantage_estimator", "rloo", "--rloo_whiten", "off", "--no_advantage_std_norm"],
                       "--rloo_whiten off"),
                      ([*BASE, "--advantage_estimator", "gae", "--rloo_whiten", "off"], "only applies to"),
                      ([*BASE, "--advantage_estimator", "rloo", "--init_kl_coef", "0", "--kl_estimator", "k3"],
                       "--kl_estimator k3 is only used with a reference model")):
        with pytest.raises(ConfigError, match=why):
            parse_args(argv)


# --- the policy loss: KL loss estimator and clip flags ---------------------------------------------------------------
CLIP_MODES = {
    "eps-default": [],
    "eps-0.1": ["--eps_clip", "0.1"],
    "low-high": ["--eps_clip_low_high", "0.1", "0.3"],
    "dual": ["--dual_clip", "2.5"],
    "low-high-dual": ["--eps_clip_low_high", "0.15", "0.28", "--dual_clip", "3"],
}
LOGP = torch.tensor([[0.0, -1.0, -0.3], [-0.2, -2.0, 0.0], [-1.2, 0.0, 0.0], [0.1, -0.5, -0.4],
                     [-0.7, -0.1, 0.0], [-0.9, -1.4, -0.2]])  # fmt: skip
OLD_LOGP = LOGP - torch.tensor([[0.9, -0.6, 0.05], [0.3, -1.5, 0.0], [0.7, 0.0, 0.0], [-0.2, 1.2, 0.0],
                                [0.1, -0.25, 0.0], [-0.05, 0.4, 1.0]])  # ratios well inside and outside the clips
ADV = torch.tensor([[1.0, -1.0, 0.5], [-2.0, 1.5, 0.0], [1.0, 0.0, 0.0], [-0.5, -1.0, 2.0],
                    [0.3, -0.7, 0.0], [-1.0, 1.0, -1.0]])  # fmt: skip


def ref_policy_loss(p: dict) -> tuple[float, float]:
    low, high = p["eps_clip_low_high"] or (p["eps_clip"], p["eps_clip"])
    total, kl_total, count = 0.0, 0.0, 0
    for b in range(LOGP.size(0)):
        for t in range(int(MASK[b].sum())):
            ratio = math.exp(LOGP[b, t].item() - OLD_LOGP[b, t].item())
            a = ADV[b, t].item()
            obj = min(ratio * a, min(max(ratio, 1 - low), 1 + high) * a)
            if p["dual_clip"] is not None and a < 0:
                obj = max(obj, p["dual_clip"] * a)
            total -= obj
            kl_total += ref_kl(p["kl_estimator"], LOG_RATIO[b, t].item())
            count += 1
    kl_loss = kl_total / count if p["use_kl_loss"] and p["init_kl_coef"] > 0 else 0.0
    return total / count + p["init_kl_coef"] * kl_loss, kl_loss


def loss_cases():
    for (kl_name, kl_flags), (clip_name, clip_flags) in itertools.product(KL_MODES.items(), CLIP_MODES.items()):
        yield pytest.param([*BASE, "--advantage_estimator", "group_norm", *kl_flags, *clip_flags],
                           id=f"{kl_name}-{clip_name}")


@pytest.mark.parametrize("argv", list(loss_cases()))
def test_policy_loss_follows_the_printed_flags(argv, capsys):
    p = printed_config(argv, capsys)
    objective = PolicyObjective.from_config(parse_args(argv))  # what the loop hands to every policy rank
    ref_logp = LOGP - LOG_RATIO  # log(pi / ref) = LOG_RATIO
    total, metrics = policy_objective(LOGP, OLD_LOGP, ADV, MASK, ref_logp, objective)
    want_total, want_kl = ref_policy_loss(p)
    assert total.item() == pytest.approx(want_total, abs=1e-5)
    if p["use_kl_loss"]:
        assert metrics["loss/kl"].item() == pytest.approx(want_kl, abs=1e-6)
    else:
        assert "loss/kl" not in metrics
