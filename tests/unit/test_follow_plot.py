"""Following a job's log (a clean progress view driven by @plan / @metrics lines) and plotting its metrics,
on log text written by the trainer's own MetricsLogger and on lines taken from a real demo job's log."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from rlrun.follow import LogFollower, classify
from rlrun.plot import Run, figure, layout, lr_warmup_end, read_log, read_run, smooth, write_png
from trainer.metrics import MetricsLogger


def trainer_log(steps: int = 4, warmup: int = 0) -> tuple[str, list[dict]]:
    """A job log as the trainer prints it: people's lines, one @plan line, per step a line and @metrics."""
    out = io.StringIO()
    logger = MetricsLogger(None, print_fn=lambda text, flush=False: out.write(text + "\n"))
    out.write("data: {'prompts': 32}\n")
    for step in range(1, warmup + 1):
        out.write(f"warm-up step {step}/{warmup}: loss/sft={4.0 / step:.4f}\n")
    logger.plan(total_steps=steps, start_step=0, algorithm="rloo", sft_warmup_steps=warmup)
    rows = []
    for step in range(1, steps + 1):
        metrics = {"reward/mean": 0.1 * step, "reward/std": 0.5, "kl/mean": 0.01 * step, "loss/policy": -0.2 / step,
                   "loss/kl": 0.0, "policy/clip_frac": 0.01 * step, "timing/generate": 1.5, "timing/train": 2.0 + step,
                   "lr/actor": 1e-6 * min(step, 2), "response_length/mean": 10.0 + step, "tokens/real": 4600.0}
        logger.log(step, metrics)
        rows.append(metrics)
    out.write("saved the model\n")
    return out.getvalue(), rows


# Lines as a real `rlrun submit --preset tiny-rloo` job's log has them (Ray's colour codes included).
LIBRARY_LINES = [
    "2026-11-24 04:21:10,005\tINFO worker.py:1841 -- Connecting to existing Ray cluster at address: 127.0.0.2:8100...",
    "\x1b[36m(ModelWorker pid=25136)\x1b[0m [2026-11-24 04:21:13,960] [WARNING] [real_accelerator.py:213:get_accelerator] "
    "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.",
    "(ModelWorker pid=25136) /venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83: FutureWarning: "
    "`torch.distributed.reduce_scatter_tensor` is deprecated. Please use `torch.distributed.reduce_scatter_single` instead.",
    "(ModelWorker pid=25136)   return func(*args, **kwargs)",
    "(VllmEngine pid=25493) (MainProcess pid=25493) WARNING 11-24 04:23:54 [layerwise.py:266] RotaryEmbedding: "
    "Failed to load weights",
    "(VllmEngine pid=25493) (MainProcess pid=25493) INFO 11-24 04:23:54 [block_pool.py:861] Successfully reset prefix cache",
    "(VllmEngine pid=20508) W1124 04:18:16.338000 20508 torch/_library/triton.py:53] Triton not available",
    "(VllmEngine pid=20508) [W1124 04:18:17.851159870 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy",
    "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 248.36it/s]",
    "Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 132.91it/s]",
    "(ModelWorker pid=25136) ",
    "Running entrypoint for job rlrun-20261124-042106-7e5d86: python -m trainer.train_ppo_ray --pretrain x",
]
TRAINER_LINES = [
    "data: {'records': 128, 'loaded': 128, 'kept': 128, 'missing_input': 0, 'too_long': 0}",
    "weight sync: --vllm_sync_backend nccl needs GPUs; this cluster has none, so gloo",
    "warm-up step 3/25: loss/sft=3.5571",
    "step 1: kl/mean=0 loss/kl=0 loss/policy=-0.01125 lr/actor=0.0003 | generate=37.61s train=0.31s",
]
ERROR_LINES = [
    "Traceback (most recent call last):",
    "ray.exceptions.RayTaskError(RuntimeError): ray::ModelWorker.train_policy() (pid=25136, ip=127.0.0.2)",
    "RuntimeError: CUDA out of memory",
    "(ModelWorker pid=1) [2026-11-24 04:21:13,960] [ERROR] [engine.py:1:step] optimizer state is gone",
    "2026-11-24 04:21:10,005\tERROR worker.py:1 -- Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1')",
]


