"""Off-policy correction, the mismatch metric, dynamic sampling and the async producer (trainer.learn.losses,
trainer.rollout.producer), without Ray: hand-computed tensors, OpenRLHF 0.11's formula written out independently,
and the parts a producer is handed, faked: engines that record when they generate, a score, a weight push."""

from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from trainer.learn.losses import PolicyObjective, is_correction_weights, policy_objective, rollout_mismatch
from trainer.reward.client import RewardBatch
from trainer.rollout.producer import AsyncRollouts, SyncRollouts, informative

LN = math.log


# --- importance-sampling correction: hand-computed ----------------------------------------------------------
def _pair():
    # ratios r = exp(old - rollout): 0.25, 1.0, 2.0, 8.0 on row 0; row 1: 1.5, 0.4, and two padded columns
    rollout = torch.zeros(2, 4)
    old = torch.tensor([[LN(0.25), 0.0, LN(2.0), LN(8.0)], [LN(1.5), LN(0.4), 5.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    return old, rollout, mask


def test_tis_clamps_each_tokens_ratio_to_the_band():
    old, rollout, mask = _pair()
    w, filtered = is_correction_weights(old, rollout, mask, "tis", 0.5, 5.0)
    expected = torch.tensor([[0.5, 1.0, 2.0, 5.0], [1.5, 0.5, 0.0, 0.0]])
    assert torch.allclose(w, expected, atol=1e-6)
    assert filtered.item() == pytest.approx(3 / 6)  # 0.25 and 8.0 on row 0, 0.4 on row 1


def test_icepop_drops_tokens_outside_the_band_and_keeps_the_ratio_inside():
    old, rollout, mask = _pair()
    w, filtered = is_correction_weights(old, rollout, mask, "icepop", 0.5, 5.0)
    expected = torch.tensor([[0.0, 1.0, 2.0, 0.0], [1.5, 0.0, 0.0, 0.0]])
    assert torch.allclose(w, expected, atol=1e-6)
    assert filtered.item() == pytest.approx(3 / 6)


def test_seq_mask_tis_drops_a_sequence_whose_geometric_mean_ratio_is_outside():
    old, rollout, mask = _pair()
    # row 0: mean log-ratio (ln .25 + 0 + ln 2 + ln 8) / 4 = ln(4) / 4 -> 1.414 (kept); row 1: sqrt(1.5 * .4) = .775
    w, filtered = is_correction_weights(old, rollout, mask, "seq-mask-tis", 0.8, 5.0)
    assert torch.allclose(w[0], torch.tensor([0.25, 1.0, 2.0, 8.0]), atol=1e-6)
    assert torch.equal(w[1], torch.zeros(4))
    assert filtered.item() == pytest.approx(0.5)


def test_a_large_mismatch_is_clipped_exactly_as_the_formula_says_in_the_loss():
    """One token with r = 8 (the engine sampled it at 1/8 the trainer's probability... inverted: the trainer
    gives it 8x the engine's): with TIS at 5 its term weighs 5, not 8; with none, 1."""
    old = torch.tensor([[LN(0.5) + LN(8.0)]])
    rollout = torch.tensor([[LN(0.5)]])
    logp = old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0]])
    mask = torch.ones(1, 1)
    base, _ = policy_objective(logp, old, adv, mask, None, PolicyObjective())
    tis, metrics = policy_objective(logp, old, adv, mask, None, PolicyObjective(is_correction="tis", is_high=5.0),
                                    rollout)
    assert base.item() == pytest.approx(-1.0)  # ratio logp/old = 1: -min(1 * A, clip(1) * A)
    assert tis.item() == pytest.approx(-5.0)  # the same term weighed by clamp(8, 0.5, 5) = 5
    assert metrics["policy/is_filtered"].item() == 1.0 and metrics["policy/is_weight"].item() == pytest.approx(5.0)
    with pytest.raises(ValueError, match="no rollout log-probs"):
        policy_objective(logp, old, adv, mask, None, PolicyObjective(is_correction="tis"))


