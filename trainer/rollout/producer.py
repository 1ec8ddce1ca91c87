"""Where a step's rollout comes from: generated now (:class:`SyncRollouts`), or ahead of training on engines of
their own (:class:`AsyncRollouts`, ``--async_train``). Both draw prompts, generate, score and (with
``--dynamic_filtering``) keep only informative prompts through one function, :func:`collect`; the step takes
a :class:`Rollout` with :meth:`next` and hands the new weights over with :meth:`push`.

**Async** (one-step-off and beyond): a producer thread in the driver generates batch ``j`` once the engines
hold a policy at most ``--max_staleness`` versions older than the one that will train on it (batch ``j``
trains at version ``j - 1``; it may be generated with version ``v >= j - 1 - max_staleness``). With the default
1, batch ``j + 1`` is generated while the policy trains on batch ``j``. Weights are pushed between two batches:
:meth:`AsyncRollouts.push` waits for the batch being generated to end, the engines are idle only for the push
itself, and no sample mixes two policy versions (no partial rollouts). ``async/staleness`` logs how old each
batch's policy was; the engines' log-probs of their samples (``Sample.logprobs``) let ``--is_correction``
correct for it.

**Dynamic sampling** (DAPO; ``--dynamic_filtering``): a prompt whose samples all score alike (or whose mean
reward lies outside ``--dynamic_filtering_reward_range``) carries no gradient; it is dropped and more prompts
are drawn until the batch holds ``--rollout_batch_size`` informative ones, at most
``--dynamic_filtering_max_rounds`` rollouts; ``dynamic_filtering/*`` says how many were dropped.

**Engine faults** (:mod:`trainer.rollout.engines`): an engine that dies or hangs while it generates is replaced and its
share generated again with the same seeds; first the replacement needs the weights the other engines hold.
The step hands the engines a ``restore`` for that (:meth:`SyncRollouts.restore`: push now, the policy holds
exactly those weights). In async mode the policy may be training the next version meanwhile, so the producer
waits (:meth:`AsyncRollouts.restore`): for the trainer to be idle (waiting for this batch: the producer
pushes, the trainer waits) or for the trainer's own next push, which reaches the replacement too; then the
engines hold a newer version than the batch's first shares, and the batch is drawn and generated again,
whole, with it (:class:`WeightsMoved`). ``engines/restarts`` logs the job's replacements so far.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.reward.client import RewardBatch


@dataclass
class Rollout:
    """One step's prompts, their samples (prompt-major) and rewards, and what making them measured."""

    prompts: list[Any]
    samples: list[Any]
    rewards: Any  # RewardBatch: .rewards, .extra_logs
    metrics: dict[str, float] = field(default_factory=dict)
    tool_stats: list[dict[str, float]] = field(default_factory=list)
    sampler_state: dict[str, Any] | None = None  # the sampler after this batch was drawn (checkpoints)
    version: int = 0  # the policy version the engines held while generating it