@pytest.mark.parametrize("line", LIBRARY_LINES)
def test_library_chatter_is_left_out_of_the_view(line):
    assert classify(line, after_warning="return func" in line) == "noise"


@pytest.mark.parametrize("line", TRAINER_LINES)
def test_the_trainers_own_lines_are_shown(line):
    assert classify(line) == "trainer"


@pytest.mark.parametrize("line", ERROR_LINES)
def test_errors_are_shown(line):
    assert classify(line) == "error"


def test_follower_tracks_steps_and_reward_and_shows_only_the_trainers_lines():
    text, _ = trainer_log()
    noisy = "\n".join(LIBRARY_LINES) + "\n"
    err, out = io.StringIO(), io.StringIO()
    follower = LogFollower(Console(file=err, width=200), out=out, live=False)
    stream = noisy + text + noisy
    for i in range(0, len(stream), 37):  # chunks that cut lines in the middle, as a stream does
        follower.write(stream[i:i + 37])
    follower.close()
    assert (follower.total, follower.step) == (4, 4)
    assert follower.summary() == "reward/mean=0.4 kl/mean=0.04"
    assert err.getvalue().splitlines() == [
        "plan: 4 steps", "[1/4] reward/mean=0.1 kl/mean=0.01", "[2/4] reward/mean=0.2 kl/mean=0.02",
        "[3/4] reward/mean=0.3 kl/mean=0.03", "[4/4] reward/mean=0.4 kl/mean=0.04"]
    shown = out.getvalue()
    assert "@metrics" not in shown and "@plan" not in shown
    assert "Warning" not in shown and "WARNING" not in shown and "INFO" not in shown and "\x1b[" not in shown
    assert shown.startswith("data: {'prompts': 32}\nstep 1: ") and shown.endswith("saved the model\n")
    assert follower.hidden == 2 * len(LIBRARY_LINES)


def test_a_failure_shows_the_hidden_end_of_the_log_once():
    err, out = io.StringIO(), io.StringIO()
    quiet_fail = "step 1: reward/mean=0\n" + "\n".join(LIBRARY_LINES) + "\n"  # died without a traceback
    follower = LogFollower(Console(file=err), out=out, live=False)
    follower.write(quiet_fail)
    follower.close()
    clean = [line.replace("\x1b[36m", "").replace("\x1b[0m", "") for line in LIBRARY_LINES]
    # Ray's echo of the command (the last library line) is left out; the view's own lines are not repeated.
    assert follower.failure_tail(quiet_fail, lines=5).splitlines() == clean[-5:-1]
    assert follower.failure_tail(quiet_fail, lines=100).splitlines() == clean[:-1]
    # With the traceback on screen already, nothing more is printed.
    loud_fail = quiet_fail + "\n".join(ERROR_LINES[:3]) + "\n"
    follower = LogFollower(Console(file=err), out=(shown := io.StringIO()), live=False)
    follower.write(loud_fail)
    follower.close()
    assert follower.failure_tail(loud_fail, lines=30) == ""
    assert shown.getvalue().count("RuntimeError: CUDA out of memory") == 1


def test_follower_draws_a_rich_bar_on_a_terminal():
    text, _ = trainer_log(2)
    err = io.StringIO()
    follower = LogFollower(Console(file=err, width=120, force_terminal=True), out=io.StringIO(), live=True)
    follower.write(text)
    task = follower.progress.tasks[0]
    assert (task.total, task.completed, task.description) == (2, 2, "reward/mean=0.2 kl/mean=0.02")
    follower.close()
    assert "2/2" in err.getvalue()


def _curves(fig, title):
    ax = next(a for a in fig.axes if a.get_title() == title)
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()
            if not line.get_label().startswith("_")}