# --- against OpenRLHF 0.11's PolicyLoss, written out from its description -----------------------------------
def _openrlhf_like(log_probs, old_log_probs, advantages, mask, rollout_log_probs, level, mode, low, high, eps=0.2):
    """OpenRLHF 0.11 PolicyLoss with is_correction (level token|seq, mode clip|mask, gating ratio): the PPO
    token loss times a coefficient from r = exp(old - rollout); token-level mean over the mask."""
    ratio = (log_probs - old_log_probs).clamp(-20, 20).exp()
    loss = -torch.min(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages)
    is_log = (old_log_probs - rollout_log_probs)
    tok = is_log.exp()
    stat = ((is_log * mask).sum(-1) / mask.sum(-1)).unsqueeze(-1).exp() if level == "seq" else tok
    if mode == "clip":
        coef = stat.clamp(min=low, max=high)
    else:
        coef = torch.where((stat >= low) & (stat <= high), tok, torch.zeros_like(tok))
    loss = coef * loss
    return (loss * mask).sum() / mask.sum()


@pytest.mark.parametrize(("ours", "level", "mode"), [("tis", "token", "clip"), ("icepop", "token", "mask"),
                                                     ("seq-mask-tis", "seq", "mask")])
def test_the_loss_equals_openrlhfs_on_random_batches(ours, level, mode):
    g = torch.Generator().manual_seed(7)
    for _ in range(20):
        b, r = 6, 9
        rollout = -torch.rand(b, r, generator=g) * 3
        old = rollout + torch.randn(b, r, generator=g) * 0.8  # ratios spread over the band and beyond
        logp = old + torch.randn(b, r, generator=g) * 0.1
        adv = torch.randn(b, r, generator=g)
        mask = (torch.rand(b, r, generator=g) > 0.2).float()
        mask[:, 0] = 1
        low, high = 0.6, 1.8
        got, _ = policy_objective(logp, old, adv, mask, None, PolicyObjective(is_correction=ours, is_low=low,
                                                                             is_high=high), rollout)
        want = _openrlhf_like(logp, old, adv, mask, rollout, level, mode, low, high)
        assert got.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)


def test_mismatch_metric_is_zero_when_the_engine_agrees_and_k3_otherwise():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    same = torch.tensor([[-1.0, -2.0, -9.0]])
    assert rollout_mismatch(same, same, mask) == {"rollout/logprob_mismatch": 0.0,
                                                  "rollout/logprob_mismatch_max": 0.0, "rollout/logprob_kl": 0.0}
    policy = torch.tensor([[-1.0, -1.5, 0.0]])
    m = rollout_mismatch(policy, same, mask)
    assert m["rollout/logprob_mismatch"] == pytest.approx(0.25)  # (0 + 0.5) / 2: the padded column is out
    assert m["rollout/logprob_mismatch_max"] == pytest.approx(0.5)
    assert m["rollout/logprob_kl"] == pytest.approx((math.exp(0.5) - 1 - 0.5) / 2)


# --- dynamic sampling ---------------------------------------------------------------------------------------
def test_informative_groups_have_varied_rewards_inside_the_range():
    rewards = [1, 0, 1, 0, 0, 0, 1, 1, 1, 0.5, 0.5, 0.5]  # n = 3: varied, all 0, all 1, all 0.5
    assert informative(rewards, 3, 0.0, 1.0) == [True, False, False, False]
    assert informative([0.2, 0.4], 2, 0.0, 0.25) == [False]  # mean 0.3 outside (0, 0.25)
    with pytest.raises(ValueError, match="not groups of n_samples_per_prompt=3"):
        informative([1, 0], 3, 0, 1)


