"""Chaos on CPU (issue 31): faults injected into real training jobs (`python -m trainer.train_ppo_ray` on the
session's private Ray, real DeepSpeed, real engines, a real reward server), and evaluation during training.

- An engine process killed while the job runs (SIGKILL by PID, right after a step's metrics line: the next
  call on it is the next step's generate) is replaced, its share generated again with the same seeds: the
  job succeeds, ``engines/restarts`` counts the kills, and every step equals an uninterrupted run's (the
  HF engine); with two vLLM engines the broadcast group forms again with the replacement.
- A frozen engine (SIGSTOP) misses --generate_timeout; with --max_engine_restarts 0 the job ends with one
  line naming the engine, its node and the error, within the deadline.
- The reward server stopped for 20 s mid-run (SIGTERM by PID, then started again on its port): the job waits
  and goes on, and no reward of that window is a wrong 0 (a policy warmed up to answer \\boxed{1} to prompts
  labelled 1: the server scores every sample 1, so any 0 would be made up).
- --eval_data --eval_steps 2 --eval_at_start --eval_n_samples 2 --save_best: eval/* at steps 0, 2 and 4, the
  greedy evaluation the same in two runs, the best checkpoint behind <ckpt_path>/best.

The runs go three at a time on the shared Ray (tests/conftest.py), as test_train_loop's do.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import PROJECT, RewardProc, free_port

pytestmark = pytest.mark.integration

TOKEN = "r31" * 16
STEPS = 4  # 2 episodes of 2 rollout batches


HAS_ONE = ("--reward_fn", "tests.integration.loop_rewards:has_one")


def _flags(tmp: Path, out: Path, extra=(), reward=HAS_ONE, data: str = "data.jsonl") -> list[str]:
    return ["--pretrain", str(tmp / "model"), "--prompt_data", str(tmp / data), "--input_key", "message",
            "--label_key", "answer", "--apply_chat_template", *reward, "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1", "--ref_num_nodes", "1",
            "--ref_num_gpus_per_node", "1", "--advantage_estimator", "rloo", "--n_samples_per_prompt", "4",
            "--rollout_batch_size", "4", "--micro_rollout_batch_size", "2", "--train_batch_size", "8",
            "--micro_train_batch_size", "2", "--generate_max_len", "32", "--prompt_max_len", "64",
            "--num_episodes", "2", "--max_samples", "8", "--zero_stage", "3", "--actor_learning_rate", "3e-3",
            "--init_kl_coef", "0.01", "--temperature", "1.0", "--lr_scheduler", "constant_with_warmup",
            "--lr_warmup_ratio", "0", "--save_path", str(out), "--ckpt_path", str(out / "ckpt"), *extra]


HF = ("--rollout_backend", "hf")
EVAL = ("--eval_at_start", "--eval_steps", "2", "--eval_n_samples", "2", "--save_best", "eval/mean@2")


class Job:
    """A training job in a subprocess whose output is read line by line as it comes: ``on(pattern, action)``
    runs ``action(match)`` in the reader thread the moment a line matches (a fault injected right there)."""

    def __init__(self, ray: dict, tmp: Path, out: Path, flags: list[str], env: dict[str, str] | None = None):
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.lines: list[str] = []
        self.hooks: list[tuple[re.Pattern, object]] = []
        self.errors: list[BaseException] = []  # of the hooks: raised by finish()
        self.lock = threading.Lock()
        self.stderr = out / "stderr.log"
        full_env = {**ray["env"], "RAY_ADDRESS": ray["address"], "HOME": str(tmp / "home"), **(env or {})}
        with open(self.stderr, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "trainer.train_ppo_ray", *flags], cwd=PROJECT,
                                         env=full_env, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1)
        self.started = time.monotonic()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def on(self, pattern: str, action) -> None:
        with self.lock:
            self.hooks.append((re.compile(pattern), action))

    def _read(self) -> None:
        with open(self.out / "stdout.log", "w") as copy:  # for a look afterwards
            self._follow(copy)

    def _follow(self, copy) -> None:
        for line in self.proc.stdout:
            copy.write(line)
            copy.flush()
            line = line.rstrip("\n")
            with self.lock:
                self.lines.append(line)
                hooks = list(self.hooks)
            for pattern, action in hooks:
                match = pattern.search(line)
                if match:
                    try:
                        action(match)
                    except BaseException as exc:  # noqa: BLE001 - the output is still read (no blocked pipe)
                        self.errors.append(exc)

    def text(self) -> str:
        with self.lock:
            return "\n".join(self.lines)

    def finish(self, timeout: float = 900) -> tuple[int, list[dict], str, str]:
        """(exit code, metrics rows, stdout, stderr)."""
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=30)
        if self.errors:
            raise self.errors[0]
        path = self.out / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return code, rows, self.text(), self.stderr.read_text()


def _engine_pid(text: str, label: str) -> int:
    """The pid of the engine ``label`` last started (the job logs every start: ready and replaced)."""
    found = re.findall(rf"{re.escape(label)} on node \S+ \(pid (\d+)\)", text)
    assert found, f"the job never named {label}'s pid:\n{text[-3000:]}"
    return int(found[-1])


class Killer:
    """SIGKILL engine ``label`` right after a step's metrics line (its next call: the next step's generate),
    then again after the next line, until a kill hit a generate call (or ``attempts`` were made)."""

    def __init__(self, job: Job, label: str, attempts: int = 3):
        self.job, self.label, self.attempts = job, label, attempts
        self.kills: list[tuple[int, int]] = []  # (step, pid)
        self.waiting = False  # for the replacement of the last kill
        job.on(r"^@metrics (\{.*\})$", self._step)
        job.on(r"^replaced: ", lambda m: setattr(self, "waiting", False))

    def _step(self, match) -> None:
        step = json.loads(match.group(1))["step"]
        text = self.job.text()
        if step < 1 or step >= STEPS or self.waiting or len(self.kills) >= self.attempts:
            return
        if "died during generate" in text:
            return
        pid = _engine_pid(text, self.label)
        os.kill(pid, signal.SIGKILL)
        self.kills.append((step, pid))
        self.waiting = True


def _run(ray, tmp, name, flags, kill: str | None = None):
    """A run; with ``kill``, the engine of that label killed after a step (:class:`Killer`)."""
    job = Job(ray, tmp, tmp / name, flags)
    killer = Killer(job, kill) if kill else None
    return (*job.finish(), killer.kills if killer else [])


def _frozen(ray, tmp):
    """--max_engine_restarts 0: the engine frozen (SIGSTOP) after step 1 ends the job at its deadline."""
    job = Job(ray, tmp, tmp / "frozen", _flags(tmp, tmp / "frozen", (*HF, "--max_engine_restarts", "0",
                                                                      "--generate_timeout", "8")))
    stopped: dict[str, float] = {}

    def freeze(match) -> None:
        if not stopped:
            os.kill(_engine_pid(job.text(), "HF rollout engine 0"), signal.SIGSTOP)
            stopped["at"] = time.monotonic()

    job.on(r'^@metrics \{"step": 1,', freeze)
    code, rows, out, err = job.finish()
    return code, rows, out, err, time.monotonic() - stopped.get("at", time.monotonic())


def _outage(ray, tmp):
    """The reward server stopped for 20 s after step 1 and started again on its port."""
    d = tmp / "outage"
    d.mkdir()
    (d / "token").write_text(TOKEN)
    (d / "token").chmod(0o600)
    port = free_port()
    args = ["--token-file", str(d / "token"), "--verify-processes", "1", "--threads", "2"]
    server = {"proc": RewardProc(args, d / "server.log", port=port)}
    window: dict[str, float] = {}

    def stop_for_20s(match) -> None:
        if window:
            return
        window["stopped"] = time.monotonic()
        assert server["proc"].stop() == 0  # SIGTERM to the PID we started; gunicorn ends cleanly
        time.sleep(max(0.0, 20 - (time.monotonic() - window["stopped"])))
        server["proc"] = RewardProc(args, d / "server.log", port=port)
        window["back"] = time.monotonic()

    # the policy warmed up on \boxed{1} (25 supervised steps), sampled at a low temperature: it always answers 1
    flags = _flags(tmp, d, (*HF, "--sft_warmup_steps", "25", "--sft_output_key", "solution", "--sft_learning_rate",
                            "1e-2", "--temperature", "0.3"),
                   reward=("--remote_rm_url", f"http://127.0.0.1:{port}/get_reward"), data="ones.jsonl")
    job = Job(ray, tmp, d, flags, env={"RLRUN_REWARD_TOKEN": TOKEN})
    job.on(r'^@metrics \{"step": 1,', lambda m: threading.Thread(target=stop_for_20s, args=(m,), daemon=True).start())
    try:
        result = job.finish()
    finally:
        server["proc"].stop()
    return (*result, window, (d / "server.log").read_text())


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    from trainer.tiny import make_math_dataset, make_model

    d = tmp_path_factory.mktemp("chaos")
    make_model(d / "model", hidden_size=64, num_layers=2, num_heads=4)
    make_math_dataset(d / "data.jsonl", n=16, kind="copy")
    make_math_dataset(d / "eval.jsonl", n=6, kind="copy", seed=5)
    ones = [{"message": [{"role": "user", "content": f"copy {i}="}], "answer": "1", "solution": "\\boxed{1}"}
            for i in range(16)]  # every answer is 1: the warmed-up policy always gets it right
    (d / "ones.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ones))
    (d / "home").mkdir()
    vllm = d / "vllm"  # vLLM's CPU backend takes head_dim 64: the default tiny shape
    make_model(vllm / "model")
    make_math_dataset(vllm / "data.jsonl", n=16, kind="copy")
    (vllm / "home").mkdir()
    return d


@pytest.fixture(scope="module")
def runs(private_ray, tmp):
    """Every run of the module, three at a time on the shared Ray: name -> its result. The two-engine vLLM
    run (the longest: vLLM starts three times) goes first."""
    evals = ("--eval_data", str(tmp / "eval.jsonl"), *EVAL)
    vllm = tmp / "vllm"
    jobs = {
        # eager engines: what is tested is the kill and the group's re-forming, not vLLM's compilation (which
        # test_vllm_engine's in-process engine and test_multiturn's curve runs cover), ~18 s of CPU a start
        "vllm_killed": lambda: _run(private_ray, vllm, "killed", _flags(vllm, vllm / "killed", (
            "--rollout_backend", "vllm", "--vllm_num_engines", "2", "--micro_train_batch_size", "4",
            "--enforce_eager")), kill="vLLM engine (TP 1) 1"),
        "reference": lambda: _run(private_ray, tmp, "reference", _flags(tmp, tmp / "reference", (*HF, *evals))),
        "killed": lambda: _run(private_ray, tmp, "killed", _flags(tmp, tmp / "killed", (*HF, *evals)),
                               kill="HF rollout engine 0"),
        "frozen": lambda: _frozen(private_ray, tmp),
        "outage": lambda: _outage(private_ray, tmp),
    }
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
    return _Results(futures)


class _Results(dict):
    """name -> the run's result; a failed run raises in the tests that read it, and only there."""

    def __getitem__(self, name):
        return super().__getitem__(name).result()


