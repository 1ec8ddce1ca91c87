"""Evaluation during training: ``--eval_data``, ``--eval_steps``, ``--eval_n_samples``, ``--save_best``.

Every ``--eval_steps`` steps (and at step 0 with ``--eval_at_start``) the engines answer every evaluation
prompt twice over: once greedily (temperature 0, one answer: deterministic for given weights) and
``--eval_n_samples`` = K times sampled at ``--eval_temperature``. It runs right after the step's weight sync,
so the engines hold the weights the step trained (colocated engines are awake then); with ``--async_train``
it runs between two rollouts, as the weight push does. The job's own reward scores the answers (the
``score`` the producer is handed too: the remote service or the local function), and the step's metrics get:

- ``eval/greedy``: the mean reward of the greedy answers;
- ``eval/pass@K``: the share of prompts solved by at least one of the K sampled answers, a sample counting
  as solved when its reward reaches :data:`SOLVED` (1: a verifier's "correct"). It is the unbiased
  estimator of Chen et al. (2021), ``1 - C(n - c, k) / C(n, k)`` for ``c`` solved of ``n`` samples
  (:func:`pass_at_k`), at ``n = k = K``, where it equals "any of the K is correct";
- ``eval/mean@K``: the mean reward of the K sampled answers (OpenRLHF's ``pass1``; for 0/1 rewards the
  expected pass@1);
- the reward's numeric logs (``extra_logs``) of the sampled answers as ``eval/<name>`` and of the greedy
  ones as ``eval/greedy_<name>``; ``eval/response_length`` and ``eval/truncated`` (share of sampled answers
  cut at --generate_max_len).

Engines that fail during an evaluation are replaced like during a rollout (:mod:`trainer.rollout.engines`), the
weights pushed to them first. ``--save_best METRIC`` keeps the checkpoint of the step with the highest value
of METRIC (:class:`BestCheckpoint`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: A sampled answer counts as solved (eval/pass@K) when its reward reaches this.
SOLVED = 1.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate for ``c`` solved answers of ``n`` sampled: the chance that ``k`` of the
    ``n`` drawn without replacement hold at least one solved, ``1 - C(n - c, k) / C(n, k)``."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k of c={c} solved out of n={n} answers at k={k}: expected 0 <= c <= n and 1 <= k <= n")
    if n - c < k:  # every k-subset holds a solved answer
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_metrics(greedy: Sequence[float], sampled: Sequence[float], k: int) -> dict[str, float]:
    """``eval/greedy``, ``eval/pass@k`` and ``eval/mean@k`` of one evaluation: ``greedy`` holds one reward
    per prompt, ``sampled`` ``k`` per prompt, prompt-major."""
    if not greedy or len(sampled) != len(greedy) * k:
        raise ValueError(f"{len(greedy)} greedy rewards and {len(sampled)} sampled ones: expected at least one "
                         f"prompt and {k} sampled rewards per prompt")
    solved = [sum(r >= SOLVED for r in sampled[i * k:(i + 1) * k]) for i in range(len(greedy))]
    return {"eval/greedy": sum(greedy) / len(greedy),
            f"eval/pass@{k}": sum(pass_at_k(k, c, k) for c in solved) / len(solved),
            f"eval/mean@{k}": sum(sampled) / len(sampled)}


class Evaluator:
    """Evaluates the engines on ``--eval_data`` when due (a no-op without ``--eval_data``).

    Args:
        cfg: the validated TrainerConfig.
        tokenizer: the policy's tokenizer (the evaluation prompts are read with it).
        engines: the rollout engines (``generate``, ``generate_with_tools``, ``wait_ready``).
        score: ``score(prompts, samples) -> RewardBatch`` (:func:`trainer.rollout.producer.scorer`).
        push: hands the policy's current weights to every engine (to engines replaced during an evaluation).
        exclusive: runs its argument on the engines while nothing else generates (the producer's
            :meth:`~trainer.rollout.producer.Rollouts.exclusive`).
        save: ``save(directory)`` writes a checkpoint of the run there (``--save_best``).
    """

    def __init__(self, cfg: Any, tokenizer: Any, engines: Any, score: Callable[[Any, Any], Any],
                 push: Callable[[], int], exclusive: Callable[[Callable[[], Any]], Any],
                 save: Callable[[Path], Any]) -> None:
        self.cfg, self.engines, self.score, self.push, self.exclusive, self.save = (
            cfg, engines, score, push, exclusive, save)
        self.prompts: list[Any] = []
        self.best = BestCheckpoint(Path(cfg.ckpt_path), cfg.save_best) if cfg.save_best else None
        if cfg.eval_data is None:
            return
        from trainer.data import DataError, chat_tools, load_prompts

        self.prompts, stats = load_prompts(
            cfg.eval_data, input_key=cfg.eval_input_key or cfg.input_key,
            label_key=cfg.eval_label_key or cfg.label_key, apply_chat_template=cfg.apply_chat_template,
            input_template=cfg.input_template, prompt_max_len=cfg.prompt_max_len, tokenizer=tokenizer,
            chat_tools=chat_tools(cfg))
        print(f"eval data ({cfg.eval_data}): {stats.as_dict()}", flush=True)
        if not self.prompts:
            raise DataError(f"--eval_data {cfg.eval_data}: no prompt is left to evaluate on ({stats.as_dict()})")

    def due(self, step: int) -> bool:
        cfg = self.cfg
        if not self.prompts:
            return False
        return cfg.eval_at_start if step == 0 else cfg.eval_steps > 0 and step % cfg.eval_steps == 0

    def at_start(self, step: int) -> dict[str, float]:
        """``--eval_at_start``: the ``eval/*`` metrics of the weights the run starts from, to be logged as step 0;
        nothing for a resumed run (at ``step`` > 0: it has evaluated them before)."""
        return self.after_step(0) if step == 0 else {}

    def after_step(self, step: int) -> dict[str, float]:
        """The ``eval/*`` metrics of ``step`` when it is an evaluation step (else nothing), with ``timing/eval``;
        keeps the best checkpoint with ``--save_best``."""
        if not self.due(step):
            return {}
        t0 = time.perf_counter()
        metrics = self.exclusive(lambda: self.evaluate(step))
        metrics["timing/eval"] = time.perf_counter() - t0
        if self.best is not None:
            self.best.offer(step, metrics, self.save)
        return metrics

    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy and sampled answers to every prompt, scored by the job's reward (see the module docstring)."""
        cfg = self.cfg
        k = cfg.eval_n_samples
        texts = [p.text for p in self.prompts]
        self.engines.wait_ready()
        generate = self.engines.generate_with_tools if cfg.multi_turn else self.engines.generate
        seed = cfg.seed + 1_000_003 + step  # the sampled pass: its own seeds, fixed per step

        def answers(n: int, temperature: float) -> list[Any]:
            if cfg.multi_turn:  # scored by the reward only: no log-probs (a dearer engine step)
                return generate(texts, seed=seed, n=n, temperature=temperature, restore=self.push, logprobs=False)[0]
            return generate(texts, seed=seed, n=n, temperature=temperature, restore=self.push)

        greedy, sampled = answers(1, 0.0), answers(k, cfg.eval_temperature)
        scored_greedy, scored = self.score(self.prompts, greedy), self.score(self.prompts, sampled)
        metrics = eval_metrics(scored_greedy.rewards, scored.rewards, k)
        metrics.update({f"eval/{key}": float(v) for key, v in scored.extra_logs.items()})
        metrics.update({f"eval/greedy_{key}": float(v) for key, v in scored_greedy.extra_logs.items()})
        metrics["eval/response_length"] = sum(len(s.response_token_ids) for s in sampled) / len(sampled)
        metrics["eval/truncated"] = sum(s.finish_reason == "length" for s in sampled) / len(sampled)
        shown = " ".join(f"{key}={metrics[key]:.4g}" for key in ("eval/greedy", f"eval/pass@{k}", f"eval/mean@{k}"))
        print(f"eval at step {step} ({len(texts)} prompts, {k} samples each): {shown}", flush=True)
        return metrics


class BestCheckpoint:
    """``--save_best METRIC``: ``<ckpt_path>/best`` is a link to the checkpoint of the step with the highest
    METRIC so far (``best-global_step<N>``, a complete checkpoint directory with its own ``latest``:
    ``--ckpt_path <ckpt_path>/best --load_checkpoint`` starts from it). A better value saves a new one; once it
    is complete (``best.json`` written last), the link is swapped to it by a rename (atomic: ``best`` always
    names a complete checkpoint) and the old one is removed. Ties keep the earlier step. ``best.json``
    (metric, value, step) lets a resumed run go on comparing with the best so far."""

    def __init__(self, ckpt_path: Path, metric: str) -> None:
        self.root, self.metric = Path(ckpt_path), metric
        self.link = self.root / "best"
        self.value: float | None = None
        self.step: int | None = None
        info = self.link / "best.json"
        if info.is_file():
            saved = json.loads(info.read_text())
            if saved.get("metric") == metric:
                self.value, self.step = float(saved["value"]), int(saved["step"])

    def offer(self, step: int, metrics: dict[str, float], save: Callable[[Path], Any]) -> bool:
        """Keep ``step``'s checkpoint (``save(directory)`` writes it) if its METRIC beats the best so far;
        returns whether it did."""
        if self.metric not in metrics:
            logged = ", ".join(sorted(k for k in metrics if k.startswith("eval/")))
            raise RuntimeError(f"--save_best {self.metric}: the evaluation logs no such metric (it logs {logged})")
        value = float(metrics[self.metric])
        if math.isnan(value) or (self.value is not None and value <= self.value):
            return False
        target = self.root / f"best-global_step{step}"
        shutil.rmtree(target, ignore_errors=True)  # a torn one of an earlier, interrupted run
        save(target)
        (target / "best.json").write_text(json.dumps({"metric": self.metric, "value": value, "step": step}) + "\n")
        old = os.readlink(self.link) if self.link.is_symlink() else None
        swap = self.root / f".best-global_step{step}.link"
        swap.unlink(missing_ok=True)
        os.symlink(target.name, swap)  # relative: the checkpoint directory may move
        os.replace(swap, self.link)
        if old and old != target.name:
            shutil.rmtree(self.root / old, ignore_errors=True)
        print(f"best checkpoint: {self.metric}={value:.4g} at step {step} (before: "
              f"{'none' if self.value is None else f'{self.value:.4g} at step {self.step}'}) -> {self.link}",
              flush=True)
        self.value, self.step = value, step
        return True