class FakeJob:
    """What a rollout producer is handed (trainer.rollout.producer): the config, a sampler of prompts whose label
    says how their samples score ("const": every sample 1.0; otherwise sample k scores k % 2), engines that record
    each generate (this object stands for them: ``generate``, ``wait_ready``, ``restarts``), a score and a push."""

    def __init__(self, labels, batch=4, n=2, dynamic=True, rounds=4, gen_s=0.0):
        from trainer.data import Prompt, PromptSampler

        self.cfg = SimpleNamespace(n_samples_per_prompt=n, rollout_batch_size=batch, seed=10, dynamic_filtering=dynamic,
                                   dynamic_filtering_max_rounds=rounds, dynamic_filtering_reward_range=(0.0, 1.0),
                                   multi_turn=False, skip_rollout_logprobs=False)
        self.prompts = [Prompt(f"p{i}", label, i) for i, label in enumerate(labels)]
        self.sampler = PromptSampler(self.prompts, batch, seed=0)
        self.generated = []  # (seed, texts, time)
        self.gen_s = gen_s
        self.restarts = SimpleNamespace(total=0)  # engines/restarts
        self.pushes = []  # (thread name, time)

    def rollouts(self, cls=SyncRollouts, push=None, **kw):
        """A producer of ``cls`` made of these parts (``push``: the weight push, default :meth:`push`)."""
        return cls(self.cfg, self.sampler, self, self.score, push or self.push, **kw)

    def wait_ready(self):
        pass

    def generate(self, texts, *, seed, logprobs=False, restore=None):
        time.sleep(self.gen_s)
        self.generated.append((seed, list(texts), time.monotonic()))
        n = self.cfg.n_samples_per_prompt
        return [SimpleNamespace(prompt=t, response=f"{t}/{k}") for t in texts for k in range(n)]

    def push(self):
        self.pushes.append((threading.current_thread().name, time.monotonic()))
        return 0

    def score(self, prompts, samples):
        n = self.cfg.n_samples_per_prompt
        out = []
        for p in prompts:
            out += [1.0] * n if p.label == "const" else [float(k % 2) for k in range(n)]
        return RewardBatch(out, {"accuracy": sum(out) / len(out)})


def test_dynamic_sampling_keeps_only_informative_groups_and_draws_more_prompts():
    """Half the groups score all alike: the batch still holds 4 prompts, every one informative, and the
    filtered share is what was dropped."""
    trainer = FakeJob(["const", "x"] * 8)
    r = trainer.rollouts().collect(step=1)
    assert len(r.prompts) == 4 and all(p.label == "x" for p in r.prompts)
    assert len(r.samples) == 8 and r.rewards.rewards == [0.0, 1.0] * 4
    assert informative(r.rewards.rewards, 2, 0.0, 1.0) == [True] * 4
    assert r.metrics["dynamic_filtering/filtered_share"] == pytest.approx(0.5)
    assert r.metrics["dynamic_filtering/rounds"] == 2 and r.metrics["dynamic_filtering/short"] == 0
    assert [seed for seed, _, _ in trainer.generated] == [11, 11 + 100_003]  # a fresh seed per round


def test_dynamic_sampling_stops_at_its_bound_and_says_the_batch_is_short():
    trainer = FakeJob(["const"] * 7 + ["x"], rounds=2)
    r = trainer.rollouts().collect(step=3)
    assert len(r.prompts) == 1 and r.metrics["dynamic_filtering/short"] == 1.0
    assert len(trainer.generated) == 2
    with pytest.raises(RuntimeError, match="dynamic filtering kept no prompt of 8 in 2 rollouts"):
        FakeJob(["const"] * 8, rounds=2).rollouts().collect(step=1)


def test_without_dynamic_sampling_every_prompt_is_kept():
    trainer = FakeJob(["const", "x"] * 4, dynamic=False)
    r = trainer.rollouts(SyncRollouts).next(1)
    assert len(r.prompts) == 4 and "dynamic_filtering/filtered_share" not in r.metrics
    assert r.sampler_state == trainer.sampler.state_dict()