def _ok(result):
    code, rows, out, err, *rest = result
    assert code == 0, out[-3000:] + err[-3000:]
    return rows, out, *rest


KEYS = ("reward/mean", "loss/policy", "kl/mean", "response_length/mean")


def test_a_killed_engine_is_replaced_and_the_run_equals_the_uninterrupted_one(runs):
    rows, out, kills = _ok(runs["killed"])
    reference, _, _ = _ok(runs["reference"])
    assert kills, "no engine was killed"
    assert "died during generate" in out, out[-3000:]  # at least one kill hit the step's generate
    train = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert train[-1]["engines/restarts"] == len(kills)
    for step, _pid in kills:  # counted from the step after the kill on
        assert all(r["engines/restarts"] >= 1 for r in train if r["step"] > step + 1)
    assert all(r["rollout/samples"] == 16 for r in train)  # every step's samples complete
    # the same seeds and the same weights: every step as in the run nobody disturbed
    for mine, theirs in zip(train, [r for r in reference if r["step"] >= 1], strict=True):
        for key in KEYS:
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-9), (mine["step"], key)


def test_two_vllm_engines_one_killed_the_broadcast_group_forms_again(runs):
    rows, out, kills = _ok(runs["vllm_killed"])
    assert kills, "no engine was killed"
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["engines/restarts"] == len(kills)
    assert all(r["rollout/samples"] == 16 and r["response_length/mean"] > 0 for r in rows)
    assert re.search(r"vLLM engine \(TP 1\) 1 on node \S+ failed: died (during generate|during a liveness ping)", out)
    assert "weight sync: re-forming the gloo group with 1 replaced engine(s)" in out
    assert out.count("weight sync: gloo broadcast group of 3") == 1 + len(kills)


