"""Where a step's rollout comes from: generated now (:class:`SyncRollouts`), or ahead of training on engines of
their own (:class:`AsyncRollouts`, ``--async_train``). Both draw prompts, generate, score and (with
``--dynamic_filtering``) keep only informative prompts through one method, :meth:`Rollouts.collect`; the step
takes a :class:`Rollout` with :meth:`next` and hands the new weights over with :meth:`push`.

What a producer is handed, and all it uses (the loop wires them; it is never handed the trainer): the config,
the prompt sampler (:class:`trainer.data.PromptSampler`), the engines (:class:`trainer.rollout.engines.Engines`),
a ``score(prompts, samples) -> RewardBatch`` (:func:`scorer` of the job's reward) and the weight push
``push() -> bytes``, which :meth:`push` runs between two batches and :meth:`restore` runs for replaced engines.

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
The producer hands the engines a ``restore`` for that (:meth:`SyncRollouts.restore`: push now, the policy holds
exactly those weights). In async mode the policy may be training the next version meanwhile, so the producer
waits (:meth:`AsyncRollouts.restore`): for the trainer to be idle (waiting for this batch: the producer
pushes, the trainer waits) or for the trainer's own next push, which reaches the replacement too; then the
engines hold a newer version than the batch's first shares, and the batch is drawn and generated again,
whole, with it (:class:`WeightsMoved`). ``engines/restarts`` logs the job's replacements so far.
"""

from __future__ import annotations

import abc
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.reward.client import RewardBatch
from trainer.rollout.multiturn import tool_metrics

Score = Callable[[Sequence[Any], Sequence[Any]], RewardBatch]


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


def scorer(reward: Callable[[list[str], list[str], list[Any]], RewardBatch]) -> Score:
    """``score(prompts, samples)`` by ``reward`` (the remote service's client, or a local function: called with
    each sample's query (prompt + response), its prompt and its prompt's label); ``samples`` hold the same number
    of samples per prompt, prompt-major."""
    def score(prompts: Sequence[Any], samples: Sequence[Any]) -> RewardBatch:
        n = len(samples) // max(len(prompts), 1)
        labels = [p.label for p in prompts for _ in range(n)]
        return reward([s.prompt + s.response for s in samples], [s.prompt for s in samples], labels)
    return score


class WeightsMoved(Exception):  # noqa: N818 - a signal to generate the batch again, not an error
    """Async: while a replacement engine waited for its weights the trainer pushed a newer version to every
    engine; the batch in the making is drawn and generated again, whole, with that version."""