# --- the async producer ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("staleness", [1, 2])
def test_the_producer_never_runs_more_than_max_staleness_versions_ahead(staleness):
    trainer = FakeJob(["x"] * 40, dynamic=False, gen_s=0.02)
    rollouts = trainer.rollouts(AsyncRollouts, push=lambda: 0, max_staleness=staleness).start(first_step=1,
                                                                                                last_step=6)
    seen = []
    try:
        for step in range(1, 7):
            r = rollouts.next(step)
            seen.append(r.metrics["async/staleness"])
            # "training" until the producer has made every batch it may make with the weights it holds ...
            ahead = min(step + staleness, 6)
            end = time.monotonic() + 20
            while len(trainer.generated) < ahead and time.monotonic() < end:
                time.sleep(0.01)
            time.sleep(0.1)
            # ... and not one more: batch step + staleness + 1 needs the weights this step is about to push
            assert len(trainer.generated) == ahead, (step, len(trainer.generated))
            rollouts.push()
    finally:
        rollouts.close()
    assert seen == [float(min(j - 1, staleness)) for j in range(1, 7)]
    assert [seed for seed, _, _ in trainer.generated] == [10 + j for j in range(1, 7)]


def test_a_push_waits_for_the_batch_being_generated_and_the_producer_for_the_push():
    trainer = FakeJob(["x"] * 40, dynamic=False, gen_s=0.5)
    started = threading.Event()
    generate = trainer.generate

    def marked(texts, seed, **kw):
        if seed == 12:  # batch 2
            started.set()
        return generate(texts, seed=seed, **kw)

    trainer.generate = marked
    pushed = []
    rollouts = trainer.rollouts(AsyncRollouts, push=lambda: pushed.append(time.monotonic()) or 0,
                                max_staleness=1).start(first_step=1, last_step=3)
    try:
        rollouts.next(1)  # batch 1 made; the producer starts batch 2 at once (version 0 is recent enough)
        assert started.wait(20)
        rollouts.push()  # while batch 2 is being generated
        r2 = rollouts.next(2)
        r3 = rollouts.next(3)
    finally:
        rollouts.close()
    gen2_end = trainer.generated[1][2]
    assert pushed[0] >= gen2_end  # the push came after batch 2's generation ended, not in its middle
    assert rollouts.push_wait > 0.1  # it waited for the generation's rest (0.5 s in all)
    assert (r2.version, r3.version) == (0, 1)  # batch 3 was generated after the push, with version 1
    assert trainer.generated[2][2] >= pushed[0]


def test_a_failed_generation_ends_the_step_with_its_error():
    trainer = FakeJob(["x"] * 8, dynamic=False)

    def broken(texts, seed, **kw):
        raise ConnectionError("engine 0 is gone")

    trainer.generate = broken
    rollouts = trainer.rollouts(AsyncRollouts, max_staleness=1).start(first_step=1, last_step=2)
    try:
        with pytest.raises(RuntimeError, match="the rollout producer failed: ConnectionError: engine 0 is gone"):
            rollouts.next(1)
    finally:
        rollouts.close()
    assert not any(t.name == "rollout-producer" and t.is_alive() for t in threading.enumerate())


# --- a replaced engine mid-batch (issue 31) ---------------------------------------------------------------------
class ReplacingJob(FakeJob):
    """Batch ``replace_at`` (its seed) loses an engine on its first try: as trainer.rollout.engines does, the engines
    call the ``restore`` the producer handed them for the replacement's weights before the batch goes on; pushes are
    recorded with the thread that made them."""

    def __init__(self, replace_at, **kw):
        super().__init__(["x"] * 40, dynamic=False, **kw)
        self.replace_at, self.replaced = replace_at, False

    def generate(self, texts, *, seed, logprobs=False, restore=None):
        out = super().generate(texts, seed=seed, logprobs=logprobs)
        if seed == self.replace_at and not self.replaced:
            self.replaced = True
            restore()
        return out