def test_past_max_engine_restarts_a_frozen_engine_ends_the_job_with_one_line(runs):
    code, rows, out, err, after_stop = runs["frozen"]
    assert code == 1, out[-3000:] + err[-3000:]
    assert [r["step"] for r in rows] == [1]
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(r"python -m trainer\.train_ppo_ray: HF rollout engine 0 on node \S+ failed 1 times "
                        r"\(--max_engine_restarts 0\); last error: (generate|a liveness ping) did not return within "
                        r"8 s \(--generate_timeout\)", last), last
    assert "Traceback" not in err
    assert after_stop < 8 + 90  # the deadline, then the shutdown: no silent hang


def test_a_reward_outage_is_waited_out_and_no_sample_is_scored_0_for_it(runs):
    rows, out, window, server_log = _ok(runs["outage"])
    assert set(window) == {"stopped", "back"} and window["back"] - window["stopped"] >= 20
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # every sample answers \boxed{1} to a prompt labelled 1: a 0 anywhere would be made up
    assert all(r["reward/mean"] == 1.0 and r["reward/accuracy"] == 1.0 for r in rows), [r["reward/mean"] for r in rows]
    assert re.search(r"reward service http://127\.0\.0\.1:\d+/get_reward is not answering \(connection refused or "
                     r"unreachable\); waiting for it up to 300 s \(--reward_outage_timeout\)", out), out[-3000:]
    assert "/get_reward answers again after" in out
    waited = max(r["timing/score"] for r in rows)
    assert waited >= 10, [r["timing/score"] for r in rows]  # the step that met the outage waited for the server
    assert server_log.count("get_reward items=16") == STEPS  # every step was scored by the server, once