def test_plot_gives_each_kind_of_metric_its_own_axis(tmp_path):
    text, rows = trainer_log(warmup=3)
    run = read_run(text.splitlines(), "rlrun-x", "tiny-rloo")
    assert run.plan["total_steps"] == 4 and [r["step"] for r in run.rows] == [1, 2, 3, 4]
    assert run.warmup == [(1, 4.0), (2, 2.0), (3, 1.3333)]
    fig, plotted = figure([run], smooth_weight=0)
    assert plotted == {"reward": ["reward/mean"], "KL to the reference": ["kl/mean"], "policy loss": ["loss/policy"],
                       "response length": ["response_length/mean"], "clip fraction": ["policy/clip_frac"],
                       "learning rate": ["lr/actor"], "phase timings": ["timing/generate", "timing/train"],
                       "tokens per step": ["tokens/real"], "supervised warm-up": ["loss/sft"]}
    assert _curves(fig, "reward")["reward/mean"] == ([1, 2, 3, 4], [r["reward/mean"] for r in rows])
    assert _curves(fig, "phase timings")["timing/train"] == ([1, 2, 3, 4], [3.0, 4.0, 5.0, 6.0])
    assert _curves(fig, "supervised warm-up (before RL step 1)")["loss/sft"][1] == [4.0, 2.0, 1.3333]
    assert fig.get_suptitle() == "tiny-rloo · rlrun-x (4/4 steps, rloo)"
    assert "0 at every step, not drawn: loss/kl" in fig._supxlabel.get_text()
    reward_ax = next(a for a in fig.axes if a.get_title() == "reward")
    assert "3 supervised warm-up steps before step 1" in [t.get_text() for t in reward_ax.texts]
    lr_ax = next(a for a in fig.axes if a.get_title() == "learning rate")
    assert any(p.get_label() == "lr warm-up" for p in lr_ax.patches)  # lr rises 1e-6 -> 2e-6 over steps 1-2
    png = tmp_path / "out" / "job.png"
    assert write_png([run], png, smooth=0) == plotted
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_several_runs_are_overlaid_one_colour_each():
    text, _ = trainer_log()
    a = read_run(text.splitlines(), "job-a", "tiny-rloo")
    b = read_run(text.replace('"reward/mean": 0.', '"reward/mean": 0.0').splitlines(), "job-b", "tiny-ppo")
    fig, _ = figure([a, b], smooth_weight=0)
    ax = next(x for x in fig.axes if x.get_title() == "reward")
    lines = [line for line in ax.get_lines() if len(line.get_xdata())]
    assert [list(line.get_ydata()) for line in lines] == [pytest.approx([0.1, 0.2, 0.3, 0.4]),
                                                           pytest.approx([0.01, 0.02, 0.03, 0.04])]
    assert lines[0].get_color() != lines[1].get_color()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["tiny-rloo · job-a (4/4 steps, rloo)", "tiny-ppo · job-b (4/4 steps, rloo)"]


def test_smoothing_is_a_debiased_moving_average():
    assert smooth([1.0, 0.0, 0.0], 0.0) == [1.0, 0.0, 0.0]
    assert smooth([1.0, 0.0, 0.0], 0.5) == pytest.approx([1.0, 1 / 3, 1 / 7])
    assert smooth([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])  # no pull towards 0


def test_lr_warmup_ends_where_the_rate_first_peaks():
    assert lr_warmup_end([1, 2, 3, 4, 5], [1e-7, 2e-7, 3e-7, 3e-7, 2e-7]) == 3
    assert lr_warmup_end([1, 2, 3], [3e-7, 3e-7, 3e-7]) is None
    assert lr_warmup_end([1, 2, 3], [3e-7, 2e-7, 1e-7]) is None


def test_series_that_are_zero_in_every_run_are_named_not_drawn():
    rows = [{"step": 1, "reward/mean": 0.5, "reward/n_timeout": 0.0, "loss/kl": 0.0},
            {"step": 2, "reward/mean": 0.6, "reward/n_timeout": 0.0, "loss/kl": 0.1}]
    panels, zero = layout([Run("a", None, {}, rows)])
    assert zero == ["reward/n_timeout"]
    assert [(p.title, keys) for p, keys in panels] == [("reward", ["reward/mean"]), ("KL to the reference", ["loss/kl"])]


def test_a_step_logged_twice_keeps_its_last_row_and_other_lines_are_ignored():
    lines = ['@metrics {"step": 1, "reward/mean": 0.0}', "@metrics not json", "step 1: reward/mean=0",
             '@metrics {"step": 1, "reward/mean": 0.5}', '@metrics {"step": 2, "reward/mean": 1.0}']
    plan, rows = read_log(lines)
    assert plan == {} and [r["reward/mean"] for r in rows] == [0.5, 1.0]