class Rollouts(abc.ABC):
    """A rollout producer, as the step sees it (:meth:`start`, :meth:`next`, :meth:`push`, :meth:`exclusive`,
    :meth:`close`), and what both producers share: how a batch is generated and collected.

    Args:
        cfg: the validated TrainerConfig.
        sampler: draws each batch's prompts (its state after a batch goes into the :class:`Rollout`).
        engines: the rollout engines (``generate``, ``generate_with_tools``, ``wait_ready``, ``restarts``).
        score: ``score(prompts, samples) -> RewardBatch`` (:func:`scorer`).
        push: hands the policy's current weights to every engine; returns the bytes handed over.
    """

    def __init__(self, cfg: Any, sampler: Any, engines: Any, score: Score, push: Callable[[], int]) -> None:
        self.cfg, self.sampler, self.engines, self.score, self._push = cfg, sampler, engines, score, push

    @abc.abstractmethod
    def start(self, first_step: int, last_step: int) -> Rollouts:
        """Ready to make the batches of steps ``first_step`` to ``last_step``."""

    @abc.abstractmethod
    def next(self, step: int) -> Rollout:
        """The rollout step ``step`` trains on."""

    @abc.abstractmethod
    def push(self) -> int:
        """Hand the weights the step trained to the engines; returns the bytes handed over."""

    @abc.abstractmethod
    def exclusive(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` on the engines (an evaluation) while nothing else generates."""

    @abc.abstractmethod
    def restore(self) -> None:
        """Replaced engines need the weights the other engines hold (called by the engines, mid-batch)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop making batches."""

    def generate(self, texts: list[str], seed: int) -> tuple[list[Any], list[dict[str, float]]]:
        """Samples of ``texts`` from the engines, with the engines' log-probs of them (unless
        --skip_rollout_logprobs), and for multi-turn rollouts each engine's stats; engines replaced meanwhile get
        the weights through :meth:`restore`."""
        self.engines.wait_ready()
        if self.cfg.multi_turn:
            return self.engines.generate_with_tools(texts, seed=seed, restore=self.restore)
        return self.engines.generate(texts, seed=seed, logprobs=not self.cfg.skip_rollout_logprobs,
                                     restore=self.restore), []

    def collect(self, step: int) -> Rollout:
        """Draw, generate and score the rollout of ``step`` (1-based; its seed is ``--seed + step``), keeping only
        informative prompts with ``--dynamic_filtering``."""
        cfg = self.cfg
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
            batch = self.sampler.next_batch()
            t0 = time.perf_counter()
            got, stats = self.generate([p.text for p in batch], seed=cfg.seed + step + 100_003 * r)
            t1 = time.perf_counter()
            scored = self.score(batch, got)
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
                   "engines/restarts": float(self.engines.restarts.total)}
        if cfg.dynamic_filtering:
            metrics.update({"dynamic_filtering/filtered_share": dropped / max(drawn, 1),
                            "dynamic_filtering/rounds": float(r + 1),
                            "dynamic_filtering/kept_prompts": float(len(prompts)),
                            "dynamic_filtering/short": float(len(prompts) < want)})
            if not prompts:
                raise RuntimeError(f"dynamic filtering kept no prompt of {drawn} in {r + 1} rollouts (every group "
                                   f"scored alike or outside --dynamic_filtering_reward_range "
                                   f"{cfg.dynamic_filtering_reward_range}): nothing to train on")
        if cfg.multi_turn:
            metrics.update(tool_metrics(samples, tool_stats, cfg.tool_names))
        extra = {k: sum(v) / len(v) for k, v in logs.items()}
        return Rollout(prompts, samples, RewardBatch(rewards, extra), metrics, tool_stats, self.sampler.state_dict())


class SyncRollouts(Rollouts):
    """Generate, then train: the rollout of step ``j`` is made when the step asks for it."""

    def start(self, first_step: int, last_step: int) -> SyncRollouts:
        """Nothing to start: each rollout is made when :meth:`next` asks for it."""
        return self

    def next(self, step: int) -> Rollout:
        rollout = self.collect(step)
        rollout.version = step - 1
        return rollout

    def push(self) -> int:
        """Hand the weights the step trained to the engines; returns the bytes handed over."""
        return self._push()

    def exclusive(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` on the engines (an evaluation): nothing else generates meanwhile."""
        return work()

    def restore(self) -> None:
        """Replacement engines need the weights the others hold: the policy's (nothing trains meanwhile)."""
        self._push()

    def close(self) -> None:
        pass


class AsyncRollouts(Rollouts):
    """Rollouts made ahead of training by a producer thread (see the module docstring); ``max_staleness``: the
    most policy versions a batch's weights may lag behind the version that trains on it."""

    def __init__(self, cfg: Any, sampler: Any, engines: Any, score: Score, push: Callable[[], int], *,
                 max_staleness: int) -> None:
        super().__init__(cfg, sampler, engines, score, push)
        self.max_staleness = max_staleness
        self.last_step = 0
        self.version = 0  # the policy version the engines hold (start(): the steps before the first trained it)
        self.cond = threading.Condition()
        self.generating = False  # the producer is generating a batch
        self.pushing = False  # the trainer is pushing weights (or evaluating): the engines are its
        self.waiting = False  # the trainer waits for a batch: the policy is idle and holds `version`
        self.repairing = False  # the producer pushes weights to replacement engines: the trainer waits
        self.stopped = False
        self.out: deque[Rollout | BaseException] = deque()
        self.push_wait = 0.0
        self.thread: threading.Thread | None = None

    def start(self, first_step: int, last_step: int) -> AsyncRollouts:
        """Start the producer on the batches of steps ``first_step`` to ``last_step``; the engines hold the weights
        the steps before ``first_step`` trained."""
        self.version, self.last_step = first_step - 1, last_step
        self.thread = threading.Thread(target=self._produce, args=(first_step,), name="rollout-producer",
                                       daemon=True)
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
                drawn = self.sampler.state_dict()
                try:
                    while True:
                        try:
                            rollout = self.collect(step)
                            break
                        except WeightsMoved:  # generate the batch again, whole, with the newer weights
                            self.sampler.load_state_dict(drawn)
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

    def push(self) -> int:
        """Hand the weights of the next version to the engines between two batches: waits for the batch being
        generated to end, pushes, and lets the producer go on."""
        try:
            return self.exclusive(self._push)
        finally:
            with self.cond:
                self.version += 1
                self.cond.notify_all()

    def restore(self) -> None:
        """Called by the producer when engines were replaced mid-batch: they need the weights the others hold
        (``version``). The trainer may be training the next version, so wait: until the trainer is idle
        (waiting for this batch: then push here, while it waits), or until its own next push, which reaches
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
            self._push()
        finally:
            with self.cond:
                self.repairing = False
                self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        if self.thread is not None:  # started
            self.thread.join(timeout=5)  # a batch being generated ends with the engines' shutdown