def test_a_replacement_while_the_trainer_waits_gets_the_weights_from_the_producer():
    """The trainer waits for batch 1 (its policy idle, holding version 0): the producer pushes to the replacement
    itself, and the batch goes on with the version it started with."""
    trainer = ReplacingJob(replace_at=11)
    rollouts = trainer.rollouts(AsyncRollouts, max_staleness=1).start(first_step=1, last_step=2)
    try:
        r1 = rollouts.next(1)
    finally:
        rollouts.close()
    assert [name for name, _ in trainer.pushes] == ["rollout-producer"]
    assert r1.version == 0 and [seed for seed, _, _ in trainer.generated][:1] == [11]


def test_a_replacement_while_the_policy_trains_waits_for_the_push_and_makes_the_batch_again():
    """Batch 2 is made while the policy trains step 1: the producer must not push (the policy is changing), so it
    waits for the trainer's push, which reaches the replacement too; then batch 2 is drawn again (the same
    prompts) and generated whole with version 1, not half with version 0."""
    trainer = ReplacingJob(replace_at=12, gen_s=0.05)
    rollouts = trainer.rollouts(AsyncRollouts, max_staleness=1).start(first_step=1, last_step=2)
    try:
        rollouts.next(1)
        end = time.monotonic() + 20  # "training" step 1 until batch 2 has lost its engine
        while not trainer.replaced and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep(0.2)
        assert trainer.pushes == []  # the producer waits: it does not push into a policy that trains
        rollouts.push()  # trainer.push, as the producer was handed it
        r2 = rollouts.next(2)
    finally:
        rollouts.close()
    assert [name for name, _ in trainer.pushes] == ["MainThread"]
    assert r2.version == 1 and r2.metrics["async/staleness"] == 0.0
    first, again = trainer.generated[1], trainer.generated[2]
    assert (first[0], again[0]) == (12, 12) and first[1] == again[1]  # the same prompts, the same seed
    assert again[2] >= trainer.pushes[0][1]  # generated after the push
    assert [p.text for p in r2.prompts] == again[1]


def test_old_logprobs_from_the_train_forward_give_the_plain_policy_gradient():
    """--old_logprobs train: no old log-probs in the batch; the forward's own, detached, are the old ones, so the
    ratio is 1 (nothing clipped) and the gradient is sum(A * grad logp) / tokens, as with the policy's own
    log-probs passed in. The TIS weights then compare that forward with the engines'."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 5, generator=gen, requires_grad=True)
    adv = torch.randn(3, 5, generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float32)
    rollout = logits.detach() + 0.3 * torch.randn(3, 5, generator=gen)
    grads = {}
    for name, old, objective in (("policy", logits.detach().clone(), PolicyObjective()),
                                 ("train", None, PolicyObjective(old_logprobs="train"))):
        logits.grad = None
        loss, metrics = policy_objective(logits * 1.0, old, adv, mask, None, objective)
        loss.backward()
        grads[name] = logits.grad.clone()
        assert metrics["policy/clip_frac"].item() == 0.0
        assert loss.item() == pytest.approx(-(adv * mask).sum().item() / mask.sum().item(), rel=1e-6)
    torch.testing.assert_close(grads["train"], grads["policy"])
    torch.testing.assert_close(grads["train"], -adv * mask / mask.sum())
    _, tis = policy_objective(logits * 1.0, None, adv, mask, None,
                              PolicyObjective(old_logprobs="train", is_correction="tis", is_high=1.2), rollout)
    want = torch.exp(logits.detach() - rollout).clamp(0.5, 1.2)
    assert tis["policy/is_weight"].item() == pytest.approx((want * mask).sum().item() / mask.sum().item(), rel=1e-5)


def test_old_logprobs_missing_or_doubled_is_an_error():
    logp, mask = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="no old log-probs .*--old_logprobs policy"):
        policy_objective(logp, None, mask, mask, None, PolicyObjective())
    with pytest.raises(ValueError, match="--old_logprobs train.*brings its own"):
        policy_objective(logp, logp, mask, mask, None, PolicyObjective(old_logprobs="train"))
    with pytest.raises(ValueError, match="unknown old log-probs source 'engine'"):
        PolicyObjective(old_logprobs="engine")
