"""The kernel prewarm's mechanics (trainer/rollout/kernel_prewarm.py) with real processes: the spec it accepts,
the marker's key, the node's lock, a child stopped with its whole process group, a child that ends with its
parent. The child's vLLM run itself is tests/integration/test_vllm_engine.py's (the CPU build)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.procs import alive
from trainer.rollout import kernel_prewarm as kp

PROJECT = Path(__file__).resolve().parents[2]
SAMPLING = {"n": 4, "temperature": 1.0, "top_p": 0.9}


def _model(root: Path, **config) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 3, **config}))
    return root


def _spec(model: Path, **over) -> dict:
    return kp.engine_spec(model, "bfloat16", {"max_model_len": 512, "max_num_seqs": 16, **over}, False, 0, SAMPLING)


def test_the_spec_is_what_the_engine_is_built_with_and_nothing_else(tmp_path):
    m = _model(tmp_path / "m")
    spec = _spec(m, gpu_memory_utilization=0.3)  # not a kernel's business: left out
    assert spec == {"model": str(m), "dtype": "bfloat16", "max_model_len": 512, "max_num_seqs": 16,
                    "enable_prefix_caching": False, "seed": 0, "sampling": SAMPLING}
    with pytest.raises(ValueError, match=r"missing \['seed'\], unexpected \['tp'\]; expected exactly model, dtype"):
        kp.check_spec({**{k: v for k, v in spec.items() if k != "seed"}, "tp": 2})
    with pytest.raises(ValueError, match="sampling n 0; expected an integer >= 1"):
        kp.check_spec({**spec, "sampling": {**SAMPLING, "n": 0}})
    with pytest.raises(ValueError, match="expected a mapping of n, temperature, top_p"):
        kp.check_spec({**spec, "sampling": {"n": 2}})
    with pytest.raises(ValueError, match="sampling n None"):  # a caller's sampling without n
        kp.check_spec(kp.engine_spec(m, "auto", {}, False, 0, {"temperature": 1.0, "top_p": 1.0}))
    with pytest.raises(ValueError, match="sampling n None"):  # start() checks it before any process starts
        kp.start(kp.engine_spec(m, "auto", {}, False, 0, {"temperature": 1.0, "top_p": 1.0}))


def test_one_layer_cuts_the_per_layer_lists_too(tmp_path):
    qwen = _model(tmp_path / "q", layer_types=["full_attention"] * 3)
    assert kp.one_layer_overrides(qwen) == {"num_hidden_layers": 1, "layer_types": ["full_attention"]}
    assert kp.one_layer_overrides(_model(tmp_path / "l")) == {"num_hidden_layers": 1}


def test_the_triton_cache_is_where_triton_puts_it():
    assert kp.triton_cache_dir({"TRITON_CACHE_DIR": "/c", "TRITON_HOME": "/t", "HOME": "/h"}) == Path("/c")
    assert kp.triton_cache_dir({"TRITON_HOME": "/t", "HOME": "/h"}) == Path("/t/.triton/cache")
    assert kp.triton_cache_dir({"HOME": "/h"}) == Path("/h/.triton/cache")


def test_the_marker_changes_with_the_models_config_and_the_spec_only(tmp_path):
    m = _model(tmp_path / "m", vocab_size=1000)
    key = kp.prewarm_key(_spec(m))
    assert kp.prewarm_key(_spec(m)) == key
    assert kp.prewarm_key(_spec(m, max_num_seqs=32)) != key
    assert kp.prewarm_key({**_spec(m), "sampling": {**SAMPLING, "top_p": 1.0}}) != key
    _model(m, vocab_size=1001)
    assert kp.prewarm_key(_spec(m)) != key


def _run_child(tmp_path: Path, spec: dict) -> dict:
    prewarm = kp.start(spec, {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(PROJECT)})
    prewarm.proc.wait(timeout=60)
    return prewarm.finish()


def test_a_node_whose_cache_holds_the_kernels_runs_nothing_and_one_prewarm_runs_at_a_time(tmp_path):
    spec = _spec(_model(tmp_path / "m"))
    cache = tmp_path / "cache"
    cache.mkdir()
    with open(cache / "rlrun-prewarm.lock", "a") as lock:  # another engine's child holds the node's lock
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        busy = _run_child(tmp_path, spec)
    assert busy["status"] == "busy" and busy["ended"] is None, busy
    (cache / f"rlrun-prewarm-{kp.prewarm_key(spec)}.done").write_text("{}")
    warm = _run_child(tmp_path, spec)
    assert warm["status"] == "warm" and warm["ended"] >= time.time() - 60, warm
    # a child that failed (vLLM's own error, say) is told with its last lines; the engine goes on
    failed = kp._read_outcome(1, "loading\nTraceback (most recent call last):\nValueError: no config.json", 0.0)
    assert failed["status"] == "failed" and failed["ended"] is None
    assert failed["detail"] == "exit code 1: loading | Traceback (most recent call last): | ValueError: no config.json"


def _stays(proc: subprocess.Popen, seconds: float = 1.0) -> bool:
    time.sleep(seconds)
    return proc.poll() is None


def test_a_child_that_compiled_keeps_its_memory_until_its_owner_stops_it(tmp_path):
    """The child's side of its report (what kernel_prewarm.main prints, then holds: a release while an engine
    beside it measures the free memory would be counted into that engine's KV cache): finish() reads ``done``,
    not ``stopped``, and ends the child's whole process group."""
    import tempfile

    ended = time.time()
    line = json.dumps({"prewarm": {"status": "done", "ended": ended, "detail": ""}})
    log = tempfile.TemporaryFile()  # noqa: SIM115 (finish closes it)
    proc = subprocess.Popen(["bash", "-c", f"echo '{line}'; sleep 300 & echo $! >&2; wait"], stdout=log,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    grandchild = int(proc.stderr.readline())
    prewarm = kp.Prewarm(proc, log, ended - 5.0)
    assert prewarm.wait(10) == {"status": "done", "ended": ended, "detail": ""}
    assert _stays(proc), "the child ended after its report instead of holding"
    outcome = prewarm.finish()
    assert outcome == {"status": "done", "seconds": pytest.approx(5.0), "ended": ended, "detail": ""}
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.returncode is not None and not alive(grandchild)
    proc.stderr.close()


def test_a_child_whose_work_failed_says_why_and_holds_too(tmp_path):
    """The real child, failing before vLLM (its cache directory cannot be made: a file is in the way): it prints
    the traceback and its report, and waits to be stopped like one that compiled (a failure in vLLM's start
    may leave memory taken)."""
    (tmp_path / "file").write_text("")
    spec = _spec(_model(tmp_path / "m"))
    prewarm = kp.start(spec, {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "file" / "cache"),
                              "PYTHONPATH": str(PROJECT)})
    report = prewarm.wait(60)
    assert report is not None and report["status"] == "failed", report
    assert report["detail"].startswith(("NotADirectoryError: ", "FileExistsError: ")), report
    assert _stays(prewarm.proc)
    outcome = prewarm.finish()
    assert outcome["status"] == "failed" and outcome["detail"] == report["detail"], outcome
    assert prewarm.proc.returncode == -9  # stopped by its owner, as a child that holds is


