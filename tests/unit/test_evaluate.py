"""Evaluation arithmetic (trainer.rollout.evaluate): the pass@k estimator against counting subsets, the eval/* metrics
of hand-made rewards, and --save_best's link swapped to the best complete checkpoint."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from trainer.rollout.evaluate import SOLVED, BestCheckpoint, eval_metrics, pass_at_k


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_solved_answer(n):
    """The unbiased estimator 1 - C(n-c, k)/C(n, k) is exactly: of all k-subsets of the n answers, the share that
    hold at least one of the c solved ones (counted here by enumerating them)."""
    for c in range(n + 1):
        answers = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(answers, k))
            expected = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0  # n = k: any correct
    assert pass_at_k(4, 1, 1) == 0.25  # k = 1: the share correct
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # C(3, 2) / C(5, 2)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # C(7, 5) / C(10, 5)
    for bad in ((4, 5, 2), (4, -1, 2), (4, 2, 0), (4, 2, 5)):
        with pytest.raises(ValueError, match="expected 0 <= c <= n and 1 <= k <= n"):
            pass_at_k(*bad)


def test_eval_metrics_of_hand_made_rewards():
    # 3 prompts, K = 2: prompt 0 solved by one sample, prompt 1 by none (a partial 0.5 is not solved), prompt 2 by both
    greedy = [1.0, 0.0, 1.0]
    sampled = [0.0, 1.0, 0.5, 0.0, 1.0, 1.0]
    m = eval_metrics(greedy, sampled, 2)
    assert m == {"eval/greedy": pytest.approx(2 / 3), "eval/pass@2": pytest.approx(2 / 3),
                 "eval/mean@2": pytest.approx(3.5 / 6)}
    assert SOLVED == 1.0
    assert eval_metrics([0.0], [1.5, 0.0, 0.0, 0.0], 4)["eval/pass@4"] == 1.0  # a reward above 1 solves too
    with pytest.raises(ValueError, match="expected at least one prompt and 2 sampled rewards per prompt"):
        eval_metrics([1.0, 0.0], [1.0, 0.0, 1.0], 2)


def _save(root: Path):
    """What Checkpoints.save(root=...) (trainer.run_state) leaves: a checkpoint directory with its own `latest`."""
    def save(directory: Path) -> None:
        directory.mkdir(parents=True)
        (directory / "latest").write_text("global_step\n")
        (directory / "weights.bin").write_bytes(b"x" * 10)
    return save


def test_save_best_keeps_only_the_best_step_behind_the_link(tmp_path):
    best = BestCheckpoint(tmp_path, "eval/greedy")
    saved = []

    def save(directory: Path) -> None:
        saved.append(directory.name)
        _save(tmp_path)(directory)

    assert best.offer(2, {"eval/greedy": 0.25}, save)
    assert not best.offer(4, {"eval/greedy": 0.25}, save)  # a tie keeps the earlier step
    assert best.offer(6, {"eval/greedy": 0.5}, save)
    assert not best.offer(8, {"eval/greedy": 0.0}, save)
    assert saved == ["best-global_step2", "best-global_step6"]
    link = tmp_path / "best"
    assert link.is_symlink() and os.readlink(link) == "best-global_step6"  # relative: the directory may move
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "best-global_step6"]  # the old one is gone
    assert json.loads((link / "best.json").read_text()) == {"metric": "eval/greedy", "value": 0.5, "step": 6}
    assert (link / "latest").is_file()
    # a resumed run compares with the best so far
    again = BestCheckpoint(tmp_path, "eval/greedy")
    assert (again.value, again.step) == (0.5, 6)
    assert not again.offer(10, {"eval/greedy": 0.5}, save)


def test_save_best_names_the_metrics_there_are(tmp_path):
    best = BestCheckpoint(tmp_path, "eval/pass@8")
    with pytest.raises(RuntimeError, match=r"--save_best eval/pass@8: the evaluation logs no such metric \(it logs "
                                           r"eval/greedy, eval/mean@4, eval/pass@4\)"):
        best.offer(1, {"eval/greedy": 1.0, "eval/pass@4": 1.0, "eval/mean@4": 1.0, "loss/policy": 0.1}, _save(tmp_path))


def test_a_torn_best_checkpoint_never_replaces_the_link(tmp_path):
    """The link moves only once the new checkpoint is complete: a save that fails leaves the old best."""
    best = BestCheckpoint(tmp_path, "eval/greedy")
    best.offer(1, {"eval/greedy": 0.1}, _save(tmp_path))

    def torn(directory: Path) -> None:
        directory.mkdir()
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        best.offer(2, {"eval/greedy": 0.9}, torn)
    assert os.readlink(tmp_path / "best") == "best-global_step1"
    assert (best.value, best.step) == (0.1, 1)
