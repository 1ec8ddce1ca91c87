"""Issue 16's acceptance, worker side: a real policy rank (``ModelWorker`` on DeepSpeed ZeRO-3, one gloo
rank, a tiny model) trains on a micro-batch with the objective the loop builds from each KL / clip flag
combination, and the loss it reports is the loss the ``--print-config`` output describes.

The worker's ``train_policy`` computes its own log-probs, so the reference here starts from the same
weights' log-probs (``batch_logprobs``) and steps at learning rate 0 (the weights never move). Before issue
16 the worker computed the KL loss with k3 whatever ``--kl_estimator`` said: the k1 / k2 cases fail there.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.conftest import free_port

pytestmark = pytest.mark.integration

BASE = ["--pretrain", "/m", "--prompt_data", "/d.jsonl", "--reward_fn", "pkg.mod:fn", "--rollout_backend", "hf",
        "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1", "--rollout_batch_size", "2",
        "--n_samples_per_prompt", "2", "--micro_rollout_batch_size", "2", "--train_batch_size", "4",
        "--micro_train_batch_size", "4", "--advantage_estimator", "group_norm"]  # fmt: skip
KL = {"k1-loss": ["--init_kl_coef", "0.4", "--kl_estimator", "k1", "--use_kl_loss"],
      "k2-loss": ["--init_kl_coef", "0.4", "--kl_estimator", "k2", "--use_kl_loss"],
      "k3-loss": ["--init_kl_coef", "0.4", "--kl_estimator", "k3", "--use_kl_loss"],
      "k2-reward": ["--init_kl_coef", "0.4", "--kl_estimator", "k2"],
      "off": ["--init_kl_coef", "0"]}  # fmt: skip
CLIP = {"default": [], "low-high": ["--eps_clip_low_high", "0.1", "0.3"],
        "dual": ["--eps_clip", "0.15", "--dual_clip", "2"]}  # fmt: skip
CASES = {f"{k}/{c}": [*BASE, *kf, *cf] for (k, kf), (c, cf) in itertools.product(KL.items(), CLIP.items())}

MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
SHIFT = torch.tensor([[0.8, -0.5, 0.1, 0.0], [-0.9, 0.3, 0.05, 0.0], [0.4, -0.2, 0.0, 0.0],
                      [0.0, 0.6, -0.7, 0.25]])  # logp - old_logp: ratios inside and beyond the clips
LOG_RATIO = torch.tensor([[0.3, -0.4, 0.2, 0.1], [0.5, 0.0, -0.6, 0.0], [-0.2, 0.7, 0.0, 0.0],
                          [0.1, 0.1, -0.3, 0.9]])  # log(pi / ref)
ADV = torch.tensor([[1.0, -1.0, 0.5, -0.3], [-2.0, 1.5, 0.7, 0.0], [1.0, -0.4, 0.0, 0.0],
                    [-0.5, -1.0, 2.0, 1.0]])  # fmt: skip



def _child(rank: int, model: str, port: int, out: str) -> None:
    from trainer import train_ppo_ray
    from trainer.config.cli import parse_args
    from trainer.learn.losses import PolicyObjective
    from trainer.learn.model_worker import ModelWorker

    worker = ModelWorker(0, 1)
    worker.init_process_group("127.0.0.1", port, "gloo")
    worker.init_model(model, zero_stage=3, micro_batch=4, grad_accum=1, learning_rate=1e-3)
    torch.manual_seed(0)
    ids = torch.randint(5, 60, (4, 9))
    mb = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "action_mask": MASK}
    logp = worker.batch_logprobs(mb)
    results = {}
    for name, argv in CASES.items():
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            assert train_ppo_ray.main([*argv, "--print-config"]) == 0
        objective = PolicyObjective.from_config(parse_args(argv))  # as trainer.loop.Trainer.train builds it
        batch = dict(mb, old_logprobs=logp - SHIFT, ref_logprobs=logp - LOG_RATIO, advantages=ADV)
        metrics = worker.train_policy([batch], objective, lr=0.0)  # lr 0: the weights stay as they are
        results[name] = {"printed": json.loads(text.getvalue()), "metrics": metrics}
    # --old_logprobs train: no old log-probs in the batch, the forward's own stand in; against the same step
    # with the policy's own log-probs passed in (what make_experience's forward gives): same loss, same gradient.
    # The first step also measures the engines' log-probs (here the policy's shifted by SHIFT) against its forward
    plain = dict(mb, advantages=ADV, rollout_logprobs=logp - SHIFT)
    results["_train"] = worker.train_policy([plain], PolicyObjective(old_logprobs="train"), lr=0.0,
                                            measure_mismatch=True)
    results["_policy"] = worker.train_policy([dict(plain, old_logprobs=logp)], PolicyObjective(), lr=0.0)
    after = worker.batch_logprobs(mb)
    results["_unchanged"] = bool(torch.allclose(after, logp, atol=1e-6))
    Path(out).write_text(json.dumps(results))


def _reference(p: dict) -> dict[str, float]:
    """The loss and its parts as the printed flags describe them (token means over valid tokens)."""
    low, high = p["eps_clip_low_high"] or (p["eps_clip"], p["eps_clip"])
    kl_fn = {"k1": lambda d: d, "k2": lambda d: d * d / 2,
             "k3": lambda d: min(10.0, max(-10.0, math.exp(-d) - 1 + d))}[p["kl_estimator"]]  # fmt: skip
    surrogate, kl, clipped, n = 0.0, 0.0, 0, 0
    for b, t in itertools.product(range(4), range(4)):
        if not MASK[b, t]:
            continue
        ratio, a = math.exp(SHIFT[b, t].item()), ADV[b, t].item()
        obj = min(ratio * a, min(max(ratio, 1 - low), 1 + high) * a)
        clipped += min(max(ratio, 1 - low), 1 + high) * a < ratio * a
        if p["dual_clip"] is not None and a < 0:
            obj = max(obj, p["dual_clip"] * a)
        surrogate -= obj
        kl += kl_fn(LOG_RATIO[b, t].item())
        n += 1
    out = {"loss/policy": surrogate / n, "policy/clip_frac": clipped / n}
    if p["use_kl_loss"] and p["init_kl_coef"] > 0:
        out["loss/kl"] = kl / n
    return out


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
    from trainer.tiny import make_model

    tmp = tmp_path_factory.mktemp("objective")
    make_model(tmp / "model", hidden_size=32, num_layers=1, num_heads=2)
    out = tmp / "results.json"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    mp.start_processes(_child, args=(str(tmp / "model"), free_port(), str(out)), nprocs=1, join=True,
                       start_method="spawn")
    return json.loads(out.read_text())


def test_weights_did_not_move(worker_results):
    assert worker_results["_unchanged"] is True


@pytest.mark.parametrize("case", list(CASES))
def test_worker_computes_the_printed_objective(worker_results, case):
    printed, metrics = worker_results[case]["printed"], worker_results[case]["metrics"]
    want = _reference(printed)
    for key, value in want.items():
        assert metrics[key] == pytest.approx(value, abs=1e-5), (key, printed["kl_estimator"])
    assert ("loss/kl" in metrics) == ("loss/kl" in want)
    assert ("policy/dual_clip_frac" in metrics) == (printed["dual_clip"] is not None)


def test_old_logprobs_from_the_train_forward_give_the_same_step(worker_results):
    """--old_logprobs train on a real ZeRO-3 rank: the loss and the gradient norm of the step that takes the old
    log-probs from its own forward are those of the step given the policy's log-probs, and its first forward
    measures the engines' mismatch (|SHIFT| on the valid tokens)."""
    train, policy = worker_results["_train"], worker_results["_policy"]
    valid = MASK.bool()
    assert train["policy/grad_norm"] > 0
    assert train["policy/grad_norm"] == pytest.approx(policy["policy/grad_norm"], rel=1e-4)
    assert train["loss/policy"] == pytest.approx(policy["loss/policy"], abs=1e-5)
    assert train["loss/policy"] == pytest.approx(-ADV[valid].mean().item(), abs=1e-5)
    assert train["policy/clip_frac"] == 0.0
    assert train["rollout/logprob_mismatch"] == pytest.approx(SHIFT[valid].abs().mean().item(), abs=1e-5)
    assert train["rollout/logprob_mismatch_max"] == pytest.approx(SHIFT[valid].abs().max().item(), abs=1e-5)
    assert "rollout/logprob_mismatch" not in policy