def informative(rewards: Sequence[float], n: int, low: float, high: float) -> list[bool]:
    """Per prompt (``n`` consecutive rewards each): whether its group carries a gradient, i.e. its samples do
    not all score alike and ``low < mean < high`` (OpenRLHF's range test; with 0/1 rewards and the default
    (0, 1) both say the same)."""
    if n < 1 or len(rewards) % n:
        raise ValueError(f"{len(rewards)} rewards are not groups of n_samples_per_prompt={n}")
    keep = []
    for g in range(len(rewards) // n):
        group = [float(r) for r in rewards[g * n:(g + 1) * n]]
        mean = sum(group) / n
        keep.append(low < mean < high and max(group) - min(group) > 1e-12)
    return keep


def collect(trainer: Any, step: int) -> Rollout:
    """Draw, generate and score the rollout of ``step`` (1-based; its seed is ``--seed + step``), keeping only
    informative prompts with ``--dynamic_filtering``."""
    cfg = trainer.cfg
    n = cfg.n_samples_per_prompt
    want = cfg.rollout_batch_size
    rounds = cfg.dynamic_filtering_max_rounds if cfg.dynamic_filtering else 1
    prompts: list[Any] = []
    samples: list[Any] = []
    rewards: list[float] = []
    logs: dict[str, list[float]] = {}
    tool_stats: list[dict[str, float]] = []
    drawn = dropped = 0
    t_gen = t_score = 0.0
    for r in range(rounds):
        batch = trainer.sampler.next_batch()
        t0 = time.perf_counter()
        got, stats = trainer.generate_batch([p.text for p in batch], seed=cfg.seed + step + 100_003 * r)
        t1 = time.perf_counter()
        scored = trainer.score(batch, got)
        t_score += time.perf_counter() - t1
        t_gen += t1 - t0
        tool_stats += stats
        for key, value in scored.extra_logs.items():
            logs.setdefault(key, []).append(value)
        drawn += len(batch)
        keep = (informative(scored.rewards, n, *cfg.dynamic_filtering_reward_range) if cfg.dynamic_filtering
                else [True] * len(batch))
        for g, ok in enumerate(keep):
            if not ok:
                dropped += 1
                continue
            if len(prompts) < want:
                prompts.append(batch[g])
                samples += got[g * n:(g + 1) * n]
                rewards += scored.rewards[g * n:(g + 1) * n]
        if len(prompts) >= want:
            break
    metrics = {"timing/generate": t_gen, "timing/score": t_score, "rollout/samples": float(len(samples)),
               "engines/restarts": float(trainer.engines.restarts.total)}
    if cfg.dynamic_filtering:
        metrics.update({"dynamic_filtering/filtered_share": dropped / max(drawn, 1),
                        "dynamic_filtering/rounds": float(r + 1),
                        "dynamic_filtering/kept_prompts": float(len(prompts)),
                        "dynamic_filtering/short": float(len(prompts) < want)})
        if not prompts:
            raise RuntimeError(f"dynamic filtering kept no prompt of {drawn} in {r + 1} rollouts (every group "
                               f"scored alike or outside --dynamic_filtering_reward_range "
                               f"{cfg.dynamic_filtering_reward_range}): nothing to train on")
    extra = {k: sum(v) / len(v) for k, v in logs.items()}
    return Rollout(prompts, samples, RewardBatch(rewards, extra), metrics, tool_stats, trainer.sampler.state_dict())


class WeightsMoved(Exception):  # noqa: N818 - a signal to generate the batch again, not an error
    """Async: while a replacement engine waited for its weights the trainer pushed a newer version to every
    engine; the batch in the making is drawn and generated again, whole, with that version."""


class SyncRollouts:
    """Generate, then train: the rollout of step ``j`` is made when the step asks for it."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def next(self, step: int) -> Rollout:
        rollout = collect(self.trainer, step)
        rollout.version = step - 1
        return rollout

    def push(self, push: Callable[[], int]) -> int:
        return push()

    def exclusive(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` on the engines (an evaluation): nothing else generates meanwhile."""
        return work()

    def restore(self, push: Callable[[], Any]) -> None:
        """Replacement engines need the weights the others hold: the policy's (nothing trains meanwhile)."""
        push()

    def close(self) -> None:
        pass


class AsyncRollouts:
    """Rollouts made ahead of training by a producer thread (see the module docstring)."""

    def __init__(self, trainer: Any, first_step: int, last_step: int, max_staleness: int) -> None:
        self.trainer = trainer
        self.max_staleness = max_staleness
        self.last_step = last_step
        self.version = first_step - 1  # the engines hold the weights trained by the steps before first_step
        self.cond = threading.Condition()
        self.generating = False  # the producer is generating a batch
        self.pushing = False  # the trainer is pushing weights (or evaluating): the engines are its
        self.waiting = False  # the trainer waits for a batch: the policy is idle and holds `version`
        self.repairing = False  # the producer pushes weights to replacement engines: the trainer waits
        self.stopped = False
        self.out: deque[Rollout | BaseException] = deque()
        self.push_wait = 0.0
        self.thread = threading.Thread(target=self._produce, args=(first_step,), name="rollout-producer",
                                       daemon=True)

    def start(self) -> AsyncRollouts:
        """Start the producer. Its generate calls may restore replaced engines through ``trainer.rollouts``, so
        the trainer holds this object before the producer starts: ``trainer.rollouts = AsyncRollouts(...)``, then
        ``trainer.rollouts.start()``."""
        self.thread.start()
        return self

    def _produce(self, step: int) -> None:
        try:
            while step <= self.last_step:
                with self.cond:  # batch `step` trains at version step - 1: generate it with one recent enough
                    self.cond.wait_for(lambda s=step: self.stopped or (
                        not self.pushing and self.version >= s - 1 - self.max_staleness))
                    if self.stopped:
                        return
                    self.generating = True
                    version = self.version
                drawn = self.trainer.sampler.state_dict()
                try:
                    while True:
                        try:
                            rollout = collect(self.trainer, step)
                            break
                        except WeightsMoved:  # generate the batch again, whole, with the newer weights
                            self.trainer.sampler.load_state_dict(drawn)
                            with self.cond:
                                version = self.version
                                if self.stopped:
                                    return
                finally:
                    with self.cond:
                        self.generating = False
                        self.cond.notify_all()
                rollout.version = version
                self._put(rollout)
                step += 1
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread, which raises it
            self._put(exc)

    def _put(self, item: Rollout | BaseException) -> None:
        with self.cond:
            self.out.append(item)
            self.cond.notify_all()

    def next(self, step: int) -> Rollout:
        t0 = time.perf_counter()
        with self.cond:
            self.waiting = True
            self.cond.notify_all()  # a producer waiting to restore replaced engines may push now
            try:
                self.cond.wait_for(lambda: self.out and not self.repairing)
                item = self.out.popleft()
            finally:
                self.waiting = False
        if isinstance(item, BaseException):
            raise RuntimeError(f"the rollout producer failed: {type(item).__name__}: {item}") from item
        item.metrics["async/staleness"] = float(step - 1 - item.version)
        item.metrics["timing/wait_rollout"] = time.perf_counter() - t0
        item.metrics["async/push_wait"] = self.push_wait
        return item

    def exclusive(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` on the engines between two batches (the weight push, an evaluation): waits for the
        batch being generated to end; the producer waits until ``work`` is done."""
        t0 = time.perf_counter()
        with self.cond:
            self.cond.wait_for(lambda: not self.generating or self.stopped)
            self.push_wait = time.perf_counter() - t0
            self.pushing = True
        try:
            return work()
        finally:
            with self.cond:
                self.pushing = False
                self.cond.notify_all()

    def push(self, push: Callable[[], int]) -> int:
        """Hand the weights of the next version to the engines between two batches: waits for the batch being
        generated to end, pushes, and lets the producer go on."""
        try:
            return self.exclusive(push)
        finally:
            with self.cond:
                self.version += 1
                self.cond.notify_all()

    def restore(self, push: Callable[[], Any]) -> None:
        """Called by the producer when engines were replaced mid-batch: they need the weights the others hold
        (``version``). The trainer may be training the next version, so wait: until the trainer is idle
        (waiting for this batch: then ``push`` here, while it waits), or until its own next push, which reaches
        the replacements too (then :class:`WeightsMoved`: the batch is made again with the newer version)."""
        with self.cond:
            version = self.version
            self.generating = False  # a trainer waiting to push goes ahead
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.stopped or self.version != version or self.waiting)
            self.generating = True
            if self.stopped or self.version != version:
                raise WeightsMoved(f"the engines hold version {self.version} now, not {version}")
            self.repairing = True  # the trainer stays in next() until the replacements have the weights
        try:
            push()
        finally:
            with self.cond:
                self.repairing = False
                self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        if self.thread.ident is not None:  # started
            self.thread.join(timeout=5)  # a batch being generated ends with the engines' shutdown