def test_a_prewarm_that_cannot_start_is_a_warning_not_the_jobs_end(tmp_path, caplog):
    """Its child's interpreter missing (an OSError from the start itself): None and one warning naming why; a
    bad spec is still raised (the caller's bug)."""
    import logging

    spec = _spec(_model(tmp_path / "m"))
    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.WARNING, logger="trainer.rollout.kernel_prewarm"):
        mp.setattr(sys, "executable", str(tmp_path / "no-python"))
        assert kp.start(spec) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"kernel prewarm not started: [Errno 2] No such file or directory: '{tmp_path / 'no-python'}'"]


def test_a_bad_spec_ends_the_child_with_its_reason(tmp_path):
    out = subprocess.run([sys.executable, "-m", "trainer.rollout.kernel_prewarm", "--parent", str(os.getpid()),
                          "--spec", '{"model": "m"}'], cwd=PROJECT, capture_output=True, text=True, timeout=60)
    assert out.returncode == kp.BAD_SPEC
    assert out.stderr.startswith("prewarm: bad --spec: prewarm spec: missing ['dtype', "), out.stderr


def test_a_child_still_compiling_when_its_engine_is_ready_is_stopped_with_its_processes(tmp_path):
    import tempfile

    proc = subprocess.Popen(["bash", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    grandchild = int(proc.stdout.readline())
    prewarm = kp.Prewarm(proc, tempfile.TemporaryFile(), time.time())  # noqa: SIM115 (finish closes it)
    outcome = prewarm.finish()
    assert outcome["status"] == "stopped" and outcome["ended"] is None, outcome
    assert proc.returncode is not None
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild), f"pid {grandchild} of the stopped child's group still runs"
    assert prewarm.finish() is outcome  # once
    proc.stdout.close()


def test_a_child_ends_when_its_parent_does(tmp_path):
    """The watch the prewarm child starts first (trainer.procs.exit_when_gone on --parent)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "c = subprocess.Popen([sys.executable, '-c', 'import os, time\\n"
         "from trainer.procs import exit_when_gone\\n"
         "exit_when_gone(os.getppid(), 0.5); time.sleep(300)'])\n"
         "print(c.pid, flush=True); time.sleep(300)"], cwd=PROJECT, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(1.0)  # the child's watch is running
    assert alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), f"the child {child} outlived its parent"
    parent.stdout.close()


def test_the_engine_reports_a_prewarm_it_gave_up_on_in_its_start_up_marks(caplog):
    """What the engine does with its copy once it is ready (VllmEngine._end_prewarm, the engine's start left out):
    a copy still running is stopped, named in the step-1 start-up report (``prewarm_stopped``) and warned of."""
    import logging
    import tempfile

    from trainer.rollout.vllm_engine import VllmEngine
    from trainer.startup import Marks

    engine = object.__new__(VllmEngine)  # no vLLM here: only the end of __init__
    engine.startup_marks = Marks()
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    engine._prewarm = kp.Prewarm(proc, tempfile.TemporaryFile(), time.time())  # noqa: SIM115 (finish closes it)
    assert engine.prewarm_outcome is None  # not ended yet
    with caplog.at_level(logging.INFO, logger="trainer.rollout.kernel_prewarm"):
        engine._end_prewarm()
        engine._end_prewarm()  # once
    assert engine.prewarm_outcome["status"] == "stopped" and proc.returncode is not None
    marks = engine.startup_marks.get()
    assert "prewarm_stopped" in marks and "prewarmed" not in marks, marks
    assert marks["prewarm"] == engine._prewarm.started
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "kernel prewarm stopped" in warned[0].getMessage(), caplog.text
    assert "it came too late to help" in warned[0].getMessage()
