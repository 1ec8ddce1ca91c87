import json
import time

from trainer.metrics import MetricsLogger, Timer, parse_log_line


def test_log_writes_jsonl_and_a_tool_line(tmp_path):
    lines: list[str] = []
    logger = MetricsLogger(str(tmp_path / "m.jsonl"), print_fn=lambda s, flush=True: lines.append(s))
    logger.plan(total_steps=7)
    logger.log(3, {"reward/mean": 0.25, "timing/generate": 1.5})
    logger.close()
    row = json.loads((tmp_path / "m.jsonl").read_text())
    assert row["step"] == 3 and row["reward/mean"] == 0.25
    parsed = [parse_log_line(s) for s in lines]
    assert parsed[0] == ("plan", {"total_steps": 7})
    assert lines[1].startswith("step 3: reward/mean=0.25") and "generate=1.50s" in lines[1]
    kind, payload = parsed[2]
    assert kind == "metrics" and payload["step"] == 3 and payload["timing/generate"] == 1.5


def test_each_console_line_is_one_write_so_no_other_thread_lands_inside_it(monkeypatch):
    """The default console: every line with its newline in a single write (a Ray driver's log-forwarding thread
    writes to the same stdout between two writes, and a line it splits from its newline no longer parses)."""
    import io
    import sys

    class Writes(io.StringIO):
        def __init__(self):
            super().__init__()
            self.calls: list[str] = []

        def write(self, text):
            self.calls.append(text)
            return super().write(text)

    out = Writes()
    monkeypatch.setattr(sys, "stdout", out)
    logger = MetricsLogger(None)
    logger.plan(total_steps=2)
    logger.log(1, {"reward/mean": 0.5, "timing/generate": 0.25})
    assert len(out.calls) == 3 and all(c.endswith("\n") and c.count("\n") == 1 for c in out.calls), out.calls
    assert [parse_log_line(c[:-1])[0] for c in (out.calls[0], out.calls[2])] == ["plan", "metrics"]


def test_parse_log_line_ignores_other_lines():
    assert parse_log_line("step 3: reward/mean=0.25") is None
    assert parse_log_line("@metrics not json") is None
    assert parse_log_line("@metrics [1, 2]") is None
    assert parse_log_line('  @metrics {"step": 1}') is None


def test_timer_accumulates():
    timer = Timer()
    for _ in range(2):
        with timer("x"):
            pass
    assert set(timer.times) == {"timing/x"} and timer.times["timing/x"] >= 0


def test_wandb_run_gets_every_step_offline(tmp_path, monkeypatch):
    """--use_wandb: a real wandb run in offline mode (no network); its summary holds the last step."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    from trainer.metrics import WandbLogger

    run = WandbLogger("env", "rlrun-test", "unit", {"advantage_estimator": "rloo"})
    logger = MetricsLogger(None, print_fn=lambda s, flush=True: None, wandb=run)
    logger.log(1, {"reward/mean": 0.25})
    logger.log(2, {"reward/mean": 0.75, "timing/train": 0.5})
    logger.close()
    history, config = _read_offline_run(tmp_path)
    assert [(h.get("_step"), h.get("reward/mean")) for h in history] == [(1, 0.25), (2, 0.75)], history
    assert history[1]["timing/train"] == 0.5
    assert config.get("advantage_estimator") == "rloo"


def _read_offline_run(wandb_dir, timeout: float = 60.0):
    """The history rows and config of the one offline run under wandb_dir, read from its record file once it
    holds the run's exit record: wandb 0.29's finish() can return before its service process has written
    the file (seen as a 7-byte file under load)."""
    deadline = time.monotonic() + timeout
    while True:
        files = list(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
        assert len(files) <= 1, files
        try:
            records = _records(files[0]) if files else []
        except Exception:  # noqa: BLE001 (a record half-written: read again)
            records = []
        if any(kind == "exit" for kind, _ in records):
            break
        assert time.monotonic() < deadline, f"no complete offline run under {wandb_dir} after {timeout:.0f} s: {files}"
        time.sleep(0.2)
    history, config = [], {}
    for kind, record in records:
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
        elif kind in ("run", "config"):  # the config comes with the run record, later changes as config
            updates = record.run.config.update if kind == "run" else record.config.update
            for item in updates:
                value = json.loads(item.value_json)
                config[item.key or "/".join(item.nested_key)] = value.get("value") if isinstance(value, dict) else value
    return history, config


def _records(path):
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal import datastore

    store = datastore.DataStore()
    store.open_for_scan(str(path))
    records = []
    while (data := store.scan_data()) is not None:
        record = pb.Record()
        record.ParseFromString(data)
        records.append((record.WhichOneof("record_type"), record))
    return records


def _rows(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def _quiet(s, flush=True):
    pass


def test_a_resumed_run_replaces_the_rows_of_the_steps_it_runs_again(tmp_path):
    # The first run logged steps 1-5, its newest checkpoint is step 3, then it was killed.
    path = tmp_path / "metrics.jsonl"
    first = MetricsLogger(str(path), print_fn=_quiet)
    for step in range(1, 6):
        first.log(step, {"reward/mean": step / 10})
    first.close()
    path.write_text(path.read_text() + "not a row of ours\n")
    resumed = MetricsLogger(str(path), print_fn=_quiet)
    note = resumed.begin(3)
    assert note == f"metrics: 2 rows of steps after 3 (run again now) moved from {path} to metrics.jsonl.replaced"
    for step in (4, 5, 6):
        resumed.log(step, {"reward/mean": 1.0})
    resumed.close()
    assert _rows(path.with_name("metrics.jsonl.replaced")) == [4, 5]
    lines = path.read_text().splitlines()
    assert "not a row of ours" in lines
    assert [json.loads(line)["step"] for line in lines if line.startswith("{")] == [1, 2, 3, 4, 5, 6]
    assert all(json.loads(line)["reward/mean"] == 1.0 for line in lines if line.startswith("{") and
               json.loads(line)["step"] > 3)


def test_a_fresh_run_sets_an_earlier_runs_file_aside(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for run in range(3):
        logger = MetricsLogger(str(path), print_fn=_quiet)
        note = logger.begin(None)
        assert note == (None if run == 0 else f"metrics: {path} held an earlier run's rows; it is now metrics.jsonl.{run}")
        logger.log(1, {"run": run})
        logger.close()
    assert json.loads(path.read_text())["run"] == 2
    assert json.loads(path.with_name("metrics.jsonl.1").read_text())["run"] == 0
    assert json.loads(path.with_name("metrics.jsonl.2").read_text())["run"] == 1


def test_resuming_with_nothing_to_replace_changes_nothing(tmp_path):
    path = tmp_path / "metrics.jsonl"
    first = MetricsLogger(str(path), print_fn=_quiet)
    first.log(1, {"x": 1})
    first.close()
    before = path.read_text()
    again = MetricsLogger(str(path), print_fn=_quiet)
    assert again.begin(1) is None
    again.close()
    assert path.read_text() == before and not path.with_name("metrics.jsonl.replaced").exists()