def test_evaluation_logs_eval_metrics_at_steps_0_2_4_and_greedy_is_deterministic(runs):
    reference, out, _ = _ok(runs["reference"])
    killed, _, _ = _ok(runs["killed"])
    with_eval = [r["step"] for r in reference if "eval/greedy" in r]
    assert with_eval == [0, 2, 4]
    assert [r["step"] for r in reference] == [0, 1, 2, 3, 4]  # step 0: a row of its own, before training
    for row in (r for r in reference if r["step"] in with_eval):
        for key in ("eval/greedy", "eval/pass@2", "eval/mean@2", "eval/response_length", "eval/truncated",
                    "timing/eval"):
            assert key in row, (row["step"], key)
        assert 0 <= row["eval/mean@2"] <= row["eval/pass@2"] <= 1
    assert "eval at step 2 (6 prompts, 2 samples each): eval/greedy=" in out
    # greedy answers of the same weights: the same in another run (which lost an engine on the way)
    for mine, theirs in zip([r for r in killed if "eval/greedy" in r], [r for r in reference if "eval/greedy" in r],
                            strict=True):
        assert mine["eval/greedy"] == theirs["eval/greedy"], mine["step"]
        assert mine["eval/mean@2"] == pytest.approx(theirs["eval/mean@2"]), mine["step"]


def test_save_best_keeps_the_best_evaluated_step(runs, tmp):
    reference, out, _ = _ok(runs["reference"])
    scores = [(r["eval/mean@2"], -r["step"]) for r in reference if "eval/mean@2" in r]
    value, neg_step = max(scores)  # the highest; the earliest of equals
    ckpt = tmp / "reference" / "ckpt"
    link = ckpt / "best"
    assert link.is_symlink() and os.readlink(link) == f"best-global_step{-neg_step}"
    assert json.loads((link / "best.json").read_text()) == {"metric": "eval/mean@2", "value": value,
                                                           "step": -neg_step}
    assert (link / "latest").read_text().strip() == f"global_step{-neg_step}"  # a checkpoint to resume from
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("best")) == ["best", f"best-global_step{-neg_step}"]