def test_curve_averages_the_reward_over_runs_of_steps():
    text, _ = trainer_log(steps=10)
    follower = LogFollower(Console(file=io.StringIO()), out=io.StringIO(), live=False)
    follower.write(text)
    follower.close()
    # rewards 0.1 .. 1.0; 10 steps in runs of 2 at points=5
    assert follower.curve(points=5) == ("reward/mean by step  1-2: 0.15 | 3-4: 0.35 | 5-6: 0.55 | 7-8: 0.75 | "
                                        "9-10: 0.95")
    assert LogFollower(Console(file=io.StringIO()), out=io.StringIO(), live=False).curve() == ""


def test_follow_shows_exact_match_and_search_rate_of_search_rollouts():
    lines = io.StringIO()
    logger = MetricsLogger(None, print_fn=lambda text, flush=True: lines.write(text + "\n"))
    logger.plan(total_steps=2)
    for step in (1, 2):
        logger.log(step, {"reward/mean": 0.25 * step, "reward/exact_match": 0.25 * step, "search/rate": 0.5 * step,
                          "search/turns": 1.5, "kl/mean": 0.0, "rollout/tool_s": 0.1})
    err = io.StringIO()
    follower = LogFollower(Console(file=err, width=200), out=io.StringIO(), live=False)
    follower.write(lines.getvalue())
    follower.close()
    assert err.getvalue().splitlines()[-1] == (
        "[2/2] reward/mean=0.5 reward/exact_match=0.5 search/rate=1 search/turns=1.5 kl/mean=0")


def _eval_log() -> str:
    """A run with --eval_at_start --eval_steps 2 --eval_n_samples 4, as the trainer logs it: eval/* on step 0
    (a row of its own) and on steps 2 and 4; an engine replaced at step 3."""
    lines = io.StringIO()
    logger = MetricsLogger(None, print_fn=lambda text, flush=True: lines.write(text + "\n"))
    logger.plan(total_steps=4)
    logger.log(0, {"eval/greedy": 0.25, "eval/pass@4": 0.5, "eval/mean@4": 0.2, "eval/accuracy": 0.2,
                   "eval/response_length": 7.0, "timing/eval": 1.0})
    for step in (1, 2, 3, 4):
        row = {"reward/mean": 0.1 * step, "kl/mean": 0.0, "engines/restarts": 0.0 if step < 3 else 1.0,
               "response_length/mean": 8.0}
        if step % 2 == 0:
            row.update({"eval/greedy": 0.25 * step, "eval/pass@4": 0.5 + 0.1 * step, "eval/mean@4": 0.2 * step,
                        "eval/accuracy": 0.2 * step, "eval/response_length": 6.0 + step, "timing/eval": 1.0})
        logger.log(step, row)
    return lines.getvalue()


def test_follow_shows_the_last_evaluation_from_the_step_it_ran_and_engine_restarts_once_there_are():
    err = io.StringIO()
    follower = LogFollower(Console(file=err, width=200), out=io.StringIO(), live=False)
    follower.write(_eval_log())
    follower.close()
    assert err.getvalue().splitlines() == [
        "plan: 4 steps",
        "[0/4] eval/greedy=0.25 eval/mean@4=0.2 eval/pass@4=0.5",
        "[1/4] reward/mean=0.1 kl/mean=0 eval/greedy=0.25 eval/mean@4=0.2 eval/pass@4=0.5 (eval of step 0)",
        "[2/4] reward/mean=0.2 kl/mean=0 eval/greedy=0.5 eval/mean@4=0.4 eval/pass@4=0.7",
        "[3/4] reward/mean=0.3 kl/mean=0 engines/restarts=1 eval/greedy=0.5 eval/mean@4=0.4 eval/pass@4=0.7 "
        "(eval of step 2)",
        "[4/4] reward/mean=0.4 kl/mean=0 engines/restarts=1 eval/greedy=1 eval/mean@4=0.8 eval/pass@4=0.9"]


def test_plot_has_an_evaluation_panel_from_step_0():
    run = read_run(_eval_log().splitlines(), "job-e")
    fig, plotted = figure([run], smooth_weight=0)
    assert plotted["evaluation"] == ["eval/greedy", "eval/mean@4", "eval/pass@4"]
    assert plotted["response length"] == ["eval/response_length", "response_length/mean"]
    assert _curves(fig, "evaluation")["eval/greedy"] == ([0, 2, 4], [0.25, 0.5, 1.0])
    assert _curves(fig, "evaluation")["eval/pass@4"][0] == [0, 2, 4]
